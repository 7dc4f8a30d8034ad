"""A real full disk: the run directory on a 10 MB tmpfs, filled after the first checkpoint.

The `[faults] disk_full_at_step` drill injects ENOSPC through a write hook; here the writes themselves fail
(safetensors raises its own `SafetensorError`, torch.save a `RuntimeError`), as they do on a real machine.
Mounting needs root (or CAP_SYS_ADMIN); without it these tests are skipped with the reason."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelrl.run import checkpoint as ckpt
from keelrl.run.supervisor import EXIT_CANNOT_SAVE, WORKER_LOG

from .conftest import Drill, events, summary, wait_for

# the smoke config's tiny model (a checkpoint is about 1.7 MB), 8 steps, a checkpoint every 2
SMOKE = Drill(["train.threads=1", "log.progress=false"])


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command on this machine: cannot make a small filesystem")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 10 MB tmpfs (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def _first_checkpoint_then_fill(disk: Path, run_dir: Path) -> Path:
    """Train 2 steps (checkpoint step_00000002), then fill the disk leaving far less than a checkpoint."""
    done = SMOKE.run(run_dir, "train.steps=2")
    assert done.returncode == 0, done.stderr[-2000:]
    needed = sum(f.stat().st_size for f in (run_dir / "checkpoints" / "step_00000002").iterdir())
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(disk).free - 200_000))
    assert shutil.disk_usage(disk).free < needed // 4
    return filler


def _assert_previous_intact(run_dir: Path) -> None:
    checkpoints = run_dir / "checkpoints"
    assert ckpt.verify(checkpoints / "step_00000002") is None
    assert (checkpoints / ckpt.LATEST).resolve().name == "step_00000002"
    assert not list(checkpoints.glob(".tmp-*")), "a partial checkpoint directory was left behind"
    assert not events(run_dir, "restart"), "a full disk is not a crash to restart"
    assert "Traceback" not in (run_dir / WORKER_LOG).read_text()


def test_full_disk_stops_with_a_message_once_saves_keep_failing(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    _first_checkpoint_then_fill(small_disk, run_dir)
    done = SMOKE.run(run_dir, "checkpoint.max_failed_saves=2")
    assert done.returncode == EXIT_CANNOT_SAVE, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "checkpoint.max_failed_saves=2" in done.stderr and "step_00000002" in done.stderr
    failed = events(run_dir, "checkpoint_failed")
    assert [e["step"] for e in failed] == [4, 6]
    assert all("No space left on device" in e["reason"] for e in failed)
    assert [(e["steps_since_good"], e["failed_in_row"]) for e in failed] == [(2, 1), (4, 2)]
    assert failed[-1]["good_checkpoint"] == "step_00000002" and failed[-1]["minutes_since_good"] >= 0
    metrics = {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    assert max(metrics) == 6 and metrics[6]["checkpoint/steps_since_good"] == 4
    assert "checkpoint/steps_since_good" not in metrics[4]  # absent until a save has failed
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    _assert_previous_intact(run_dir)


# slow (28 s): async save failures are also reported in tests/unit/test_checkpoint_failures.py
@pytest.mark.slow
def test_full_disk_with_async_saves_reports_and_training_goes_on(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    filler = _first_checkpoint_then_fill(small_disk, run_dir)
    proc = SMOKE.start(run_dir, "checkpoint.async_save=true")
    try:
        wait_for(
            lambda: events(run_dir, "checkpoint_failed") or proc.poll() is not None, 240, "a failed save"
        )
    finally:
        filler.unlink()  # space again: the next save must succeed and the run finish
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    failed = events(run_dir, "checkpoint_failed")
    assert failed, "the failed background save was not reported"
    assert failed[0]["step"] == 4 and "No space left on device" in failed[0]["reason"]
    assert failed[0]["steps_since_good"] == 2
    resumed = max(i for i, e in enumerate(events(run_dir)) if e["kind"] == "resume")
    later = [e["step"] for e in events(run_dir)[resumed:] if e["kind"] == "checkpoint"]
    assert later and min(later) > 4 and summary(run_dir)["steps"] == 8
    assert ckpt.verify(run_dir / "checkpoints" / "step_00000008") is None
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    assert not events(run_dir, "restart") and "Traceback" not in (run_dir / WORKER_LOG).read_text()
