"""What the guards cost per training step on the demo config. Prints JSON (and writes it with --out).

    python benchmarks/guard_overhead.py [--steps 40] [--rounds 2] [--out docs/guard_overhead.json]

Two measurements:
- `replay`: a real run of the demo config with guards on; its metric history is then replayed through
  exactly the calls the trainer makes (`Guardian.after_step` on the history so far after each step, and
  `check_update` before each optimizer step), each timed. Guard time / median step time is the overhead.
  The same replay on the history repeated to 1,000 and 10,000 steps shows how the cost grows with a long run.
- `ab`: the same training with `guards.enabled` true and false, alternating; the difference of median
  step times (noisier: it is a difference of two numbers with the machine's jitter in both).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_setup import demo_base, demo_config, emit, machine, step_seconds
from keelrl.guards.engine import Guardian
from keelrl.guards.rules import GuardsConfig
from keelrl.guards.step import check_update
from keelrl.loop.trainer import train


def replay(
    history: list[dict[str, Any]], updates_per_step: int, cfg: GuardsConfig, timed: int = 20
) -> dict[str, float]:
    """Seconds per step spent in the guards over the last `timed` steps of `history` (each step sees the
    history up to itself, as in training)."""
    guardian = Guardian(cfg, {})
    after, before = [], []
    for k in range(max(0, len(history) - timed), len(history)):
        so_far = history[: k + 1]
        row = history[k]
        t0 = time.perf_counter()
        for _ in range(updates_per_step):
            check_update(
                history[:k],
                int(row["step"]),
                float(row.get("loss/total", 0.0)),
                float(row.get("grad_norm", 0.0)),
                float(row.get("ratio/max", 1.0)),
                float(row.get("advantage/abs_mean", 0.0)),
                cfg,
            )
        t1 = time.perf_counter()
        guardian.after_step(so_far)
        t2 = time.perf_counter()
        before.append(t1 - t0)
        after.append(t2 - t1)
    return {
        "check_update_s": statistics.fmean(before),
        "after_step_s": statistics.fmean(after),
        "total_s": statistics.fmean(before) + statistics.fmean(after),
    }


def stretched(history: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    rows = [r for r in history if int(r["step"]) > 0]
    return [{**rows[i % len(rows)], "step": i + 1} for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds (guards on/off alternating)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base-model", default=None, help="base model (default: the demo architecture, random)")
    ap.add_argument("--quick", action="store_true", help="3 steps, one round, tiny sizes: seconds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 3, 1
    torch.set_num_threads(args.threads)
    t_start = time.time()
    ab: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="keelrl-guard-bench-") as tmp:
        work = Path(tmp)
        base = demo_base(work, args.base_model, args.quick)
        history: list[dict[str, Any]] = []
        cfg = None
        for r in range(args.rounds):
            for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):
                cfg = demo_config(base, args.steps, {"guards": {"enabled": arm == "on"}}, args.quick)
                run_dir = work / f"{arm}_{r}"
                train(cfg, run_dir, resume="never")
                ab[arm].append(statistics.median(step_seconds(run_dir)))
                if arm == "on" and not history:
                    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert cfg is not None
    updates = cfg.algo.ppo_epochs * cfg.algo.minibatches
    step_s = statistics.median(ab["on"])
    guards_cfg = GuardsConfig()
    replays = {
        str(len(history)): replay(history, updates, guards_cfg),
        "1000": replay(stretched(history, 1000), updates, guards_cfg),
        "10000": replay(stretched(history, 10000), updates, guards_cfg),
    }
    result: dict[str, Any] = {
        "benchmark": "guard_overhead",
        "command": "python benchmarks/guard_overhead.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "quick": args.quick,
        "wall_s": time.time() - t_start,
        "steps": args.steps,
        "updates_per_step": updates,
        "step_s_median": step_s,
        "replay": {n: {**v, "overhead": v["total_s"] / step_s} for n, v in replays.items()},
        "ab": {
            "step_s_median_on": ab["on"],
            "step_s_median_off": ab["off"],
            "overhead": statistics.median(ab["on"]) / statistics.median(ab["off"]) - 1.0,
        },
        "target": "guard time < 2% of step time",
    }
    result["target_met"] = all(v["overhead"] < 0.02 for v in result["replay"].values())
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
