"""The supervisor's restart wait (run/supervisor.py) with a worker that only crashes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from keelrl.config import SupervisorConfig
from keelrl.monitor.run_dir import read_json
from keelrl.run.supervisor import Supervisor


def test_a_stop_signal_during_the_restart_wait_starts_no_new_worker(tmp_path: Path) -> None:
    """A Ctrl-C or a preemption's SIGTERM after a crash, while the supervisor waits to restart, ends the run
    there: a worker started after it would never hear of the stop (and be SIGKILLed with no checkpoint)."""
    attempts = tmp_path / "attempts"
    worker = f"import pathlib, sys; p = pathlib.Path({str(attempts)!r}); p.write_text(p.read_text() + 'x'); sys.exit(1)"
    attempts.write_text("")
    run = tmp_path / "run"
    supervisor = Supervisor([sys.executable, "-c", worker], run, SupervisorConfig(backoff_s=30.0))

    def state() -> str | None:
        return (read_json(run / "status.json") or {}).get("state")

    def stop_while_waiting() -> None:
        deadline = time.monotonic() + 60
        while state() != "restarting" and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # to the supervisor's handler (installed by `run`)

    threading.Thread(target=stop_while_waiting, daemon=True).start()
    t0 = time.monotonic()
    assert supervisor.run() == 130
    assert time.monotonic() - t0 < 25, "the supervisor sat out its 30 s wait"
    assert attempts.read_text() == "x" and state() == "stopped"
