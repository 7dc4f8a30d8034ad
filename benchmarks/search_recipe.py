"""The search recipe (keelrl.recipes.search) end to end: seeds 0, 1, 2 on three-number Countdown and one run on
four numbers; prints one JSON object (per run: accuracy before/after RL on 500 held-out problems, greedy;
the paired difference with its 95% interval; behaviour statistics before/after; seconds per stage).

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/search_recipe.py --out runs/bench_search
    python benchmarks/search_recipe.py --seeds 0 --no-four --minutes 4   # a quicker look

Runs are sequential, one torch thread each (the default plan took 12 minutes per seed alone on one thread of a
2-core machine; the budget is 30); `--jobs N` runs N at a time, each slower when cores are shared.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

BEHAVIOUR_SHOWN = (
    "found",
    "gave_up",
    "nodes",
    "backtracks",
    "verified",
    "arith_error_rate",
    "any_arith_error",
)


def run_one(seed: int, numbers: int, minutes: float, out: str, quick: bool = False) -> dict[str, Any]:
    """One recipe run, condensed to the numbers the benchmark reports (`quick`: a plan of seconds)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from keelrl.recipes.search import SearchPlan, run_search_demo

    plan = None
    if quick:
        plan = SearchPlan(
            pretrain_steps=3, pretrain_batch=2, pack_length=128, rl_steps=2, rl_batch=32, group_size=4,
            max_new_tokens=16, eval_every=1, eval_problems=4, rl_eval_problems=4,
        )  # fmt: skip
    s = run_search_demo(
        seed=seed, minutes=minutes, out=Path(out) / f"n{numbers}_seed{seed}", numbers=numbers, plan=plan
    )

    def stats(side: dict[str, Any]) -> dict[str, float]:
        return {k: round(side[f"search/{k}"], 4) for k in BEHAVIOUR_SHOWN if f"search/{k}" in side}

    return {
        "seed": seed,
        "numbers": numbers,
        "accuracy_before": s["base_accuracy"],
        "accuracy_after": s["final_accuracy"],
        "difference": s["accuracy_change"],
        "difference_ci95": s["accuracy_change_ci95"],
        "verdict": s["verdict"],
        "behaviour_before": stats(s["before"]),
        "behaviour_after": stats(s["after"]),
        "seconds": {k: round(v, 1) for k, v in s["seconds"].items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the three-number runs")
    ap.add_argument(
        "--minutes", type=float, default=12.0, help="scales the recipe's steps (12: the default plan)"
    )
    ap.add_argument("--out", default="runs/bench_search")
    ap.add_argument("--no-four", action="store_true", help="skip the four-number run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each uses one thread)")
    ap.add_argument(
        "--quick", action="store_true", help="one three-number run (seed 0) on a plan of seconds: 3 + 2 steps"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.no_four = "0", True
    runs = [(int(s), 3) for s in args.seeds.split(",") if s.strip()]
    if not args.no_four:
        runs.append((0, 4))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, seed, n, args.minutes, args.out, args.quick) for seed, n in runs]
        results = [f.result() for f in futures]
    three = [r for r in results if r["numbers"] == 3]
    report = {
        "benchmark": "search_recipe",
        "quick": args.quick,
        "minutes_per_run": args.minutes,
        "runs": results,
        "three_numbers": {
            "mean_before": sum(r["accuracy_before"] for r in three) / max(1, len(three)),
            "mean_after": sum(r["accuracy_after"] for r in three) / max(1, len(three)),
            "all_gain_at_least_10_points": all(r["difference"] >= 0.10 for r in three),
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
