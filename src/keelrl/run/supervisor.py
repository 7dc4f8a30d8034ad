"""The parent process: runs training in a child ("worker"), restarts it when it crashes or hangs, and turns
preemption signals into a clean checkpoint-and-exit.

    keelrl train CONFIG ...   ->  supervise()  --spawns-->  python -m keelrl worker CONFIG ... --resume auto

Liveness. The worker writes `RUN/heartbeat.json` from its main thread at every phase boundary and inside the
long loops (per token while sampling, per micro-batch while training), at most once a second; a background
thread would keep beating while the main thread is stuck, so there is none. No heartbeat for
`supervisor.hang_timeout_s` (`startup_timeout_s` before the first) means hung (a SIGSTOPped worker too): the
worker's process group is SIGKILLed and the run restarts from its last checkpoint.

Crashes. A non-zero exit or a death by signal (an OOM kill is SIGKILL) restarts the worker after a
backoff that doubles with consecutive restarts (capped at 60 s), at most `max_restarts` times per
`restart_window_s`. When `crash_loop_restarts` consecutive attempts die without getting past the step
the previous one died at, the supervisor stops and says so, with the tail of the worker's log, instead
of burning the budget. Exits that a restart cannot help are final (`FINAL_EXITS`): a user error (2), a guard's
stop (3), checkpoints that keep failing, e.g. on a full disk (4).

Preemption. SIGTERM/SIGINT reaches the worker as SIGTERM: it finishes its step, checkpoints and exits 0
("preempted"); a second signal kills it at once.

Output. The worker's stdout and stderr come through pipes, line by line, to `RUN/worker.log` and to this
process's stdout and stderr (plain lines off a terminal, above a progress bar on one: monitor/sinks.Terminal);
every restart is a line there with its cause (a crash's exit status and last stderr line, a signal, a hang).

The supervisor holds the run directory's lock (monitor/run_lock.py) for all its workers, so a restarted
worker is never refused and a second trainer on the same directory is refused before it writes anything.

status.json belongs to the supervisor while it runs (state, step, pid, worker_pid, restarts,
last_checkpoint, last_heartbeat); every restart is an event in events.jsonl with its cause and the steps
lost. A worker started without a supervisor (`--no-supervisor`, or `keelrl.loop.trainer.train` called from
Python) writes status.json itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keelrl.config import SupervisorConfig
from keelrl.core.procs import die_with_parent
from keelrl.monitor.run_dir import HEARTBEAT_FILE, RunDir, atomic_write_text, read_json
from keelrl.monitor.run_lock import hold
from keelrl.monitor.sinks import Terminal

WORKER_LOG = "worker.log"
ENV_SUPERVISED = "KEELRL_SUPERVISED"
POLL_S = 0.25
EXIT_USER_ERROR = 2  # the worker's exit status for a mistake in the config or command line
EXIT_GUARD_STOP = 3  # a guard stopped the run on purpose (keelrl.loop.trainer.GuardStop)
EXIT_CANNOT_SAVE = 4  # checkpoints kept failing past the configured bound (keelrl.run.run.CheckpointStop)
# exits that a restart cannot help, and the state they leave the run in
FINAL_EXITS = {EXIT_USER_ERROR: "failed", EXIT_GUARD_STOP: "stopped", EXIT_CANNOT_SAVE: "stopped"}


class Heartbeat:
    """Written by the worker's main thread; cheap enough to call from inner loops (throttled to 1/s)."""

    def __init__(self, run_path: Path, enabled: bool = True) -> None:
        self.path = run_path / HEARTBEAT_FILE
        self.enabled = enabled
        self.fields: dict[str, Any] = {"pid": os.getpid(), "state": "starting"}
        self._last = 0.0

    def beat(self, force: bool = False, **fields: Any) -> None:
        if not self.enabled:
            return
        self.fields.update(fields)
        now = time.time()
        if force or now - self._last >= 1.0:
            self._last = now
            atomic_write_text(self.path, json.dumps({**self.fields, "time": now}))


_CURRENT: Heartbeat | None = None


def install_heartbeat(hb: Heartbeat | None) -> None:
    """Make `pulse()` beat `hb` (the worker's main thread installs its heartbeat once at start)."""
    global _CURRENT
    _CURRENT = hb


def pulse(**fields: Any) -> None:
    """A liveness signal from inside long loops (sampling, training); a no-op when no heartbeat is installed."""
    if _CURRENT is not None:
        _CURRENT.beat(**fields)


def read_heartbeat(run_path: Path) -> dict[str, Any] | None:
    return read_json(run_path / HEARTBEAT_FILE)


@dataclass
class Attempt:
    """One worker life."""

    started: float
    end_step: int | None = None
    returncode: int | None = None
    cause: str = ""


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory, or killed from outside)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {code}"


