"""Learning: RL with the core trainer raises held-out accuracy clearly above where it started.

The task is the demo's (two-number Countdown, compact template) on the demo's pretrained base: small
enough for a CPU, and a base that sits at chance, so a gain can only come from RL reading the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
def test_rl_raises_held_out_accuracy(demo_dir: Path, demo_summary: dict[str, Any]) -> None:
    s = demo_summary
    # the base is at chance: the corpus carries no information about the target
    assert abs(s["base_accuracy"] - s["chance_accuracy"]) < 0.08
    # RL: at least 10 points absolute on 500 held-out problems, and the paired interval excludes 0
    assert s["eval_problems"] == 500 and s["final_accuracy"] >= s["base_accuracy"] + 0.10
    assert s["accuracy_change_ci95"][0] > 0 and s["verdict"] == "better"
    metrics = [json.loads(x) for x in (demo_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    assert max(evals[1:]) > evals[0] + 0.10  # the in-run held-out evals rise too
    assert metrics[-1]["reward/mean"] > metrics[1]["reward/mean"]
