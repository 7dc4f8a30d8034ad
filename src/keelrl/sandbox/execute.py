"""`Sandbox`: one slot that runs one execution at a time: it starts the level's launcher with the harness
(harness.py, passed as source to `python -I -S -B -c`), feeds it the job (the code, the entry point, the
calls' arguments: never an expected output), enforces the wall clock and the output cap, kills what is
left, and reads the records into an `ExecResult`."""

from __future__ import annotations

import contextlib
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from keelrl.sandbox.harness import children_of
from keelrl.sandbox.isolation import (
    LAUNCHERS,
    SAFE_PATH,
    IsolationRequest,
    _is_root,
    hidden_in,
    interpreter,
    lease_slot,
    logger,
    root_layout,
    sweep_uid,
    warn_once,
)
from keelrl.sandbox.result import (
    LEVELS,
    Answer,
    Call,
    ExecResult,
    IsolationLevel,
    SandboxError,
    SandboxLimits,
    as_calls,
    interpret,
)

_HARNESS = (Path(__file__).parent / "harness.py").read_text(encoding="utf-8")


class Sandbox(contextlib.AbstractContextManager):
    """One sandbox slot: runs one execution at a time (use `SandboxPool` for many at once).

    isolation: "auto" (strongest available, with a warning when below bwrap) or a level, which must work.
    limits: default limits for `run`. python: interpreter for the code (default: the trainer's own).
    hide: files or directories the code must not read even where the sandbox's root would show them (an
    answer key under the interpreter's prefix); bwrap and unshare cover them, rlimit cannot.
    """

    def __init__(
        self,
        isolation: IsolationRequest = "auto",
        limits: SandboxLimits | None = None,
        python: str | None = None,
        hide: Sequence[str] = (),
        *,
        _probing: bool = False,
    ) -> None:
        self.level: IsolationLevel = isolation if _probing else resolve_isolation(isolation)  # type: ignore[assignment]
        self.limits = limits or SandboxLimits()
        self.python = os.path.realpath(python) if python else interpreter()
        self._lease, self.python = lease_slot(self.level, self.python)
        self._layout = root_layout(self.python)
        self._hide = hidden_in(self._layout, hide)
        self._host_pidns = os.readlink("/proc/self/ns/pid")

    @property
    def uid(self) -> int | None:
        """The uid the code runs under (None: the trainer's own)."""
        return self._lease.uid if self._lease else None

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        code: str,
        entry_point: str | None = None,
        calls: Sequence[Call | str] = (),
        limits: SandboxLimits | None = None,
    ) -> ExecResult:
        """Execute `code`, then call `entry_point` once per call and report each answer (JSON) or the
        exception it raised; never raises on anything the code does. Judging is `judge.py`'s."""
        lim = limits or self.limits
        todo = as_calls(calls)
        nonce, exec_id = secrets.token_hex(16), secrets.token_hex(6)
        host_work = tempfile.mkdtemp(prefix="keelrl-sandbox-") if self.level == "rlimit" else None
        work = host_work or "/tmp/work"
        r_fd, w_fd = os.pipe()  # the results channel: the harness writes its records to w_fd
        job = {
            "fd": w_fd,
            "nonce": nonce,
            "level": self.level,
            "uid": self.uid,
            "work": work,
            "host_pidns": self._host_pidns,
            "parent_pid": os.getpid(),
            "layout": self._layout,
            "hide": self._hide,
            "tmp_bytes": lim.tmp_mb << 20,
            "code": code,
            "entry_point": entry_point,
            "calls": [(c.args, c.show_args) for c in todo],
            "answer_bytes": lim.answer_bytes,
            "limits": {
                "cpu_s": lim.cpu_seconds,
                "memory_bytes": lim.memory_mb << 20,
                "processes": lim.processes,
                "file_bytes": lim.file_mb << 20,
            },
        }
        env = {"PATH": SAFE_PATH, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        launcher = LAUNCHERS[self.level](lim, self.python, self._hide)
        argv = [*launcher, self.python, "-I", "-S", "-B", "-c", _HARNESS, "keelrl-sandbox", exec_id]
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(w_fd,),
                env=env,
                cwd="/",
                start_new_session=True,
            )
        except OSError as err:
            os.close(r_fd)
            os.close(w_fd)
            if host_work:
                shutil.rmtree(host_work, ignore_errors=True)
            return ExecResult(
                "sandbox_error", len(todo), 0.0, self.level, detail=f"cannot start {argv[0]}: {err}"
            )
        os.close(w_fd)
        stopped: str | None = "error"  # until _drive returns
        try:
            res_cap = lim.answer_bytes + 600 * (len(todo) + 8)  # the answers' JSON, other records ~550 bytes
            out, err, res, stopped = self._drive(
                proc, marshal.dumps(job), r_fd, t0 + lim.wall_s, lim, res_cap
            )
            if stopped is None:
                try:
                    proc.wait(timeout=max(0.0, t0 + lim.wall_s - time.perf_counter()) + 1.0)
                except subprocess.TimeoutExpired:
                    stopped = "timeout"
            if stopped is not None:
                for f in (proc.stdout, proc.stderr):  # unread full pipes would block a dying writer
                    f.close()
                self._kill_tree(proc)
                res += _drain(r_fd)
        except BaseException:  # a bug here or KeyboardInterrupt: still leave nothing running
            self._kill_tree(proc)
            raise
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything left in the launcher's group (not yet reaped)
            proc.wait()
            os.close(r_fd)
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
            if (
                self.level == "rlimit"
                and self.uid is not None
                and (stopped is not None or proc.returncode != 0)
            ):
                sweep_uid(self.uid)  # H did not get to clean up
            if host_work:
                shutil.rmtree(host_work, ignore_errors=True)
        wall = time.perf_counter() - t0
        return interpret(
            nonce, res, out, err, stopped, len(todo), lim, wall, self.level, exec_id, proc.returncode
        )

    def _drive(
        self,
        proc: subprocess.Popen[bytes],
        payload: bytes,
        r_fd: int,
        deadline: float,
        lim: SandboxLimits,
        res_cap: int,
    ) -> tuple[bytes, bytes, bytes, str | None]:
        """Feed the job; read stdout/stderr heads and the pipe until closed, "timeout" or "output_limit"."""
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        heads = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
        caps = {"out": lim.excerpt_chars * 4, "err": lim.excerpt_chars * 4, "res": res_cap}
        total_output = 0
        stdin_fd = proc.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        sent = 0
        with selectors.DefaultSelector() as sel:
            sel.register(stdin_fd, selectors.EVENT_WRITE, "in")
            sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
            sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
            sel.register(r_fd, selectors.EVENT_READ, "res")
            while len(sel.get_map()) > 0:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return bytes(heads["out"]), bytes(heads["err"]), bytes(heads["res"]), "timeout"
                for key, _ in sel.select(left):
                    if key.data == "in":
                        try:
                            sent += os.write(stdin_fd, payload[sent : sent + 65536])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # the harness died before reading its job
                            sent = len(payload)
                        if sent >= len(payload):
                            sel.unregister(stdin_fd)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = heads[key.data]
                    if key.data == "res":
                        if len(buf) + len(chunk) > caps["res"]:
                            return bytes(heads["out"]), bytes(heads["err"]), bytes(buf), "output_limit"
                        buf += chunk
                        continue
                    total_output += len(chunk)
                    if len(buf) < caps[key.data]:
                        buf += chunk[: caps[key.data] - len(buf)]
                    if total_output > lim.output_bytes:
                        return bytes(heads["out"]), bytes(heads["err"]), bytes(heads["res"]), "output_limit"
        return bytes(heads["out"]), bytes(heads["err"]), bytes(heads["res"]), None

    def _kill_tree(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the launcher's children (a namespace init, or C and the orphans H collected), give H a
        moment to clean up (rlimit level), then the launcher's group; wait until the children are gone."""
        kids = children_of(proc.pid)
        pidfds = []
        for k in kids:
            with contextlib.suppress(OSError):
                pidfds.append(os.pidfd_open(k))
        for k in kids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(k, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not _wait_gone(pidfds, 10.0):
            logger.warning("sandbox: processes of a killed execution did not exit within 10 s")
        for fd in pidfds:
            os.close(fd)


def _wait_gone(pidfds: list[int], timeout: float) -> bool:
    """Wait until every pidfd reports its process exited; True when all did."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in pidfds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in sel.select(left):
                sel.unregister(key.fd)
    return True


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):  # nothing more to read now
        while (chunk := os.read(fd, 65536)) and sum(map(len, chunks)) <= 1 << 20:
            chunks.append(chunk)
    return b"".join(chunks)


# Which isolation levels work here: probed with one real sandboxed execution per process and level (so here,
# beside the Sandbox that runs it), then remembered.
_detect_lock = threading.Lock()
_probe_results: dict[str, str | None] = {}


def probe(level: IsolationLevel) -> str | None:
    """None when `level` works here, else why not: one real sandboxed execution per process and level."""
    with _detect_lock:
        if level in _probe_results:
            return _probe_results[level]
        why: str | None = None
        tool = {"bwrap": "bwrap", "unshare": "unshare", "rlimit": None}[level]
        if tool is not None and shutil.which(tool) is None:
            why = f"`{tool}` is not installed" + (" (apt-get install bubblewrap)" if tool == "bwrap" else "")
        else:
            try:
                with Sandbox(level, SandboxLimits(wall_s=20.0), _probing=True) as box:
                    r = box.run("def f(x):\n    return x + 1\n", "f", ["1"])
                if r.status != "ok" or r.answers != (Answer("value", "2"),):
                    why = f"probe run failed: {r.status}: {r.detail} {r.stderr.strip()[:300]}"
            except (OSError, SandboxError) as err:
                why = f"probe run failed: {err}"
        _probe_results[level] = why
        return why


def available_levels() -> list[IsolationLevel]:
    """The isolation levels that work here, strongest first."""
    return [lv for lv in LEVELS if probe(lv) is None]


def detect_isolation() -> IsolationLevel:
    """The strongest level that works here, with a `SandboxWarning` (once) when it is not bwrap."""
    reasons = []
    for lv in LEVELS:
        why = probe(lv)
        if why is None:
            if lv != "bwrap":
                weaker = {
                    "unshare": "namespaces via unshare (equivalent containment, slightly less tested)",
                    "rlimit": "RESOURCE LIMITS ONLY: model code can use the network and host Unix sockets, read "
                    "world-readable files (a code task's answer key included) and write to world-writable directories"
                    + ("" if _is_root() else ", signal your processes and read their environment"),
                }[lv]
                warn_once(
                    f"level-{lv}",
                    f"sandbox: using {lv!r} isolation, {weaker}. Stronger levels unavailable: {'; '.join(reasons)}. "
                    "Install bubblewrap (apt-get install bubblewrap) for the strongest isolation.",
                )
            else:
                logger.info("sandbox: using bwrap isolation")
            return lv
        reasons.append(f"{lv}: {why}")
    raise SandboxError("no sandbox isolation level works here: " + "; ".join(reasons))


def resolve_isolation(request: IsolationRequest) -> IsolationLevel:
    """For "auto", detect_isolation(); an explicit level must work here, else SandboxError saying why."""
    if request == "auto":
        return detect_isolation()
    if request not in LEVELS:
        raise SandboxError(f"unknown isolation {request!r}; use one of: auto, {', '.join(LEVELS)}")
    why = probe(request)
    if why is not None:
        raise SandboxError(f"sandbox isolation {request!r} is not available here: {why}")
    return request