class Supervisor:
    def __init__(self, worker_argv: list[str], run_path: Path, cfg: SupervisorConfig) -> None:
        self.worker_argv = worker_argv
        self.run_dir = RunDir(run_path)
        self.cfg = cfg
        self.terminal = Terminal(0)  # supervise() gives it the run's progress bar
        # what the terminal is to show, in order; a reader that stops reading (`| less`, a pipe nobody drains)
        # then loses lines (worker.log keeps them) instead of blocking the worker's output and so its heartbeat
        self.lines: queue.Queue[tuple[str, bool]] = queue.Queue(maxsize=10_000)
        threading.Thread(target=self._speak, daemon=True).start()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pumps: list[threading.Thread] = []
        self.last_error = ""  # the worker's last line on stderr (a crash's exception)
        self.stop_signals = 0
        self.attempts: list[Attempt] = []
        self.restart_times: deque[float] = deque()
        self.restarts = 0

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signals += 1
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.stop_signals == 1:
            self.run_dir.event(
                "preempt",
                self._step() or 0,
                signal=signal.Signals(signum).name,
                action="worker asked to checkpoint and exit",
            )
            self.proc.send_signal(signal.SIGTERM)
        else:
            self._kill_worker()

    def _step(self) -> int | None:
        hb = read_heartbeat(self.run_dir.path)
        return None if hb is None else hb.get("step")

    def _kill_worker(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self._kill_worker()

    def _loop(self) -> int:
        while True:
            attempt = self._start(resume_auto=bool(self.attempts))  # every attempt after the first resumes
            cause = self._watch(attempt)
            hb = read_heartbeat(self.run_dir.path) or {}
            attempt.end_step = hb.get("step")
            if cause == "exit" and attempt.returncode == 0:
                self._status(state=hb.get("state", "finished"))
                return 0
            if self.stop_signals:
                self._status(state="stopped")
                return 130
            if cause == "exit" and attempt.returncode in FINAL_EXITS:
                # a user error, a guard that decided to stop, a disk that takes no checkpoint: restarting cannot help
                self._status(state=FINAL_EXITS[attempt.returncode], reason=hb.get("reason"))
                return attempt.returncode
            verdict = self._should_restart(attempt)
            if verdict is not None:
                self.run_dir.event("gave_up", attempt.end_step or 0, reason=verdict)
                self._status(state="failed", reason=verdict)
                self.say(f"keelrl supervisor: {verdict}", err=True)
                return 1
            # doubles with each failure still within the restart window (_should_restart dropped the older
            # ones): a crash after a long healthy stretch starts the backoff over
            delay = min(60.0, self.cfg.backoff_s * 2 ** len(self.restart_times))
            restored = self._restore_step()
            lost = max(0, (attempt.end_step or 0) - (restored or 0))
            self.restarts += 1
            self.restart_times.append(time.time())
            self.run_dir.event(
                "restart",
                attempt.end_step or 0,
                cause=attempt.cause,
                resume_from=restored,
                steps_lost=lost,
                restarts=self.restarts,
                delay_s=delay,
            )
            self._status(state="restarting", restarts=self.restarts)
            self.say(
                f"keelrl supervisor: worker {attempt.cause}, at step {attempt.end_step or 0}; restart "
                f"{self.restarts} in {delay:g} s from {f'step {restored}' if restored else 'the start'} "
                f"({lost} steps lost)"
            )
            wake = time.monotonic() + delay
            while not self.stop_signals and time.monotonic() < wake:
                time.sleep(min(0.1, max(0.0, wake - time.monotonic())))
            if self.stop_signals:  # a SIGTERM or Ctrl-C during the wait: no worker is there to pass it to
                self.say(
                    "keelrl supervisor: stopped before the restart; the same command resumes from the last checkpoint",
                    err=True,
                )
                self._status(state="stopped")
                return 130

    def _start(self, resume_auto: bool) -> Attempt:
        argv = list(self.worker_argv)
        if resume_auto and "--resume" in argv:  # restarts always continue from the newest valid checkpoint
            i = argv.index("--resume")
            argv = [*argv[:i], *argv[i + 2 :]]
        if resume_auto:
            argv += ["--resume", "auto"]
        (self.run_dir.path / HEARTBEAT_FILE).unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, ENV_SUPERVISED: "1", "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        if self.stop_signals:  # one came while it started, after the loop's check: pass it on
            self.proc.send_signal(signal.SIGTERM)
        self.last_error = ""
        self.pumps = [
            threading.Thread(target=self._pump, args=(pipe, err), daemon=True)
            for pipe, err in ((self.proc.stdout, False), (self.proc.stderr, True))
        ]
        for pump in self.pumps:
            pump.start()
        attempt = Attempt(started=time.time())
        self.attempts.append(attempt)
        self._status(state="running", worker_pid=self.proc.pid, restarts=self.restarts)
        return attempt

    def _watch(self, attempt: Attempt) -> str:
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                for pump in self.pumps:  # the worker's last words (a grandchild may hold the pipes a while)
                    pump.join(timeout=2.0)
                attempt.returncode = code
                attempt.cause = _describe_exit(code) + (
                    f" ({self.last_error})" if code > 0 and self.last_error else ""
                )
                return "exit"
            hb = read_heartbeat(self.run_dir.path)
            now = time.time()
            if hb is None:
                if now - attempt.started > self.cfg.startup_timeout_s:
                    return self._hung(
                        attempt,
                        f"no heartbeat within supervisor.startup_timeout_s={self.cfg.startup_timeout_s:g}",
                    )
            else:
                self.terminal.advance_to(int(hb.get("step") or 0))
                self._status(
                    state=hb.get("state", "running"),
                    step=hb.get("step"),
                    last_heartbeat=hb.get("time"),
                    last_checkpoint=hb.get("last_checkpoint"),
                    worker_pid=self.proc.pid,
                )
                if now - float(hb.get("time", now)) > self.cfg.hang_timeout_s:
                    return self._hung(
                        attempt,
                        f"no heartbeat for {now - float(hb['time']):.0f} s "
                        f"(supervisor.hang_timeout_s={self.cfg.hang_timeout_s:g}) in phase {hb.get('phase')}",
                    )
            time.sleep(POLL_S)

    def _pump(self, pipe: Any, err: bool) -> None:
        """Copy the worker's stdout (or stderr) line by line to worker.log (appends: the two pumps' lines
        interleave whole) and to this terminal (a line redrawn with carriage returns shows its last state)."""
        with open(self.run_dir.path / WORKER_LOG, "ab") as log, pipe:
            for raw in iter(pipe.readline, b""):
                log.write(raw)
                log.flush()
                text = raw.decode(errors="replace").rstrip("\n").rsplit("\r", 1)[-1]
                if err and text.strip():
                    self.last_error = text.strip()
                self.say(text, err)

    def say(self, text: str, err: bool = False) -> None:
        with contextlib.suppress(queue.Full):
            self.lines.put_nowait((text, err))

    def _speak(self) -> None:
        while True:
            self.terminal.say(*self.lines.get())
            self.lines.task_done()

    def _hung(self, attempt: Attempt, why: str) -> str:
        self._kill_worker()
        attempt.returncode = self.proc.returncode if self.proc else None
        attempt.cause = f"hung: {why}"
        return "hang"

    def _restore_step(self) -> int | None:
        """Step of the newest committed checkpoint (the worker verifies it; a bad one costs more steps)."""
        for path in sorted(self.run_dir.checkpoints.glob("step_*"), reverse=True):
            manifest = read_json(path / "manifest.json") or {}
            if "step" in manifest:
                return int(manifest["step"])
        return None

    def _should_restart(self, attempt: Attempt) -> str | None:
        now = time.time()
        while self.restart_times and now - self.restart_times[0] > self.cfg.restart_window_s:
            self.restart_times.popleft()
        if len(self.restart_times) >= self.cfg.max_restarts:
            return (
                f"the worker failed {len(self.restart_times) + 1} times within {self.cfg.restart_window_s:g} s "
                f"(supervisor.max_restarts={self.cfg.max_restarts}); last failure: {attempt.cause}"
            )
        n = self.cfg.crash_loop_restarts
        recent = self.attempts[-n:]
        if len(recent) == n and len({a.end_step for a in recent}) == 1:
            return (
                f"crash loop: {n} attempts in a row died at step {attempt.end_step} ({attempt.cause}). Restarting "
                f"again would fail the same way; fix the cause (the worker's output is above, and in "
                f"{self.run_dir.path / WORKER_LOG}) and resume with the same command."
            )
        return None

    def _status(self, **fields: Any) -> None:
        self.run_dir.write_status(pid=os.getpid(), **{k: v for k, v in fields.items() if v is not None})


def supervise(
    worker_argv: list[str], run_path: Path, cfg: SupervisorConfig, steps: int = 0, label: str = "train"
) -> int:
    """Run `worker_argv` under supervision until it finishes, is stopped, or gives up; the terminal shows the
    worker's output as it comes, under a progress bar of `steps` on a terminal. Returns an exit code."""
    supervisor = Supervisor(worker_argv, run_path, cfg)
    lock = hold(supervisor.run_dir)  # before anything is written: a second trainer is refused here, at once
    supervisor.terminal = Terminal(steps, 0, label)
    try:
        return supervisor.run()
    finally:
        deadline = time.time() + 5.0  # the last lines, unless the terminal has stopped taking any
        while supervisor.lines.unfinished_tasks and time.time() < deadline:
            time.sleep(0.05)
        supervisor.terminal.close()
        lock.release()
