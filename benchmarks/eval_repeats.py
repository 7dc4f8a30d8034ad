"""How many distinct problems two greedy eval reports of the same held-out draws hold, and the paired change of B
over A counted two ways: over the draws (what `keelrl eval` and the recipes report: a problem the generator draws
often counts as often as it is drawn) and over distinct problems (each once). Prints JSON.

    python benchmarks/eval_repeats.py A.json B.json [--unordered numbers]

A procedural task with a small held-out space repeats problems: the SmolLM2 recipe's Countdown (2-3 numbers of
1-9) has 324 distinct held-out problems (the first 50,000 test indices hold no other; the last new one is index
18,636), and its 500 draws hold 151 (318 draws are 26 two-number problems).
Both counts are honest estimates of different things: the draws estimate the accuracy on the generator's
distribution (draws are independent, so the paired interval over draws is valid for it); distinct problems weigh
every problem alike. `--unordered numbers` treats a problem's `numbers` as a multiset (the recipe's prompt sorts
them, so [3, 1] and [1, 3] with the same target are the same prompt).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

import numpy as np

from keelrl.evals.stats import metric_intervals


def problem_key(problem: dict[str, Any], unordered: set[str]) -> str:
    return json.dumps({k: sorted(v) if k in unordered else v for k, v in problem.items()}, sort_keys=True)


def change(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    d = metric_intervals({"accuracy": b - a})["accuracy"]
    return {"a": round(float(a.mean()), 4), "b": round(float(b.mean()), 4), "diff": round(d["value"], 4),
            "ci95": [round(x, 4) for x in d["ci95"]]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--unordered", action="append", default=[], help="a list field that is a multiset")
    args = parser.parse_args()
    ra, rb = (json.load(open(p))["records"]["greedy"] for p in (args.a, args.b))
    if [r["problem"] for r in ra] != [r["problem"] for r in rb]:
        raise SystemExit("the two reports hold different problems: evaluate both on the same draws")
    groups: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for x, y in zip(ra, rb):
        key = problem_key(x["problem"], set(args.unordered))
        groups[key].append((float(x["correct"][0]), float(y["correct"][0]), x["difficulty"]))
    disagree = sum(len({(p, q) for p, q, _ in rows}) > 1 for rows in groups.values())
    draws = np.array([(p, q) for rows in groups.values() for p, q, _ in rows])
    once = np.array([rows[0][:2] for rows in groups.values()])
    by_difficulty: dict[str, dict[str, Any]] = {}
    for name in sorted({rows[0][2] for rows in groups.values()}):
        mine = [rows for rows in groups.values() if rows[0][2] == name]
        pairs = np.array([rows[0][:2] for rows in mine])
        by_difficulty[name] = {"draws": sum(map(len, mine)), "distinct": len(mine),
                               "a": round(float(pairs[:, 0].mean()), 4), "b": round(float(pairs[:, 1].mean()), 4)}  # fmt: skip
    print(json.dumps({
        "draws": len(draws), "distinct": len(groups), "repeats_that_disagree": disagree,
        "over_draws": change(draws[:, 0], draws[:, 1]), "over_distinct": change(once[:, 0], once[:, 1]),
        "by_difficulty_distinct": by_difficulty,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
