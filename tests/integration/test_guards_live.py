"""The guards on tiny real runs: each provoked fault or divergence gets its action, its event, and the run
then continues healthily or stops as configured. Runs start from `format_model_dir` (rewards vary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keelrl.config import load_config
from keelrl.loop.trainer import GuardStop, train


def _events(run: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["kind"] == kind]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _cfg(format_run: list[str], *extra: str):
    return load_config("configs/smoke.toml", [*format_run, "eval.problems=8", "eval.every_steps=0", *extra])


def test_nan_gradient_is_skipped_and_training_continues(format_run, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(_cfg(format_run, "train.steps=6", "faults.nan_grad_at_step=3"), run)
    skip = _events(run, "skip")
    assert [(e["step"], e["rule"]) for e in skip] == [(3, "nonfinite")]
    by_step = {m["step"]: m for m in _metrics(run)}
    assert by_step[3]["guard/skipped_updates"] == 1 and by_step[3]["guard/nonfinite_updates"] == 1
    assert by_step[6]["guard/skipped_steps"] == 1
    assert all(isinstance(by_step[s]["grad_norm"], float) for s in (4, 5, 6))  # finite again
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def test_repeated_skips_escalate_to_rollback_and_resume_stays_exact(format_run, tmp_path: Path) -> None:
    # one skipped update (a NaN gradient at step 5) is already "too many" here: the run rolls back
    settings = [
        "train.steps=10",
        "checkpoint.every_steps=2",
        "faults.nan_grad_at_step=5",
        "guards.max_skips_in_window=1",
    ]
    run = tmp_path / "run"
    train(_cfg(format_run, *settings), run)
    rollbacks = _events(run, "rollback")
    assert len(rollbacks) == 1 and rollbacks[0]["rule"] == "too_many_skips"
    assert (rollbacks[0]["step"], rollbacks[0]["to_step"]) == (5, 4)
    steps = [m["step"] for m in _metrics(run)]
    assert steps == list(range(11))  # no duplicated or missing steps after rolling back
    assert {m["step"]: m for m in _metrics(run)}[10]["guard/skipped_steps"] == 1
    assert json.loads((run / "status.json").read_text())["state"] == "finished"  # and then healthy to the end
    # a crash after the rollback (step 6 is first reached after it), then resume: the same final weights
    crashed = tmp_path / "crashed"
    cfg = _cfg(format_run, *settings, "faults.crash_at_step=6")
    with pytest.raises(RuntimeError, match="injected fault"):
        train(cfg, crashed)
    train(cfg, crashed)
    summary = lambda r: json.loads((r / "summary.json").read_text())  # noqa: E731
    assert summary(crashed)["weights_sha256"] == summary(run)["weights_sha256"]


def test_grad_spike_skips_the_update(format_run, tmp_path: Path) -> None:
    # a hair-trigger spike detector on a real run: updates above the recent median are skipped
    run = tmp_path / "run"
    settings = [
        "train.steps=10",
        "guards.grad_spike.window=5",
        "guards.grad_spike.z=0.5",
        "guards.grad_spike.min_ratio=1.2",
        "guards.max_skips_in_window=100",
    ]
    train(_cfg(format_run, *settings), run)
    skips = _events(run, "skip")
    assert skips and all(e["rule"] == "grad_spike" and e["evidence"]["ratio"] >= 1.2 for e in skips)
    last = _metrics(run)[-1]
    assert last["guard/skipped_steps"] == len(skips) and last["step"] == 10


def test_stop_rule_stops_the_run(tmp_path: Path) -> None:
    # a random model never earns reward: no_signal goes critical; configured to stop, the run stops
    run = tmp_path / "run"
    cfg = load_config(
        "configs/smoke.toml", ["train.steps=12", 'guards.no_signal.action="stop"', "supervisor.enabled=false"]
    )
    with pytest.raises(GuardStop):
        train(cfg, run)
    stop = _events(run, "guard_stop")
    assert stop and stop[0]["rule"] == "no_signal"
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] < 12


def test_kl_blowup_rolls_back(format_run, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = _cfg(
        format_run,
        "train.steps=8",
        "algo.lr=0.05",
        "algo.ppo_epochs=4",
        "algo.minibatches=2",
        "checkpoint.every_steps=1",
        "guards.max_rollbacks=1",
        "guards.ratio_outlier.enabled=false",
        "guards.grad_spike.enabled=false",
    )
    try:
        train(cfg, run)
    except GuardStop:
        pass  # a second blow-up after the one allowed rollback stops the run: also a configured outcome
    rollback = _events(run, "rollback")
    assert rollback and rollback[0]["rule"] == "kl_blowup"
    assert rollback[0]["evidence"]["kl_old"] > 0.1


def test_reward_hacking_is_flagged(format_run, tmp_path: Path) -> None:
    # tests/user_tasks.py:HackableMultiply, named by import path as a user names their own task
    run = tmp_path / "run"
    # eval_regression only warns here, so the whole hack plays out (by default it would roll back once the
    # strict accuracy has halved; tests/learning/test_demo_failures.py covers that action)
    settings = ['task.name="user_tasks:HackableMultiply"', "train.steps=24", "algo.lr=3e-3"]
    settings += ["eval.every_steps=4", "eval.problems=32"]
    train(_cfg(format_run, *settings, 'guards.eval_regression.action="warn"'), run)
    hacking = [e for e in _events(run, "guard") if e["rule"] == "reward_hacking"]
    assert hacking, [e["rule"] for e in _events(run, "guard")]
    m = _metrics(run)
    evals = [x["eval/accuracy"] for x in m if "eval/accuracy" in x]
    assert max(evals) - evals[-1] >= 0.1 and m[-1]["reward/mean"] > m[1]["reward/mean"]
