"""The run-directory lock without processes: who counts as a live holder, and acquire / refuse / take over."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from keelrl.monitor import run_lock
from keelrl.monitor.doctor import diagnose, load_run
from keelrl.monitor.run_lock import RunLock, RunLockedError, stale_reason

NOW = 1_000_000.0
HERE = {"host": "node-a", "boot_id": "boot-1"}
DEAD_PID = 2**31 - 1  # above any pid_max: no such process


def record(**fields) -> dict:
    return {
        "pid": os.getpid(),
        "host": "node-a",
        "boot_id": "boot-1",
        "started": NOW - 50,
        "renewed": NOW - 5,
        **fields,
    }


def test_live_holder_on_this_machine_is_not_stale() -> None:
    assert stale_reason(record(), HERE, NOW) is None


def test_dead_pid_is_stale() -> None:
    why = stale_reason(record(pid=DEAD_PID), HERE, NOW)
    assert why is not None and f"process {DEAD_PID}" in why and "gone" in why


def test_other_boot_id_is_stale_even_if_the_pid_exists_now() -> None:
    why = stale_reason(record(boot_id="boot-0"), HERE, NOW)
    assert why is not None and "rebooted" in why


def test_other_host_is_live_while_its_lease_is_fresh_and_stale_after() -> None:
    fresh = record(host="node-b", boot_id="boot-9", renewed=NOW - run_lock.STALE_AFTER_S + 10)
    assert stale_reason(fresh, HERE, NOW) is None
    old = record(host="node-b", boot_id="boot-9", renewed=NOW - run_lock.STALE_AFTER_S - 10)
    why = stale_reason(old, HERE, NOW)
    assert why is not None and "node-b" in why and "lease" in why


def test_a_free_os_lock_on_this_machine_means_the_holder_is_gone() -> None:
    # a live pid in the record is then a reused pid, not the holder
    why = stale_reason(record(), HERE, NOW, os_lock_free=True)
    assert why is not None


def test_second_acquire_is_refused_naming_the_holder_then_free_after_release(tmp_path: Path) -> None:
    first = RunLock.acquire(tmp_path)
    try:
        with pytest.raises(RunLockedError) as err:
            RunLock.acquire(tmp_path)  # another open file description: flock refuses it even in one process
        msg = str(err.value)
        assert f"process {os.getpid()}" in msg and run_lock.here()["host"] in msg and "--run-dir" in msg
        assert "\n" not in msg
    finally:
        first.release()
    assert not (tmp_path / "lock.json").exists()
    RunLock.acquire(tmp_path).release()


def test_record_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / "lock.json").write_text(json.dumps({**record(pid=DEAD_PID), **run_lock.here()}))
    lock = RunLock.acquire(tmp_path)
    try:
        assert lock.taken_over is not None and str(DEAD_PID) in lock.taken_over
        assert json.loads((tmp_path / "lock.json").read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_other_host_with_a_fresh_lease_is_refused_even_when_the_os_lock_is_free(tmp_path: Path) -> None:
    # a shared filesystem whose locks other hosts do not see: the lease is what protects the run
    now = time.time()
    (tmp_path / "lock.json").write_text(json.dumps(record(host="node-b", started=now, renewed=now, pid=4242)))
    with pytest.raises(RunLockedError, match="process 4242 on host node-b"):
        RunLock.acquire(tmp_path)
    old = now - run_lock.STALE_AFTER_S - 1
    (tmp_path / "lock.json").write_text(json.dumps(record(host="node-b", started=old, renewed=old)))
    RunLock.acquire(tmp_path).release()


def test_doctor_says_live_or_stale(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 1.0, "reward/mean": 0.5}\n')
    lock = RunLock.acquire(tmp_path)
    try:
        notes = diagnose(load_run(tmp_path)).notes
        assert any(f"locked by live process {os.getpid()}" in n for n in notes), notes
    finally:
        lock.release()
    (tmp_path / "lock.json").write_text(json.dumps({**record(pid=DEAD_PID), **run_lock.here()}))
    notes = diagnose(load_run(tmp_path)).notes
    assert any("stale lock" in n and "gone" in n for n in notes), notes
