"""Asynchronous training: steps per second at rollout.max_staleness = 1 against the synchronous loop (k = 0), side
by side in one process tree, alternating, `--repeats` times each. The configuration is chosen so that generation
and the update take comparable time (both are printed), on a tiny random model of `--hidden` x `--layers`.
Threads: the trainer runs `--trainer-threads` torch threads; at k = 1 the sampling process runs
rollout.sampler_threads = `--sampler-threads`. The synchronous loop is measured with the trainer's threads and
also with all of them (`--trainer-threads` + `--sampler-threads`), so the speed-up is not bought with cores the
synchronous loop was denied; and with `algo.old_logprobs = "recompute"`, the forward pass k >= 1 adds. Rate: steps after the first `--warmup` (which include the sampling process's start
and the pipeline's first fill) over their wall time, from metrics.jsonl's timestamps. Prints JSON.

    python benchmarks/async.py --out docs/async.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(settings: list[str], threads: int, run_dir: Path) -> list[dict]:
    """One `keelrl train` (no supervisor) in a fresh process; its metrics.jsonl records."""
    argv = [
        sys.executable,
        "-m",
        "keelrl",
        "train",
        "configs/smoke.toml",
        "--run-dir",
        str(run_dir),
        "--no-supervisor",
    ]
    for s in [*settings, f"train.threads={threads}"]:
        argv += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rate(records: list[dict], warmup: int) -> dict[str, float]:
    """Steps per second after the first `warmup` steps, and the mean phase times there."""
    steps = [r for r in records if "time/step_s" in r]
    timed = steps[warmup:]
    wall = timed[-1]["time"] - steps[warmup - 1]["time"]
    return {
        "steps_per_s": len(timed) / wall,
        "gen_s": statistics.mean(r["time/gen_s"] for r in timed),
        "train_s": statistics.mean(r["time/train_s"] for r in timed),
        "trainer_wait_s": statistics.mean(r.get("time/trainer_wait_s", 0.0) for r in timed),
        "sampler_wait_s": statistics.mean(r.get("time/sampler_wait_s", 0.0) for r in timed),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--trainer-threads", type=int, default=1)
    ap.add_argument("--sampler-threads", type=int, default=1)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="3 steps (1 warm-up), one repeat, a 1-layer width-32 model: seconds",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup, args.repeats, args.hidden, args.layers, args.max_new_tokens = (
            3,
            1,
            1,
            32,
            1,
            8,
        )
    common = [
        f"train.steps={args.steps}",
        f"model.tiny.hidden_size={args.hidden}",
        f"model.tiny.num_layers={args.layers}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "eval.at_start=false",
        "eval.every_steps=0",
        "checkpoint.every_steps=0",
        "log.rollouts_per_step=0",
        "guards.enabled=false",
    ]
    all_threads = args.trainer_threads + args.sampler_threads
    variants = {
        "k0": ([*common, "rollout.max_staleness=0"], args.trainer_threads),
        f"k0_{all_threads}threads": ([*common, "rollout.max_staleness=0"], all_threads),
        # what k = 1's update adds besides the overlap: the proximal policy's log-probs (a forward pass)
        "k0_recompute": (
            [*common, "rollout.max_staleness=0", 'algo.old_logprobs="recompute"'],
            args.trainer_threads,
        ),
        "k1": (
            [*common, "rollout.max_staleness=1", f"rollout.sampler_threads={args.sampler_threads}"],
            args.trainer_threads,
        ),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="async_bench_") as tmp:
        for rep in range(args.repeats):
            for name, (settings, threads) in variants.items():
                records = one_run(settings, threads, Path(tmp) / f"{name}-{rep}")
                results[name].append(rate(records, args.warmup))
    summary = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    k0, k0_all, _, k1 = (summary[n]["steps_per_s"] for n in variants)
    report = {
        "benchmark": "async",
        "quick": args.quick,
        "command": "python benchmarks/async.py " + " ".join(sys.argv[1:]),
        "settings": common,
        "trainer_threads": args.trainer_threads,
        "sampler_threads": args.sampler_threads,
        "cpu_count": os.cpu_count(),
        "median": summary,
        "runs": results,
        "speedup_k1_vs_k0": k1 / k0,
        f"speedup_k1_vs_k0_{all_threads}threads": k1 / k0_all,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
