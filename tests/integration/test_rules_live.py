"""Every divergence rule fires on a tiny real run (not only on synthetic streams, tests/unit/test_rules.py).

Each case runs the format-trained model for a few steps with that rule's thresholds set to a hair
trigger, so the run's ordinary dynamics cross them, and the rule's action set to warn so nothing else
changes. The run must then carry the rule's event, with evidence, and finish. The rules with drastic
actions are provoked by real trouble elsewhere (tests/integration/test_guards_live.py, tests/learning/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keelrl.config import load_config
from keelrl.loop.trainer import train
from keelrl.monitor.doctor import diagnose, load_run
from user_tasks import SlowingMultiply

HAIR_TRIGGERS: dict[str, list[str]] = {
    "entropy_collapse": ["baseline_steps=1", "window=2", "warn_frac=0.999", "critical_frac=0.001"],
    "entropy_explosion": [
        "baseline_steps=1",
        "window=1",
        "warn_nats=1e-6",
        "critical_nats=100.0",
        "min_rise=0.0",
    ],
    "mismatch": [
        "window=1",
        "warn_kl=1e-12",
        "critical_kl=1.0",
        "stale_warn_kl=1e-12",
        "stale_critical_kl=1.0",
    ],
    "length_collapse": ["baseline_steps=1", "window=2", "frac=0.9999", "critical_tokens=0.5"],
    "length_explosion": ["baseline_steps=1", "window=2", "factor=1.0001", "min_accuracy_gain=1.0"],
    "reward_collapse": [
        "baseline_steps=1",
        "window=2",
        "min_gain=1e-6",
        "lost_frac=1e-6",
        "critical_frac=1.0",
    ],
    "truncation_surge": [
        "baseline_steps=1",
        "window=1",
        "warn_frac=1e-6",
        "critical_frac=1.0",
        "min_rise=0.0",
    ],
    # the first pass is on-policy (ratio 1 up to float rounding, ~1e-6); the second pass sees the policy the
    # first moved (ratio/max 1.3-9 in these runs): 1.2 is far from both, so only the second pass can fire
    "ratio_outlier": ["max_ratio=1.2"],
}
EXTRA = {
    # stale batches: a real gap (the policy moved since sampling); an in-process sampler agrees with the
    # trainer to ~1e-14 in k3, too close to zero to trigger on
    "mismatch": ["rollout.max_staleness=1"],
    "ratio_outlier": ["algo.ppo_epochs=2"],
    "entropy_explosion": ["algo.entropy_coef=1.0"],  # an entropy bonus that overwhelms the reward
}
# throughput_drop is provoked by a verifier that slows down (below); stalled is a doctor-only judgement of a
# run that stopped writing, tested on status files (tests/unit/test_rules.py).


@pytest.mark.parametrize("rule", sorted(HAIR_TRIGGERS))
def test_rule_fires_on_a_real_run(rule: str, format_run: list[str], tmp_path: Path) -> None:
    sets = [f"guards.{rule}.{t}" for t in HAIR_TRIGGERS[rule]] + [f'guards.{rule}.action="warn"']
    if rule == "ratio_outlier":
        sets[-1] = f'guards.{rule}.action="skip"'  # a per-step check: its actions are skip or off
    cfg = load_config(
        "configs/smoke.toml",
        [
            *format_run,
            "train.steps=10",
            "eval.every_steps=0",
            "eval.problems=8",
            *EXTRA.get(rule, []),
            *sets,
            "guards.max_skips_in_window=100",
        ],
    )
    run = tmp_path / "run"
    train(cfg, run)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    fired = [e for e in events if e.get("rule") == rule and e["kind"] in ("guard", "skip")]
    assert fired, sorted({e.get("rule", e["kind"]) for e in events})
    assert fired[0]["evidence"] and fired[0]["message"]
    if rule == "ratio_outlier":  # judged per optimizer step: only ever the second pass over a batch
        assert {e["epoch"] for e in fired} == {1}, fired
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def test_exact_zero_fires_when_nothing_earns_reward(tmp_path: Path) -> None:
    # the random smoke model never writes an answer: reward, loss and grad_norm are exactly 0.0 every step
    cfg = load_config(
        "configs/smoke.toml", ["train.steps=4", "supervisor.enabled=false", "log.progress=false"]
    )
    train(cfg, tmp_path / "run")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    fired = [e for e in events if e.get("rule") == "exact_zero"]
    # warning, not stop: no rollout earned anything (see no_signal), so the pipeline is not shown broken
    assert fired and fired[0]["severity"] == "warning" and fired[0]["evidence"]["zero_steps"] >= 3


def test_repetition_fires_on_a_looping_model(tmp_path: Path) -> None:
    # a random model sampled almost greedily falls into loops: most completions repeat themselves
    sets = ["train.steps=6", "rollout.temperature=0.05", "rollout.max_new_tokens=48"]
    sets += ["guards.repetition.baseline_steps=1", "guards.repetition.min_rise=0.0"]
    cfg = load_config("configs/smoke.toml", [*sets, "supervisor.enabled=false", "log.progress=false"])
    train(cfg, tmp_path / "run")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("repetition/frac", 0.0) for m in metrics) >= 0.5
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    fired = [e for e in events if e.get("rule") == "repetition"]
    assert fired and fired[-1]["severity"] == "critical"


def test_throughput_drop_fires_when_the_verifier_slows_down(format_run: list[str], tmp_path: Path) -> None:
    SlowingMultiply.calls = 0
    sets = ['task.name="user_tasks:SlowingMultiply"']  # the task by import path, as a user names their own
    sets += ["guards.throughput_drop.window=3", "guards.throughput_drop.reference=5"]
    cfg = load_config(
        "configs/smoke.toml", [*format_run, "train.steps=10", "eval.every_steps=0", "eval.problems=8", *sets]
    )
    train(cfg, tmp_path / "run")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    fired = [e for e in events if e.get("rule") == "throughput_drop"]
    assert fired and fired[0]["evidence"]["ratio"] < 0.5, sorted({e.get("rule", e["kind"]) for e in events})


def test_stalled_fires_on_a_hung_real_run(tmp_path: Path) -> None:
    # an unsupervised run whose process hangs (SIGSTOP): status says running, the process is alive, and no
    # metrics arrive. The doctor (10 minutes later by its clock) calls it stalled.
    run = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "keelrl",
        "train",
        "configs/smoke.toml",
        "--no-supervisor",
        "--run-dir",
        str(run),
    ]
    argv += ["--set", "train.steps=500", "--set", "log.progress=false", "--set", "eval.every_steps=0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            lines = (
                (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
            )
            if len(lines) >= 4:
                break
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGSTOP)
        last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["time"]
        d = diagnose(load_run(run), now=last + 600)
        stalled = [f for f in d.findings if f.name == "stalled"]
        assert stalled and stalled[0].severity == "critical" and d.verdict == "critical"
        assert not [f for f in diagnose(load_run(run), now=last + 1).findings if f.name == "stalled"]
    finally:
        proc.kill()
        proc.wait()
