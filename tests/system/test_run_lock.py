"""Two trainers on one run directory, as real processes: the second is refused at once and the first is not
disturbed; a lock left by a killed trainer does not block the resume."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from .conftest import Drill, assert_same_run, events, kill, wait_for

# The first trainer's first reward call sleeps this long, so it is surely alive while the others try.
STALL = "faults.reward_stall_s=20"


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_second_trainer_is_refused_and_the_first_finishes_intact(
    drill: Drill, tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    a, b = drill.start(run_dir, STALL), drill.start(run_dir, STALL)  # started together: one must win
    wait_for(lambda: a.poll() is not None or b.poll() is not None, 90, "one of the two trainers to give up")
    winner, loser = (b, a) if a.poll() is not None else (a, b)
    t0 = time.time()
    late = drill.run(run_dir, STALL, supervised=False, timeout=90)  # a worker without a supervisor, too
    refused_in = time.time() - t0
    assert winner.poll() is None, "the refusals must come while the first trainer still runs"
    for code, err in ((loser.wait(), loser.stderr.read()), (late.returncode, late.stderr)):
        assert code == 2, err[-2000:]
        assert f"process {winner.pid}" in err and "in use" in err, err[-2000:]
        assert "Traceback" not in err
    assert refused_in < 60
    _, err = winner.communicate(timeout=300)
    assert winner.returncode == 0, err[-3000:]
    assert _steps(run_dir) == list(range(9))  # each step once: nothing interleaved
    assert not events(run_dir, "restart") and not events(run_dir, "resume")
    saves = [e["step"] for e in events(run_dir, "checkpoint")]
    assert saves == sorted(set(saves))
    assert_same_run(run_dir, reference_run)
    assert not (run_dir / "lock.json").exists()  # released at the end


# slow (44 s): a stale lock is also taken over in tests/unit/test_run_lock.py
@pytest.mark.slow
def test_lock_of_a_killed_supervisor_does_not_block_the_resume(drill: Drill, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = drill.start(run_dir, STALL)
    wait_for(lambda: (run_dir / "heartbeat.json").exists(), 120, "the first trainer's heartbeat")
    assert json.loads((run_dir / "lock.json").read_text())["pid"] == first.pid
    kill(first.pid, signal.SIGKILL)  # its worker dies with it (PDEATHSIG); the record stays behind
    first.wait()
    done = drill.run(run_dir, STALL, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps(run_dir) == list(range(9))
    taken = events(run_dir, "lock_taken_over")
    assert len(taken) == 1 and str(first.pid) in taken[0]["reason"]
