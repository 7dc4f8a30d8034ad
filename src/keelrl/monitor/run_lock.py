"""One trainer per run directory: a lock taken before anything in the directory is written.

Two trainers on one directory would interleave metrics.jsonl, write every checkpoint twice and prune each
other's half-written checkpoints. So the process that owns the run holds two things for its whole life:

    RUN/lock        an OS lock (fcntl.flock, exclusive): the kernel drops it when the process dies, however
                    it dies, so on one machine a free OS lock proves the last holder is gone.
    RUN/lock.json   who holds it: pid, host, boot id, start time, and a lease renewed every RENEW_S by a
                    small thread; it names the holder in the refusal and judges staleness where the OS
                    lock cannot.

Who holds it. The supervisor, for all its workers (a restarted worker is never refused; `ENV_SUPERVISED`
tells a worker its supervisor holds the lock); without a supervisor (`--no-supervisor`, a user's own
torchrun, `keelrl.loop.trainer.train` from Python) the writer rank (rank 0) holds it.

When a record without a live OS lock still blocks. A shared filesystem may not carry flock between
hosts, so a record from another host blocks until its lease is STALE_AFTER_S old (its holder renews it
every RENEW_S while alive; a dedicated renewal, not status.json, because a worker without a supervisor
writes its status only once per step, and steps can be long). On this host a record blocks only while its
process lives and the machine has not rebooted since (the boot id changes) — which matters only where
flock is not supported; elsewhere the free OS lock already settles it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from keelrl.monitor.run_dir import RunDir, atomic_write_text, read_json

LOCK_FILE = "lock"
RECORD_FILE = "lock.json"
RENEW_S = 30.0
STALE_AFTER_S = 120.0  # a lease from another host this old is stale (4 missed renewals; allows clock skew)
RECORD_WAIT_S = 3.0  # how long a refused trainer waits for the winner of a race to write its record
_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class RunLockedError(RuntimeError):
    """Another live trainer owns the run directory."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def here() -> dict[str, str]:
    """This machine: host name and boot id (the boot id changes at every reboot)."""
    return {"host": socket.gethostname(), "boot_id": _boot_id()}


def pid_alive(pid: int) -> bool | None:
    """Whether a process with this id exists on this machine (signal 0 sends nothing). None if unknown."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return None
    return True


def stale_reason(
    record: dict[str, Any], machine: dict[str, str], now: float, os_lock_free: bool = False
) -> str | None:
    """Why the holder in `record` no longer holds the run, seen from `machine` at `now`; None while it may
    still be live. `os_lock_free`: this process just took the OS lock, so nobody on this machine holds it."""
    pid, host = record.get("pid"), record.get("host")
    if host != machine["host"]:
        age = now - float(record.get("renewed", 0.0))
        if age > STALE_AFTER_S:
            return f"host {host} has not renewed its lease for {age:.0f} s (stale after {STALE_AFTER_S:g} s)"
        return None
    if record.get("boot_id") and machine["boot_id"] and record["boot_id"] != machine["boot_id"]:
        return f"this machine rebooted since process {pid} took it"
    if os_lock_free:
        return f"process {pid} is gone (no process holds the OS lock)"
    if isinstance(pid, int) and pid_alive(pid) is False:
        return f"process {pid} is gone"
    return None


def _refusal(run_path: Path, record: dict[str, Any] | None) -> str:
    if record is None:
        who, stop = "another process (it has not written its lock.json yet)", "stop it"
    else:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("started", 0))))
        who = f"process {record.get('pid')} on host {record.get('host')} (since {started}, {record.get('command')})"
        stop = f"stop it (kill {record.get('pid')}: it saves a checkpoint and exits)"
    return (
        f"run directory {run_path} is in use by {who}. Two trainers on one directory would interleave its "
        f"metrics and delete each other's checkpoints, so this one did not start. Wait for that run to end, "
        f"{stop} and resume with the same command, or pass another --run-dir. If that process is on another "
        f"host that is gone, its lock counts as stale {STALE_AFTER_S:g} s after its last renewal "
        f"({run_path / RECORD_FILE})."
    )


class RunLock:
    """The held lock of one run directory (`acquire`, then `release` when the run ends)."""

    def __init__(self, run_path: Path, handle: Any, record: dict[str, Any], taken_over: str | None) -> None:
        self.run_path = run_path
        self.handle = handle
        self.record = record
        self.taken_over = taken_over  # why a previous holder's record was stale, if there was one
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="keelrl-run-lock", daemon=True)
        self._renewer.start()

    @classmethod
    def acquire(cls, run_path: str | Path) -> RunLock:
        """Take the run directory or raise RunLockedError naming its live holder."""
        path = Path(run_path)
        path.mkdir(parents=True, exist_ok=True)
        handle = open(path / LOCK_FILE, "a")  # held open (and locked) for the life of the run
        os_lock = True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunLockedError(_refusal(path, _wait_for_record(path))) from None
        except OSError as err:
            if err.errno not in _UNSUPPORTED:
                handle.close()
                raise
            os_lock = False  # a filesystem without flock: the record alone decides
        machine, now = here(), time.time()
        previous = read_json(path / RECORD_FILE)
        taken_over = None
        if previous is not None:
            taken_over = stale_reason(previous, machine, now, os_lock_free=os_lock)
            if taken_over is None:
                handle.close()
                raise RunLockedError(_refusal(path, previous))
        record = {
            "pid": os.getpid(),
            **machine,
            "started": now,
            "renewed": now,
            "command": " ".join(["keelrl", *sys.argv[1:3]]),
        }
        atomic_write_text(path / RECORD_FILE, json.dumps(record) + "\n")
        return cls(path, handle, record, taken_over)

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            self.record["renewed"] = time.time()
            try:
                atomic_write_text(self.run_path / RECORD_FILE, json.dumps(self.record) + "\n")
            except OSError:
                continue  # a full disk: the OS lock still holds; only the lease seen by other hosts ages

    def release(self) -> None:
        self._stop.set()
        self._renewer.join()
        current = read_json(self.run_path / RECORD_FILE) or {}
        if current.get("pid") == os.getpid() and current.get("host") == self.record["host"]:
            (self.run_path / RECORD_FILE).unlink(missing_ok=True)
        self.handle.close()  # drops the OS lock


def _wait_for_record(path: Path) -> dict[str, Any] | None:
    """The holder's record; the winner of a race may not have written it yet, so wait a little for it."""
    deadline = time.time() + RECORD_WAIT_S
    while (record := read_json(path / RECORD_FILE)) is None and time.time() < deadline:
        time.sleep(0.05)
    return record


def describe(run_path: Path) -> str | None:
    """For the doctor: a live process holds the run directory, or a stale lock remains (None: no lock)."""
    record = read_json(run_path / RECORD_FILE)
    if record is None:
        return None
    why = stale_reason(record, here(), time.time())
    holder = f"process {record.get('pid')} on host {record.get('host')}"
    if why is None:
        return f"locked by live {holder}: another trainer on this directory would be refused"
    return f"stale lock of {holder}: {why}; the next trainer on this directory takes it over"


def hold(run_dir: RunDir) -> RunLock:
    """Take `run_dir` for this process; a stale holder's record taken over is an event (`lock_taken_over`)."""
    lock = RunLock.acquire(run_dir.path)
    if lock.taken_over is not None:
        run_dir.event("lock_taken_over", -1, reason=lock.taken_over)
    return lock
