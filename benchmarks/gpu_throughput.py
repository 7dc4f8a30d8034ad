"""Throughput of the demo's RL stage on one device at several batch sizes (issue 30's part 3): steps/s, and
tokens/s of generation and of the update, from each run's metrics.jsonl (the first step, warm-up and any
compilation, is left out), with the device's peak memory (CUDA: torch.cuda.max_memory_allocated; CPU: the
process's peak RSS, which only grows).

    python benchmarks/gpu_throughput.py --base BASE_DIR --device cuda --batch-sizes 128,512,2048 --out T.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from demo_setup import demo_base, emit, machine, quick_rl
from keelrl.config import config_from_dict
from keelrl.loop.trainer import train
from keelrl.recipes.demo import DEMO_TASK_PARAMS, demo_rl_config


def measure(
    base: str, device: str, autocast: str, batch: int, steps: int, work: Path, quick: bool = False
) -> dict[str, Any]:
    data = demo_rl_config(base, DEMO_TASK_PARAMS, steps, eval_every=0, seed=0)
    if quick:
        quick_rl(data)
    data["rollout"]["batch_size"] = batch
    data["train"].update(device=device, autocast=autocast, micro_batch_size=min(batch, 256))
    data["eval"] = {"every_steps": 0, "at_start": False, "problems": 8}
    data["checkpoint"] = {"every_steps": 0}
    data["log"]["progress"] = False
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train(config_from_dict(data, "gpu_throughput"), work / f"b{batch}", resume="never")
    rows = [json.loads(x) for x in (work / f"b{batch}" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r and r["step"] > 1]
    step_s = statistics.median(r["time/step_s"] for r in rows)
    gen_s = statistics.median(r["time/gen_s"] for r in rows)
    train_s = statistics.median(r["time/train_s"] for r in rows)
    return {
        "batch_size": batch,
        "steps_measured": len(rows),
        "steps_per_s": 1.0 / step_s,
        "generation_tokens_per_s": statistics.median(r["tokens/generated"] for r in rows) / gen_s,
        "update_tokens_per_s": statistics.median(r["tokens/trained"] for r in rows) / train_s,
        "median_step_s": step_s,
        "median_generation_s": gen_s,
        "median_update_s": train_s,
        "peak_memory_gb": (
            torch.cuda.max_memory_allocated() / 1e9
            if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--base", default=None, help="the demo's base model (an HF dir; required but with --quick)"
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--autocast", default=None, help="off or bf16 (default: bf16 on cuda, off on cpu)")
    ap.add_argument("--batch-sizes", default="128,512,2048")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the CPU path at tiny sizes (batches 8 and 16 of 8 tokens, 3 steps; a random 1-layer base unless "
        "--base): seconds",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.device, args.batch_sizes, args.steps = "cpu", "8,16", 3
    elif args.base is None:
        ap.error("--base is required (the demo's base model, e.g. runs/demo/base)")
    autocast = args.autocast or ("bf16" if args.device == "cuda" else "off")
    with tempfile.TemporaryDirectory() as tmp:
        base = demo_base(Path(tmp), args.base, quick=args.quick)
        rows = [
            measure(base, args.device, autocast, int(b), args.steps, Path(tmp), args.quick)
            for b in args.batch_sizes.split(",")
        ]
    emit(
        {
            "benchmark": "gpu_throughput",
            "quick": args.quick,
            "device": args.device,
            "autocast": autocast,
            "steps": args.steps,
            "results": rows,
            "machine": machine(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
