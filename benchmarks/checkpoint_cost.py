"""Checkpoint cost on the demo config: save time, training stall with and without async save, and the
overhead at the demo's interval. Prints JSON (and writes it with --out).

    python benchmarks/checkpoint_cost.py [--steps 40] [--every 10] [--rounds 2] [--out docs/checkpoint_cost.json]

Three arms run the same training (same seed, same data) and differ only in checkpointing:
`none` (no interval saves), `sync` (every `--every` steps, the step waits for the write), `async`
(checkpoint.async_save: the step waits only for the in-memory snapshot). All arms also write the guards'
step-0 checkpoint and the final one; those are not counted. Arms alternate (A-B-C-C-B-A ...) so a load
change on the machine hits each about equally.

Reported per arm: `save_s` (snapshot to committed directory: write + fsync + manifest + rename),
`stall_s` (time the training loop was blocked per save), median step time, and the bytes of one
checkpoint. `overhead_at_interval` = stall per save / (interval x median step time without saves), at
the demo's interval (`checkpoint.every_steps` of configs/countdown_tiny.toml, 20) and at `--every`;
`wall_overhead` compares the arms' whole training-loop wall time with `none` (noisier: it also contains
the machine's jitter).
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
from keelrl.loop.trainer import train

DEMO_INTERVAL = 20
ARMS: dict[str, dict[str, Any]] = {
    "none": {"every_steps": 0, "async_save": False},
    "sync": {"async_save": False},
    "async": {"async_save": True},
}


def run_arm(
    work: Path, base: str, arm: str, steps: int, every: int, index: int, quick: bool = False
) -> dict[str, Any]:
    ckpt = dict(ARMS[arm])
    ckpt.setdefault("every_steps", every)
    ckpt["keep_last"] = 2
    ckpt["keep_best"] = 0
    cfg = demo_config(base, steps, {"checkpoint": ckpt}, quick)
    run_dir = work / f"{arm}_{index}"
    t0 = time.perf_counter()
    summary = train(cfg, run_dir, resume="never")
    wall = time.perf_counter() - t0
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    interval_saves = [
        e for e in events if e["kind"] == "checkpoint" and e.get("reason") in ("interval", "best")
    ]
    interval_steps = {e["step"] for e in interval_saves}
    stalls = [s for s in summary["checkpoint_stalls"] if s["step"] in interval_steps]
    newest = max((p for p in (run_dir / "checkpoints").glob("step_*") if p.is_dir()), key=lambda p: p.name)
    steps_s = step_seconds(run_dir)
    # Steps right after a save carry the save's stall; the clean steps give the no-save step time.
    clean = [s for i, s in enumerate(steps_s, start=2) if (i - 1) not in interval_steps]
    return {
        "arm": arm,
        "wall_s": wall,
        "loop_s": summary["wall_seconds"],
        "saves": len(interval_saves),
        "save_s": [e["seconds"] for e in interval_saves],
        "stall_s": [s["stall_s"] for s in stalls],
        "step_s_median": statistics.median(clean) if clean else float("nan"),
        "checkpoint_bytes": sum(f.stat().st_size for f in newest.rglob("*") if f.is_file()),
        "weights_sha256": summary["weights_sha256"],
    }


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10, help="checkpoint interval of the sync/async arms")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base-model", default=None, help="base model (default: the demo architecture, random)")
    ap.add_argument("--quick", action="store_true", help="4 steps, one round, tiny sizes: seconds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.every, args.rounds = 4, 2, 1
    torch.set_num_threads(args.threads)
    order = []
    for r in range(args.rounds):
        arms = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        order += [(arm, r) for arm in arms]
    with tempfile.TemporaryDirectory(prefix="keelrl-ckpt-bench-") as tmp:
        work = Path(tmp)
        base = demo_base(work, args.base_model, args.quick)
        t0 = time.time()
        runs = [run_arm(work, base, arm, args.steps, args.every, r, args.quick) for arm, r in order]
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in ARMS}
    step_s = statistics.median([r["step_s_median"] for r in by_arm["none"]])
    none_loop = mean([r["loop_s"] for r in by_arm["none"]])
    result: dict[str, Any] = {
        "benchmark": "checkpoint_cost",
        "command": "python benchmarks/checkpoint_cost.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "quick": args.quick,
        "wall_s": time.time() - t0,
        "steps": args.steps,
        "every": args.every,
        "step_s_without_saves": step_s,
        "checkpoint_mb": by_arm["sync"][0]["checkpoint_bytes"] / 1e6,
        "arms": {},
        "runs": runs,
    }
    for arm in ("sync", "async"):
        saves = [x for r in by_arm[arm] for x in r["save_s"]]
        stalls = [x for r in by_arm[arm] for x in r["stall_s"]]
        stall = mean(stalls)
        result["arms"][arm] = {
            "saves": len(saves),
            "save_s_mean": mean(saves),
            "stall_s_mean": stall,
            "stall_s_max": max(stalls) if stalls else float("nan"),
            "overhead_at_interval": {
                str(DEMO_INTERVAL): stall / (DEMO_INTERVAL * step_s),
                str(args.every): stall / (args.every * step_s),
            },
            "wall_overhead": mean([r["loop_s"] for r in by_arm[arm]]) / none_loop - 1.0,
        }
    # Checkpointing must not change training: every arm ends with the same weights.
    result["same_final_weights"] = len({r["weights_sha256"] for r in runs}) == 1
    result["target"] = "overhead < 2% of training time at the chosen interval"
    result["target_met"] = all(
        a["overhead_at_interval"][str(DEMO_INTERVAL)] < 0.02 for a in result["arms"].values()
    )
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
