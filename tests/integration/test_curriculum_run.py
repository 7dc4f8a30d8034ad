"""A real (tiny) run with the adaptive curriculum over a task mixture, dynamic sampling and predict-and-skip:
its metrics and events, and resume exactness: 4 steps then resumed to 8 equals 8 straight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keelrl.config import config_from_dict
from keelrl.loop.trainer import train
from keelrl.monitor.report import PLOTS, render_report
from keelrl.monitor.run_dir import read_jsonl
from keelrl.run.checkpoint import read_state

NOT_COMPARED = (
    "time",
    "time/",
    "throughput/",
    "eval/",
)  # wall-clock, and the eval at the end of the 4-step leg


def config(steps: int) -> Any:
    return config_from_dict(
        {
            "model": {
                "path": "tiny",
                "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4, "max_positions": 64},
            },
            "task": {
                "name": "mixture",
                "params": {
                    "tasks": [
                        {
                            "task": "countdown",
                            "weight": 2,
                            "params": {"min_numbers": 2, "max_numbers": 3, "max_number": 9, "max_target": 50},
                        },
                        {"task": "multiply", "name": "mul", "params": {"digits_a": 2, "digits_b": 1}},
                    ]
                },
            },
            "rollout": {"batch_size": 16, "group_size": 4, "max_new_tokens": 10},
            # a random policy earns no reward: the entropy bonus makes every update move the weights, so
            # identical weights at the end really mean identical problems, samples and updates
            "algo": {"lr": 1e-3, "entropy_coef": 0.01},
            "train": {"steps": steps, "micro_batch_size": 8, "seed": 5},
            "eval": {"every_steps": 0, "problems": 2, "at_start": False},
            "checkpoint": {"every_steps": 2, "keep_last": 2},
            "log": {"rollouts_per_step": 2, "tensorboard": False, "progress": False},
            "supervisor": {"enabled": False},
            "curriculum": {
                "kind": "adaptive",
                "mixture": "adaptive",
                "dynamic_sampling": True,
                "refill_budget": 1.0,
                "skip_after": 1,
            },
        },
        "test",
    )


def comparable(run: Path) -> list[dict[str, Any]]:
    return [
        {
            k: v
            for k, v in m.items()
            if not any(k == p or (p.endswith("/") and k.startswith(p)) for p in NOT_COMPARED)
        }
        for m in read_jsonl(run / "metrics.jsonl")
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("curriculum")
    resumed, straight = root / "resumed", root / "straight"
    train(config(4), resumed)
    train(config(8), resumed)  # --resume auto: continues from the step-4 checkpoint
    train(config(8), straight)
    return resumed, straight


def test_resume_is_exact(runs: tuple[Path, Path]) -> None:
    resumed, straight = runs
    a = json.loads((resumed / "summary.json").read_text())
    b = json.loads((straight / "summary.json").read_text())
    assert a["steps"] == b["steps"] == 8
    assert a["weights_sha256"] == b["weights_sha256"]
    assert comparable(resumed) == comparable(straight)
    assert any(e["kind"] == "resume" for e in read_jsonl(resumed / "events.jsonl"))


def test_curriculum_metrics_events_and_state(runs: tuple[Path, Path]) -> None:
    _, run = runs
    metrics = list(read_jsonl(run / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(1, 9))
    buckets = ["countdown/n2", "countdown/n3", "mul/1x1", "mul/2x1"]
    for m in metrics:
        for b in buckets:
            assert 0.0 < m[f"curriculum/pass_rate/{b}"] < 0.5  # nothing solved: below the prior, above 0
            assert 0.0 < m[f"curriculum/weight/{b}"] < 1.0
        assert sum(m[f"curriculum/weight/{b}"] for b in buckets) == pytest.approx(1.0)
        assert sum(m[f"curriculum/prompts/{b}"] for b in buckets) == 4 + 4  # the batch and a full refill
        assert m["task/countdown/accuracy"] == 0.0 and m["task/mul/share"] + m["task/countdown/share"] == 1.0
        # a random policy earns nothing: every group is degenerate, the refill budget is spent and reported
        assert m["curriculum/budget_exhausted"] == 1.0 and m["curriculum/regenerated_groups"] == 4.0
        assert m["curriculum/dropped_groups"] == 8.0 and m["curriculum/filled_degenerate_groups"] == 4.0
        assert m["curriculum/generated_samples"] == 32.0
    exhausted = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "dynamic_sampling_exhausted"]
    assert [e["step"] for e in exhausted] == [1, 2, 4, 8]  # said once per doubling of the streak
    state = read_state(run / "checkpoints" / "latest")["curriculum"]  # what a resume restores
    assert state["kind"] == "adaptive" and state["serial"] == 8 * 8 and state["draws"] == 8 * 2
    skipped = sum(m["curriculum/skipped_prompts"] for m in metrics)  # 1x1 problems repeat and always fail
    assert sum(state["cursor"].values()) == 8 * 8 + skipped and set(state["stats"]) == set(buckets)
    assert 0 < len(state["problems"]) <= 64  # predict-and-skip's per-problem records


def test_report_shows_the_curriculum(runs: tuple[Path, Path]) -> None:
    page = render_report([runs[1]])
    for panel, title, _, _ in PLOTS:
        if panel == "Curriculum":  # every plot of the panel: this run logs each family
            assert f'data-title="{title}"' in page
    assert "curriculum/pass_rate/countdown/n3" in page and "task/mul/accuracy" in page


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,buckets",
    [
        ("countdown", ["n2", "n3", "n4"]),
        ("multiply", ["1x1", "2x1", "3x1"]),
        ("countdown_set", ["x1", "x2", "x3", "x4"]),
        ("countdown_set_restated", ["x1", "x2", "x3", "x4"]),
        ("cipher", ["len1", "len2", "len3", "len4"]),
        ("spell_backward", ["L0", "L1", "L2"]),
    ],
)
def test_benchmark_quick_mode_writes_the_promised_json(
    family: str, buckets: list[str], tmp_path: Path
) -> None:
    """benchmarks/curriculum.py --quick end to end (pretrains a small base itself): minutes."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "benchmarks/curriculum.py",
        "--family",
        family,
        "--quick",
        "--work",
        str(tmp_path / "work"),
        "--jobs",
        "1",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    report = json.loads(out.read_text())
    assert report["setup"]["buckets"] == buckets and report["setup"]["hardest_bucket"] == buckets[-1]
    for key in ("steps_to_target", "steps_to_hardest_bucket_target", "hardest_bucket_accuracy"):
        assert set(report[key]) == {"curriculum", "uniform", "fixed_hard"}
        for arm in report[key].values():
            assert len(arm["per_seed"]) == 1 and "mean" in arm
    assert report["base_model"]["pretrained_by"].startswith("benchmarks/curriculum.py")
    assert isinstance(report["target_met"], bool) and report["verdict"]
    hard_only = report["runs"]["fixed_hard"][0]
    # every step, every prompt from the hardest bucket
    prompts = float(report["setup"]["steps"]) * report["setup"]["rl"]["rollout"]["batch_size"] / 8
    assert hard_only["prompts_per_bucket"] == {**dict.fromkeys(buckets[:-1], 0.0), buckets[-1]: prompts}
    assert hard_only["no_signal_per_bucket"][buckets[0]] is None  # never drawn
    assert 0.0 <= report["no_signal_per_bucket"]["uniform"][buckets[-1]] <= 1.0
    # compute to the hardest bucket's target: every step's batch until then
    for runs in report["runs"].values():
        for run in runs:
            steps = run["steps_to_hard_target"]
            samples = None if steps is None else steps * report["setup"]["rl"]["rollout"]["batch_size"]
            assert run["samples_to_hard_target"] == samples
