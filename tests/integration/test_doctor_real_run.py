"""keelrl doctor on a real tiny run (the smoke config, 6 steps): what it says must match what the run's
own files show, and it must cope with the files of a run still being written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from keelrl.config import load_config
from keelrl.guards.engine import check, scan
from keelrl.loop.trainer import train
from keelrl.monitor.doctor import diagnose, load_run, run_doctor
from keelrl.monitor.run_dir import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("doctor") / "run"
    # one torch thread: several times faster on a shared 2-core machine; restored afterwards
    overrides = ["train.steps=6", "train.threads=1", "log.progress=false", "log.tensorboard=false"]
    threads = torch.get_num_threads()
    try:
        train(load_config(ROOT / "configs" / "smoke.toml", overrides), run)
    finally:
        torch.set_num_threads(threads)
    return run


def test_doctor_on_a_real_tiny_run(smoke_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = list(read_jsonl(smoke_run / "metrics.jsonl"))
    train_recs = [m for m in metrics if "reward/mean" in m]
    assert len(train_recs) == 6

    code = run_doctor(smoke_run, as_json=True)
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == data["exit_code"] == {"healthy": 0, "warning": 1, "critical": 2}[data["verdict"]]
    h = data["headline"]
    assert h["steps"] == 6 and h["state"] == "finished"
    assert (
        h["checkpoints"]
        == sum(1 for e in read_jsonl(smoke_run / "events.jsonl") if e["kind"] == "checkpoint")
        >= 1
    )
    assert h["evals"] == sum(1 for m in metrics if "eval/accuracy" in m) >= 2
    assert h["reward_start"] == pytest.approx(sum(m["reward/mean"] for m in train_recs[:5]) / 5)
    n_rollouts = sum(1 for _ in read_jsonl(smoke_run / "rollouts.jsonl.gz"))
    assert data["traces"]["rollouts"] == n_rollouts > 0 and data["traces"]["steps_logged"] == 6

    names = {f["name"]: f for f in data["findings"]}
    for f in data["findings"]:
        assert 0 <= f["steps"][0] <= f["steps"][1] <= 6
    # What the doctor must say follows from the run's own numbers: the random-init smoke policy earns
    # nothing, so every group is all-equal and loss and gradient are exactly zero.
    if all(m["groups/no_signal_frac"] == 1.0 for m in train_recs):
        assert names["no_signal"]["severity"] == "critical" and names["no_signal"]["ongoing"]
        assert names["no_signal"]["samples"], "the finding quotes stored rollouts"
        assert code == 2
    if all(m["loss/total"] == 0.0 and m["grad_norm"] == 0.0 for m in train_recs):
        assert names["exact_zero"]["evidence"]["zero_steps"] == 6
    # the trace analysis agrees with the trainer's own truncation count on the logged samples
    logged = list(read_jsonl(smoke_run / "rollouts.jsonl.gz"))
    trunc = sum(r["finish_reason"] == "length" for r in logged) / len(logged)
    rows = data["traces"]["by_step"]
    assert sum(r["truncated"] * r["n"] for r in rows) / sum(r["n"] for r in rows) == pytest.approx(trunc)

    assert run_doctor(smoke_run, as_json=False) == code
    out = capsys.readouterr().out
    assert "keelrl doctor:" in out and f"exit status {code}" in out
    for name in names:
        assert f"] {name}  " in out


def test_live_check_agrees_with_the_doctor(smoke_run: Path) -> None:
    history = list(read_jsonl(smoke_run / "metrics.jsonl"))
    live = {f.name for f in check(history)}
    ongoing = {f.name for f in scan(history) if f.ongoing}
    assert live == ongoing


def test_doctor_on_the_files_of_a_run_in_progress(smoke_run: Path, tmp_path: Path) -> None:
    """A copy cut after step 3 with a torn line and a 'running' status: what a reader sees mid-run."""
    run = tmp_path / "partial"
    shutil.copytree(smoke_run, run, ignore=shutil.ignore_patterns("checkpoints", "final", "tb"))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["step"] <= 3]
    (run / "metrics.jsonl").write_text("\n".join(kept) + '\n{"step": 4, "reward')
    (run / "summary.json").unlink()
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "state": "running", "step": 3}))
    d = diagnose(load_run(run))
    assert d.headline["steps"] == 3 and d.headline["state"] == "running"
    assert all(f.steps[1] <= 6 for f in d.findings)
