"""Forward/backward paths of the update and of the sampler, timed and checked on real rollouts. Prints JSON.

    python benchmarks/update_paths.py [--shapes tiny,smollm2] [--threads 1] [--out docs/update_paths.json]

For one micro-batch of each shape of benchmarks/vs_trl.py (sampled from the initial model, so completions
have realistic lengths), compares:
- `padded`: the plain right-padded forward + backward (keelrl's path with train.share_prefix = false);
- `shared_prefix`: keelrl's default, each distinct prompt run once;
- `packed`: every row concatenated into one sequence with position ids restarting per row and no padding;
  transformers turns that into a block-diagonal mask, which SDPA on CPU applies densely (quadratic in
  the packed length), so it is measured to show whether packing pays on this machine;
- `shared_prefix_bf16`: the default under train.autocast = "bf16";
- with `--fast`, also keelrl's fastest CPU settings (bf16 autocast, model.attn_implementation = "eager",
  train.compile) on a second copy of the model: its times (after compiling) and its log-prob gaps.
Times are CPU seconds (process time, best of `--repeats`), so other work on the machine disturbs them
less than wall time. Log-prob gaps are max/mean |difference| over the completion tokens against the fp32
padded forward; `sampler_vs_trainer_*` compares the sampler's log-probs with the trainer's on the same tokens
(fp32: what algo.old_logprobs = "sampler" relies on; bf16: both sides under autocast).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_trl import SHAPES, prepare_model, prompt_rows


def cpu_best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return round(best, 4)


def gaps(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    d = ((a - b) * mask).abs()
    return {"max_abs": float(d.max()), "mean_abs": float(d.sum() / mask.sum())}


def as_rollouts(prompts: list[list[int]], gens: list[Any], settings: Any, group_size: int) -> list[Any]:
    """Sampled generations as the Rollouts `collate` turns into a training batch."""
    from keelrl.rollout import Rollout

    return [
        Rollout(
            problem_index=i,
            problem={},
            group=i // group_size,
            prompt_ids=p,
            completion_ids=g.completion_ids,
            sample_logprobs=g.logprobs,
            trainable=[1] * len(g.completion_ids),
            finish_reason=g.finish_reason,
            policy_version=0,
            sampling=settings,
        )
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]


def measure(shape_name: str, cache_dir: Path, repeats: int, fast: bool) -> dict[str, Any]:
    from keelrl.algo.logprobs import completion_logprobs
    from keelrl.models.load import load_local_dir
    from keelrl.rollout import SamplingSettings
    from keelrl.rollout.hf import HFSampler
    from keelrl.step.batch import collate

    shape = SHAPES[shape_name]
    model_dir = prepare_model(shape, cache_dir)
    model, tok = load_local_dir(model_dir, "float32", False)
    rows = prompt_rows(shape, model_dir, 1)
    n_prompts = max(1, shape.micro_batch_size // shape.group_size)
    prompts = [r["ids"] for r in rows[:n_prompts] for _ in range(shape.group_size)]
    seeds = list(range(len(prompts)))
    settings = SamplingSettings(shape.max_new_tokens, 1.0)

    def sample(**kw: Any) -> list[Any]:
        return HFSampler(model, tok, **kw).generate(prompts, settings, seeds)

    gens = sample()
    rollouts = as_rollouts(prompts, gens, settings, shape.group_size)
    b = collate(rollouts, tok.pad_token_id, torch.device("cpu"))
    mask = b.target_mask

    def logprobs(share: bool, bf16: bool = False) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            lp, _ = completion_logprobs(model, b.input_ids, b.attention_mask, mask, 1.0, share_prefix=share)
        return lp

    # packed: one row, no padding, position ids restart per sequence -> transformers' block-diagonal mask
    lengths = b.lengths.tolist()
    packed_ids = torch.cat([b.input_ids[i, :n] for i, n in enumerate(lengths)])[None]  # [1, N]
    packed_pos = torch.cat([torch.arange(n) for n in lengths])[None]  # [1, N]
    scored = mask.bool().clone()
    scored[:, -1] = False
    packed_sel = torch.cat([scored[i, :n] for i, n in enumerate(lengths)])[None]  # [1, N]
    targets = b.input_ids[:, 1:][scored[:, :-1]]  # [n]

    def packed_logprobs() -> torch.Tensor:
        h = model.get_decoder()(
            input_ids=packed_ids, position_ids=packed_pos, use_cache=False
        ).last_hidden_state
        logits = model.get_output_embeddings()(h[packed_sel]).float()  # [n, V]
        out = torch.zeros_like(mask)
        out[scored] = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        return out

    def fwd_bwd(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            (fn() * mask).sum().backward()

        return run

    with torch.no_grad():
        ref = logprobs(False)
        paths = {
            "shared_prefix": logprobs(True),
            "packed": packed_logprobs(),
            "shared_prefix_bf16": logprobs(True, bf16=True),
            "padded_bf16": logprobs(False, bf16=True),
        }
        bf16_gens = sample(autocast="bf16")
    bf16_rollouts = as_rollouts(prompts, bf16_gens, settings, shape.group_size)
    bb = collate(bf16_rollouts, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_trainer, _ = completion_logprobs(model, bb.input_ids, bb.attention_mask, bb.target_mask, 1.0)
    padded_tokens = int(b.input_ids.numel())
    out: dict[str, Any] = {
        "shape": shape_name,
        "rows": len(prompts),
        "distinct_prompts": n_prompts,
        "real_tokens": int(b.lengths.sum()),
        "padded_tokens": padded_tokens,
        "completion_tokens": int(mask.sum()),
        "fwd_bwd_cpu_s": {
            "padded": cpu_best(fwd_bwd(lambda: logprobs(False)), repeats),
            "packed": cpu_best(fwd_bwd(packed_logprobs), repeats),
            "shared_prefix": cpu_best(fwd_bwd(lambda: logprobs(True)), repeats),
            "shared_prefix_bf16": cpu_best(fwd_bwd(lambda: logprobs(True, bf16=True)), repeats),
        },
        "sampler_cpu_s": {
            "shared_prefix": cpu_best(sample, repeats),
            "no_sharing": cpu_best(lambda: sample(share_prefix=False), repeats),
            "shared_prefix_bf16": cpu_best(lambda: sample(autocast="bf16"), repeats),
        },
        "logprob_gap_vs_fp32_padded": {k: gaps(v, ref, mask) for k, v in paths.items()},
        "sampler_vs_trainer_fp32": gaps(ref, b.sampler_logprobs, mask),
        "sampler_vs_trainer_bf16": gaps(bf16_trainer, bb.sampler_logprobs, bb.target_mask),
    }
    if fast:
        out["fast"] = measure_fast(model_dir, prompts, seeds, settings, shape.group_size, b, ref, repeats)
    return out


def measure_fast(
    model_dir: Path,
    prompts: list[list[int]],
    seeds: list[int],
    settings: Any,
    group_size: int,
    b: Any,
    ref: torch.Tensor,
    repeats: int,
) -> dict[str, Any]:
    """keelrl's fastest CPU settings on a fresh copy of the model: bf16 autocast, eager attention, compiled
    decoder. `ref` is the fp32 padded forward's log-probs of batch `b`."""
    from keelrl.algo.logprobs import completion_logprobs
    from keelrl.models.load import compile_decoder, load_local_dir
    from keelrl.rollout.hf import HFSampler
    from keelrl.step.batch import collate

    model, tok = load_local_dir(model_dir, "float32", False, attn_implementation="eager")
    compile_decoder(model)
    mask = b.target_mask

    def sample() -> list[Any]:
        return HFSampler(model, tok, autocast="bf16").generate(prompts, settings, seeds)

    def logprobs(batch: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.target_mask, 1.0)
        return lp

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        (logprobs(b) * mask).sum().backward()

    t0 = time.perf_counter()
    fwd_bwd()
    gens = sample()
    compile_s = time.perf_counter() - t0
    fb = collate(as_rollouts(prompts, gens, settings, group_size), tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        fast_lp, fast_trainer = logprobs(b), logprobs(fb)
    return {
        "settings": "train.autocast='bf16', model.attn_implementation='eager', train.compile=true",
        "first_calls_wall_s": compile_s,  # one fwd+bwd and one sampling batch, compiling included
        "fwd_bwd_cpu_s": cpu_best(fwd_bwd, repeats),
        "sampler_cpu_s": cpu_best(sample, repeats),
        "logprob_gap_vs_fp32_padded": gaps(fast_lp, ref, mask),
        "sampler_vs_trainer": gaps(fast_trainer, fb.sampler_logprobs, fb.target_mask),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="tiny,smollm2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--cache-dir", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "keelrl_vs_trl_models")
    )
    p.add_argument(
        "--fast", action="store_true", help="also measure keelrl's fastest CPU settings (compiles)"
    )
    p.add_argument("--quick", action="store_true", help="vs_trl.py's micro shape, one repeat: seconds")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if a.quick:
        a.shapes, a.repeats = "micro", 1
    torch.set_num_threads(a.threads)
    cache = Path(a.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "update_paths",
        "command": "python benchmarks/update_paths.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "threads": a.threads,
        "torch": torch.__version__,
        "loadavg": os.getloadavg(),
        "shapes": {name: measure(name, cache, a.repeats, a.fast) for name in a.shapes.split(",")},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
