"""Fault drills: every way a run can die, and that it comes back exactly as if it had not.

Each test runs the real CLI (`keelrl train`, supervised) on a tiny config and compares the final weights
(sha256) and every per-step metric except timing with an uninterrupted reference run."""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from keelrl.loop.trainer import train
from keelrl.run import checkpoint as ckpt

from .conftest import Drill, assert_same_run, events, kill, summary, wait_for, worker_pid


def _sigkill_trial(drill: Drill, tmp_path: Path, reference: Path, rng: random.Random, name: str) -> None:
    # kill the worker at a random moment of its life (model load, sampling, update, eval, checkpoint write);
    # a moment after the run's end kills nothing: the trial starts over with half of it
    moment = rng.uniform(0.0, 6.0)
    for attempt in range(4):
        run_dir = tmp_path / f"{name}-{attempt}"
        proc = drill.start(run_dir)
        wait_for(lambda d=run_dir: worker_pid(d) is not None, 60, "the worker to start")
        time.sleep(moment)
        pid = worker_pid(run_dir)
        if proc.poll() is None and not (run_dir / "summary.json").exists():
            break
        proc.communicate(timeout=300)
        moment /= 2
    else:
        raise AssertionError("the run always ended before the kill")
    assert pid is not None and kill(pid), f"the worker ({pid}) was gone before the kill landed"
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    restarts = events(run_dir, "restart")
    assert restarts and "SIGKILL" in restarts[0]["cause"], "the killed worker must be restarted"
    assert_same_run(run_dir, reference)


@pytest.mark.slow  # a fuzz over kill moments; the fixed-moment drills here stay in the default suite
def test_sigkill_at_random_moments_resumes_exactly(drill: Drill, tmp_path: Path, reference_run: Path) -> None:
    rng = random.Random(1)
    for trial in range(2):
        _sigkill_trial(drill, tmp_path, reference_run, rng, f"kill{trial}")


@pytest.mark.slow
def test_sigkill_twenty_trials(drill: Drill, tmp_path: Path, reference_run: Path) -> None:
    rng = random.Random(20)
    for trial in range(20):
        _sigkill_trial(drill, tmp_path, reference_run, rng, f"kill{trial}")


def test_kill_during_checkpoint_write_keeps_previous(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    done = drill.run(run_dir, "faults.kill_during_save_at_step=4")
    assert done.returncode == 0, done.stderr[-2000:]
    restart = events(run_dir, "restart")[0]
    assert "SIGKILL" in restart["cause"] and restart["resume_from"] == 2  # step 4 never committed
    assert events(run_dir, "resume")[0]["checkpoint"] == "step_00000002"
    assert_same_run(run_dir, reference_run)


def test_corrupted_newest_checkpoint_is_detected_and_skipped(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    done = drill.run(run_dir, "faults.corrupt_latest_checkpoint=true")
    assert done.returncode == 0, done.stderr[-2000:]
    skipped = events(run_dir, "checkpoint_skipped")
    assert skipped and skipped[0]["checkpoint"] == "step_00000002" and "sha256" in skipped[0]["reason"]
    assert_same_run(run_dir, reference_run)


def test_unpicklable_trainer_state_falls_back_to_the_previous_checkpoint(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    # trainer_state.pt replaced and the manifest rewritten to match: it verifies, but does not unpickle
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir, symlinks=True)
    newest = ckpt.committed(run_dir / "checkpoints")[0]
    (newest / ckpt.TRAINER_STATE).write_bytes(b"this is not a pickle")
    manifest = ckpt.read_manifest(newest)
    manifest["files"][ckpt.TRAINER_STATE] = {
        "bytes": 20,
        "sha256": ckpt.sha256_file(newest / ckpt.TRAINER_STATE),
    }
    (newest / ckpt.MANIFEST).write_text(json.dumps(manifest))
    assert ckpt.verify(newest) is None
    done = drill.run(run_dir, supervised=False)
    assert done.returncode == 0, done.stderr[-2000:]
    skipped = events(run_dir, "checkpoint_skipped")
    assert [e["checkpoint"] for e in skipped] == [newest.name] and "trainer_state.pt" in skipped[0]["reason"]
    assert events(run_dir, "resume")[-1]["checkpoint"] == "step_00000006"
    assert_same_run(run_dir, reference_run)  # steps 7 and 8 redone exactly


@pytest.mark.parametrize("async_save", [False, True])
def test_disk_full_during_save_keeps_previous_and_reports(
    drill: Drill, tmp_path: Path, async_save: bool
) -> None:
    cfg = drill.config(
        "supervisor.enabled=false", "faults.disk_full_at_step=4", f"checkpoint.async_save={async_save}"
    )
    run_dir = tmp_path / "run"
    train(cfg, run_dir)
    failed = events(run_dir, "checkpoint_failed")
    assert len(failed) == 1 and failed[0]["step"] == 4 and "No space left on device" in failed[0]["reason"]
    assert failed[0]["steps_since_good"] == 2 and failed[0]["failed_in_row"] == 1  # counted, in both modes
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r.get("checkpoint/failed_saves") for r in records if r["step"] >= 6} == {1.0}
    names = [p.name for p in ckpt.committed(run_dir / "checkpoints")]
    assert "step_00000004" not in names and "step_00000002" in names
    assert ckpt.verify(run_dir / "checkpoints" / "step_00000002") is None
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the half-written directory is gone
    assert summary(run_dir)["steps"] == 8  # training went on


def test_sigstopped_worker_is_detected_as_hung_and_restarted(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = drill.start(run_dir, "supervisor.hang_timeout_s=4")
    wait_for(
        lambda: (run_dir / "heartbeat.json").exists() and worker_pid(run_dir) is not None, 60, "a heartbeat"
    )
    # at once: the drill's whole run takes about half a second once the heartbeat is there
    pid = worker_pid(run_dir)
    assert pid is not None and kill(pid, signal.SIGSTOP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    restart = events(run_dir, "restart")[0]
    assert restart["cause"].startswith("hung: no heartbeat")
    assert_same_run(run_dir, reference_run)


def test_sigterm_to_supervisor_checkpoints_and_exits_cleanly(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = drill.start(run_dir)
    wait_for(lambda: _step(run_dir) >= 3, 120, "step 3")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "preempted"
    saved = events(run_dir, "preempted")[0]["step"]
    assert status["step"] == saved and (run_dir / "checkpoints" / ckpt.step_dir_name(saved)).is_dir()
    assert not (run_dir / "summary.json").exists()
    # the same command continues the run to the end, exactly as if it had never stopped
    done = drill.run(run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(run_dir, reference_run)


def _step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "status.json").read_text()).get("step") or 0)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
