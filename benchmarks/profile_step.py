"""Profile keelrl's train step on a benchmarks/vs_trl.py shape: CPU time per phase and the top functions.

    python benchmarks/profile_step.py --shape tiny [--steps 3] [--threads 1] [--set train.share_prefix=false]

Runs the keelrl side of vs_trl.py (same model, prompts, reward and config) for one warm-up step, then
`--steps` steps under cProfile with a CPU-time clock (process time), so other work on the machine
disturbs the attribution less than a wall clock would. Prints per-phase CPU seconds per step (sampling,
update, the rest) and the functions with the most own CPU time. `--torch-profiler` instead runs one more
warm-up step and then one step under torch.profiler, listing operators and, with train.compile, inductor's
compiled kernels by name; add `--by-shape` to list operators per input shape (which matmul shapes cost what).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_trl import SHAPES, Shape, apply_overrides_to, keelrl_setup, make_spec, prepare_model, prompt_rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the micro shape, one step: seconds (a test's check)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--set", action="append", default=[], help="keelrl config override, KEY=VALUE")
    p.add_argument(
        "--torch-profiler",
        action="store_true",
        help="instead of cProfile: torch.profiler over one step, operators and compiled kernels by own CPU time",
    )
    p.add_argument(
        "--by-shape", action="store_true", help="with --torch-profiler: group operators by input shape"
    )
    p.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "keelrl_vs_trl_models"))
    a = p.parse_args(argv)
    from keelrl.stages.rl import step as rl_step

    if a.torch_profiler:  # name inductor's C++ kernels in the profile; read at compile time, so set first
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True

    if a.quick:
        a.shape, a.steps, a.top = "micro", 1, 5
    base = SHAPES[a.shape]
    shape = Shape(**{**base.__dict__, "steps": a.steps + 1, "warmup": 0})
    cache = Path(a.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(shape, cache)
    rows = prompt_rows(shape, model_dir, shape.steps)
    with tempfile.TemporaryDirectory() as tmp:
        spec = make_spec(
            "keelrl", "fp32", shape, model_dir, Path(tmp), 0, a.threads, rows, apply_overrides_to(a.set)
        )
        torch.set_num_threads(a.threads)
        run, state = keelrl_setup(spec)
        rl_step.train_step(run, state)  # warm-up
        if a.torch_profiler:
            rl_step.train_step(run, state)  # a second warm-up: compilation may need two steps' shapes
            print_torch_profile(lambda: rl_step.train_step(run, state), a.top, a.by_shape)
            return
        phases = {"next_batch": 0.0, "rl_update": 0.0}  # sampling (or the pipeline's batch), the update
        originals = {name: getattr(rl_step, name) for name in phases}

        def timed(name: str) -> Callable[..., Any]:
            fn = originals[name]

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t0 = time.process_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    phases[name] += time.process_time() - t0

            return wrapper

        for name in phases:
            setattr(rl_step, name, timed(name))
        prof = cProfile.Profile(time.process_time)
        t0 = time.process_time()
        prof.enable()
        for _ in range(a.steps):
            rl_step.train_step(run, state)
        prof.disable()
        total = time.process_time() - t0
        for name, fn in originals.items():
            setattr(rl_step, name, fn)
    per = {k: round(v / a.steps, 3) for k, v in phases.items()}
    per["other"] = round(total / a.steps - sum(per.values()), 3)
    print(f"shape {a.shape}, threads {a.threads}, overrides {a.set or 'none'}")
    print(f"CPU s per step: total {total / a.steps:.3f}; " + ", ".join(f"{k} {v}" for k, v in per.items()))
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
    text = out.getvalue()
    print(text[text.index("   ncalls") :].rstrip())


def print_torch_profile(step: Callable[[], Any], top: int, by_shape: bool = False) -> None:
    """One call of `step` under torch.profiler; `by_shape` groups operators by their input shapes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=by_shape) as prof:
        step()
    table = prof.key_averages(group_by_input_shape=by_shape).table(
        sort_by="self_cpu_time_total", row_limit=top, max_shapes_column_width=60
    )
    print(table)


if __name__ == "__main__":
    main()
