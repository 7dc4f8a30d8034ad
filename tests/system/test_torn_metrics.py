"""A metrics line cut mid-way (power loss while appending) is counted on resume and its step is redone, so
metrics.jsonl ends with every step once; and metrics are durable up to every durable checkpoint, so a torn
line can only belong to a step after the checkpoint the run resumes from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from keelrl.loop.trainer import train
from keelrl.run.faults import InjectedFault

from .conftest import Drill, assert_same_run, events


def test_torn_last_metrics_line_is_counted_and_its_step_redone(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = drill.config("faults.crash_at_step=3")  # checkpoints at 0 and 2, then a crash after step 3
    with pytest.raises(InjectedFault):
        train(cfg, run_dir)
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    last = text.splitlines()[-1]
    assert json.loads(last)["step"] == 3
    metrics.write_text(text[: len(text) - len(last) - 1] + last[: len(last) // 2])  # the power went out
    train(cfg, run_dir)
    resume = events(run_dir, "resume")
    assert len(resume) == 1 and resume[0]["step"] == 2
    assert resume[0]["dropped_metric_lines"] == 1 and resume[0]["torn_metric_lines"] == 1
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(9))
    assert_same_run(run_dir, reference_run)  # the redone step 3 recorded what an uninterrupted run records


def test_metrics_are_fsynced_before_each_checkpoint_commits(
    drill: Drill, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    run_dir = tmp_path / "run"
    train(drill.config("train.steps=2"), run_dir)
    metrics = str(run_dir / "metrics.jsonl")
    for step in (0, 2):  # each commit's manifest is written after the metrics up to its step were synced
        manifest = next(
            i for i, p in enumerate(synced) if f"step_{step:08d}" in p and p.endswith("/manifest.json")
        )
        assert metrics in synced[:manifest], f"metrics.jsonl not fsynced before checkpoint step {step}"
