"""Contained execution of model-written Python code: one process per execution, limits, a pool.

RL on programming tasks runs code the policy wrote, millions of times, next to the trainer, its run
directory and its checkpoints. `Sandbox.run(code, tests, entry_point)` executes `code` and then each
test statement (e.g. `assert f(2) == 4`) in a fresh, contained process and returns an `ExecResult`
(status, tests passed / total, timing, output excerpts). `SandboxPool` runs many at once.

Isolation levels (strongest first; `detect_isolation()` picks the strongest that works here, once per
process, and `Sandbox.level` / `ExecResult.isolation` report the one in use):
- "bwrap": bubblewrap (`apt-get install bubblewrap`). New PID, network, IPC and UTS namespaces; the root
  filesystem bind-mounted read-only; a private, size-limited tmpfs on /tmp; a fresh /proc and a minimal
  /dev. Loopback listeners of the host are unreachable; nothing outside /tmp can be written.
- "unshare": util-linux `unshare --net --pid --ipc --uts --fork --mount-proc` (needs root or unprivileged
  user namespaces). Inside the private mount namespace the harness makes every mount read-only
  (`mount_setattr`, Linux >= 5.12) and mounts fresh tmpfs on /tmp, /var/tmp and /dev/shm, which gives
  the same guarantees as bwrap.
- "rlimit": resource limits and a separate user id only. No network or filesystem isolation beyond
  file permissions: the code can open sockets and write to world-writable directories (/tmp). A loud
  `SandboxWarning` says so. Without root (no separate user id) it can also signal the trainer's
  processes and read their environment: use it only for trusted code.
Auto-detection degrades with a warning; asking for a level explicitly (`Sandbox(isolation="bwrap")`)
raises `SandboxError` when that level does not work here.

Every level also applies, to the process running the model's code: RLIMIT_CPU (CPU seconds),
RLIMIT_AS (memory), RLIMIT_NPROC (processes and threads: fork bombs), RLIMIT_FSIZE (file size),
RLIMIT_NOFILE, no core dumps, `PR_SET_NO_NEW_PRIVS`, a scrubbed environment (PATH, HOME, TMPDIR, LANG
only: nothing of the trainer's variables), stdin from /dev/null, a private working directory, and a
wall-clock limit and an output cap enforced by the parent, which kills the whole tree when either is hit.

Separate user ids. RLIMIT_NPROC is per user, and the kernel does not enforce it for root; file
permissions and signals are per user too. So when keelrl runs as root (as in CI), each sandbox slot
leases its own unused uid (61000 upward; a lock file under the temp dir keeps concurrent processes from
sharing one) and the model's code runs under it: a fork bomb is capped per slot, the code cannot signal
the trainer, and it cannot write anything not world-writable. When the interpreter lives under a
directory that uid cannot enter (e.g. pyenv under /root, mode 0700), bwrap and unshare mount a tmpfs
over that directory with only the interpreter's prefix bound back, read-only; at the rlimit level a
world-readable interpreter (/usr/bin/python3) is used instead, or, if none exists, the code runs as root
with a warning.

Process layout and cleanup. The launcher (bwrap / unshare / nothing) starts a small trusted harness H
(`_HARNESS`, below) with `python -I -S -B`. H reads the job from stdin, sets up mounts and the work
directory, and forks C, which sets the limits, drops to the slot's uid, and runs the solution and the
tests. When C exits, H kills everything C left behind (inside a PID namespace: `kill(-1)`; at the rlimit
level: `kill(-1)` from a helper that first switches to the slot's uid, or, without root, a scan of
the children H collected as a child subreaper) and reaps it. If the parent has to stop a run (wall
clock, output cap), it SIGKILLs the launcher's children and process group and waits on their pidfds; a
dying PID-namespace init takes its whole namespace with it. Either way, no process the code started is
alive when `run` returns (the tests check this for forks, busy children, `setsid` daemons). If the
trainer itself is killed mid-run, bwrap (`--die-with-parent`) and unshare (started under
`setpriv --pdeathsig KILL`, with `--kill-child`) take the namespace down; at the rlimit level H and C
die with their parents (PR_SET_PDEATHSIG), and a grandchild that survives is killed (and the work
directory removed) when the slot's uid is next leased.

Results channel and what the harness defends against. C reports each test as a line
`<nonce> test <i> <ok> <error>` written to a dedicated pipe (not stdout), where the nonce is 128 random
bits from the parent; H adds `<nonce> exit ...` with C's exit status and CPU time. The parent counts
only lines with the nonce, one result per test index, and needs H's exit line and C's `done` line to
call a run finished. Defended (by construction, checked in tests/unit/test_sandbox.py):
- printing fake results, in any format, on stdout or stderr (only the nonce'd pipe counts);
- `sys.exit`, `os._exit`, `quit()`, `raise SystemExit/KeyboardInterrupt` at any point: an exception is
  a failed test; exiting before `done` is a `crash` and unreported tests count as failed;
- monkeypatching `builtins` (e.g. `builtins.sorted`, `AssertionError`, `isinstance`): tests run with a
  snapshot of the builtins taken before the solution ran, and the harness keeps its own references;
- "always equal" answers (objects whose `__eq__` returns True, int/list subclasses): the entry point is
  wrapped so its return value must be built-in data of exact built-in types (numbers, str, bytes,
  None, list, tuple, dict, set, frozenset, recursively), else the test fails;
- killing, tracing or signalling the harness, the trainer or other processes (PID namespace, or a
  separate uid; not at the rlimit level without root), closing or spamming the result pipe (fails
  closed: missing lines are failures);
- resource exhaustion (CPU, memory, processes, output, disk in the private tmpfs).
Not defended: the solution runs in the same interpreter as the tests, so code that goes looking can
read the nonce or the tests' expected values from memory (`gc`, frame introspection, `ctypes`),
install a trace function that skips the `assert`, or replace modules that tests import. Such reward
hacking is deliberate and visible in traces; the guarantees above are about containment (the trainer
is never harmed) and about accidental or cheap forgeries. Reading world-readable files is allowed at
every level (nothing secret should be world-readable); at the rlimit level the network is open and the
code can write to world-writable directories. Aggregate memory is bounded by `processes x memory_mb`
per sandbox, not by one number (no cgroups).

Entry points must be functions returning built-in data; a class or generator as the answer fails the
return check by design.
"""

from __future__ import annotations

import fcntl
import logging
import marshal
import os
import pwd
import queue
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

IsolationLevel = Literal["bwrap", "unshare", "rlimit"]
IsolationRequest = Literal["auto", "bwrap", "unshare", "rlimit"]
Status = Literal[
    "ok",  # every test passed
    "wrong_answer",  # ran to the end, some test failed (assertion or exception)
    "syntax_error",  # the solution does not compile
    "runtime_error",  # the solution's top level raised (before any test ran)
    "timeout",  # wall-clock or CPU limit
    "memory",  # MemoryError (address-space limit)
    "crash",  # killed by a signal (segfault, abort) or exited before the tests finished
    "output_limit",  # stdout + stderr (or a file) over the limit
    "sandbox_error",  # the sandbox itself failed (launcher missing, setup error): not the code's fault
]
LEVELS: tuple[IsolationLevel, ...] = ("bwrap", "unshare", "rlimit")
STATUSES: tuple[str, ...] = Status.__args__  # type: ignore[attr-defined]

UID_BASE = 61000  # first uid leased to sandbox slots when running as root
UID_RANGE = 4000
EXIT_SETUP_FAILED = 70  # C exits with this when it could not apply limits or drop privileges
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

logger = logging.getLogger("keelrl.sandbox")


class SandboxError(RuntimeError):
    """The sandbox cannot run here as configured (e.g. an isolation level that is not available)."""


class SandboxWarning(RuntimeWarning):
    """The sandbox runs with weaker isolation than the strongest level keelrl supports."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-execution limits. `cpu_s` defaults to `wall_s`; the memory limit is the address space of each
    process, so the aggregate is at most `processes x memory_mb`."""

    wall_s: float = 5.0
    cpu_s: float | None = None
    memory_mb: int = 512
    processes: int = 8
    output_bytes: int = 256_000
    file_mb: int = 16
    tmp_mb: int = 64
    excerpt_chars: int = 2000

    def __post_init__(self) -> None:
        problems = []
        if not self.wall_s > 0:
            problems.append(f"wall_s must be > 0 (got {self.wall_s})")
        if self.cpu_s is not None and not self.cpu_s > 0:
            problems.append(f"cpu_s must be > 0 (got {self.cpu_s})")
        if self.memory_mb < 64:
            problems.append(
                f"memory_mb must be >= 64, the interpreter alone needs ~30 MB (got {self.memory_mb})"
            )
        if self.processes < 1:
            problems.append(f"processes must be >= 1 (got {self.processes})")
        for name in ("output_bytes", "file_mb", "tmp_mb", "excerpt_chars"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if problems:
            raise ValueError("bad sandbox limits: " + "; ".join(problems))

    @property
    def cpu_seconds(self) -> int:
        """RLIMIT_CPU takes whole seconds."""
        return max(1, int(-(-(self.cpu_s if self.cpu_s is not None else self.wall_s) // 1)))


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed execution did. `passed` / `total` count the tests; `test_passed[i]` is test i
    (False when it failed or never ran). `detail` is a one-line human explanation of `status`."""

    status: Status
    passed: int
    total: int
    wall_s: float
    isolation: IsolationLevel
    cpu_s: float | None = None
    stdout: str = ""
    stderr: str = ""
    detail: str = ""
    test_passed: tuple[bool, ...] = ()
    exec_id: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Job:
    """One execution for `SandboxPool`: the solution source, test statements, the function the tests
    call (its return values are checked to be built-in data; None: no check), optional limits."""

    code: str
    tests: Sequence[str] = ()
    entry_point: str | None = None
    limits: SandboxLimits | None = None


# ------------------------------------------------------------------------------------------- harness
# Runs inside the sandbox under `python -I -S -B -c`. H (this process) is trusted; C (forked) runs the
# model's code. Everything C uses after the solution has run is captured in locals first.

_HARNESS = r"""
import os, sys

def _main():
    import marshal, resource, time  # cheap imports only: json and signal alone would cost ~25 ms
    job = marshal.loads(sys.stdin.buffer.read())
    fd, nonce, level, uid, work = job["fd"], job["nonce"], job["level"], job["uid"], job["work"]
    write, exit_now = os.write, os._exit

    def record(kind, text=""):
        write(fd, ("%s %s %s\n" % (nonce, kind, text.replace("\n", " ")[:500])).encode("utf-8", "replace"))

    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    libc = None
    if level != "bwrap":
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    try:
        if level != "rlimit" and os.readlink("/proc/self/ns/pid") == job["host_pidns"]:
            raise RuntimeError("expected a private PID namespace")
        if level == "unshare":
            _private_mounts(libc, job, ctypes)
        if level == "rlimit":
            # die with the trainer (PR_SET_PDEATHSIG), collect C's orphans (PR_SET_CHILD_SUBREAPER)
            if libc.prctl(1, 9, 0, 0, 0) != 0 or os.getppid() != job["parent_pid"]:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG), or the trainer is gone")
            if libc.prctl(36, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        os.makedirs(work, 0o700, exist_ok=True)
        if uid is not None:
            os.chown(work, uid, uid)
        os.chmod(work, 0o700)
    except Exception as err:
        record("fault", "harness setup: %s: %s" % (type(err).__name__, err))
        exit_now(0)
    record("start")
    child = os.fork()
    if child == 0:
        code = 71
        try:
            _child(job, record, libc, resource)
            code = 0
        finally:
            exit_now(code)
    status, usage = 0, None
    while True:
        pid, st, ru = os.wait4(-1, 0)
        if pid == child:
            status, usage = st, ru
            break
    _cleanup(level, uid, time)
    if os.WIFSIGNALED(status):
        how = "signal %d" % os.WTERMSIG(status)
    else:
        how = "code %d" % os.WEXITSTATUS(status)
    record("exit", "%s cpu %.4f rss %d" % (how, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
    exit_now(0)


def _private_mounts(libc, job, ctypes):
    # unshare level: H is root in a private mount namespace. Make every mount read-only, then put fresh
    # tmpfs on the writable places, and, when the interpreter sits under a directory the sandbox uid
    # cannot enter, cover that directory with a tmpfs holding only the interpreter's prefix (read-only).
    def check(ret, what):
        if ret != 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    def mount(src, target, fstype, flags, data):
        enc = lambda s: None if s is None else s.encode()
        check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + target)

    class MountAttr(ctypes.Structure):
        _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64), ("userns", ctypes.c_uint64)]

    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
    attr = MountAttr(1, 0, 0, 0)  # MOUNT_ATTR_RDONLY
    libc.syscall.restype = ctypes.c_long
    check(libc.syscall(ctypes.c_long(442), ctypes.c_int(-100), b"/", ctypes.c_uint(0x8000),  # mount_setattr, AT_RECURSIVE
                       ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), "mount_setattr(/, read-only)")
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=755" % job["tmp_bytes"])
    for small in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(small):
            mount("tmpfs", small, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=755")
    hidden, prefix = job["hidden"], job["prefix"]
    if hidden:
        stage = "/tmp/.keelrl-prefix"
        os.mkdir(stage, 0o755)
        mount(prefix, stage, None, MS_BIND | MS_REC, None)
        mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=755")
        path = hidden
        for part in os.path.relpath(prefix, hidden).split("/"):
            path = os.path.join(path, part)
            os.mkdir(path)
            os.chmod(path, 0o755)
        mount(stage, prefix, None, MS_BIND | MS_REC, None)
        mount(None, prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        check(libc.umount2(stage.encode(), 2), "umount " + stage)  # MNT_DETACH
        os.rmdir(stage)


def _child(job, record, libc, resource):
    lim = job["limits"]
    try:
        R = resource
        for which, soft, hard in (
            (R.RLIMIT_CORE, 0, 0),
            (R.RLIMIT_NOFILE, 64, 64),
            (R.RLIMIT_FSIZE, lim["file_bytes"], lim["file_bytes"]),
            (R.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1),
            (R.RLIMIT_NPROC, lim["processes"], lim["processes"]),
            (R.RLIMIT_AS, lim["memory_bytes"], lim["memory_bytes"]),
        ):
            R.setrlimit(which, (soft, hard))
        uid = job["uid"]
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise RuntimeError("could not drop privileges")
        if libc is not None:  # bwrap does both itself
            if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
            if libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG (after setuid, which clears it)
                raise OSError("prctl(PR_SET_PDEATHSIG) failed")
        os.chdir(job["work"])
        os.umask(0o077)
    except Exception as err:
        record("fault", "limits: %s: %s" % (type(err).__name__, err))
        os._exit(70)
    _run(job, record)


def _run(job, record):
    import builtins
    # Captured before any model code runs: the harness never looks these names up again.
    _type, _id, _str, _enumerate, _compile, _exec = type, id, str, enumerate, compile, exec
    _BaseException, _TypeError, _callable, _dict = BaseException, TypeError, callable, dict
    _exit, _stdout, _stderr = os._exit, sys.stdout, sys.stderr
    snapshot = _dict(builtins.__dict__)
    scalar = {_id(t) for t in (int, float, complex, bool, str, bytes, type(None))}
    containers = {_id(t) for t in (list, tuple, set, frozenset)}
    dict_type = dict

    def describe(err):
        try:
            name = _type(err).__name__
            text = _str(err)
        except _BaseException:
            return "exception (unprintable)"
        return name + (": " + text if text else "")

    def check(value, depth, name):
        t = _type(value)
        if _id(t) in scalar:
            return
        if depth < 64:
            if _id(t) in containers:
                for item in value:
                    check(item, depth + 1, name)
                return
            if t is dict_type:
                for k in value:
                    check(k, depth + 1, name)
                    check(value[k], depth + 1, name)
                return
        what = "a value nested too deep" if depth >= 64 else "a value of type " + t.__name__
        raise _TypeError("%s returned %s; answers must be built-in data (numbers, str, bytes, None, list, "
                         "tuple, dict, set) of exact built-in types" % (name, what))

    def guard(fn, name):
        def guarded(*args, **kwargs):
            result = fn(*args, **kwargs)
            check(result, 0, name)
            return result
        return guarded

    try:
        code = _compile(job["code"], "<solution>", "exec", dont_inherit=True)
    except _BaseException as err:
        record("syntax", describe(err))
        return
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        _exec(code, namespace)
    except _BaseException as err:
        record("load", describe(err))
        return
    test_ns = _dict(namespace)
    test_ns["__builtins__"] = snapshot
    entry = job["entry_point"]
    if entry:
        fn = namespace.get(entry)
        if fn is not None and _callable(fn):
            test_ns[entry] = guard(fn, entry)
    for i, src in _enumerate(job["tests"]):
        try:
            _exec(_compile(src, "<test %d>" % i, "exec", dont_inherit=True), test_ns)
        except _BaseException as err:
            record("test", "%d 0 %s" % (i, describe(err)))
        else:
            record("test", "%d 1" % i)
    record("done")
    for stream in (_stdout, _stderr):
        try:
            stream.flush()
        except _BaseException:
            pass
    _exit(0)


def _cleanup(level, uid, time):
    SIGKILL = 9
    # Kill and reap everything C left behind. Never kill(-1) outside a private PID namespace as root.
    if level != "rlimit":
        try:
            os.kill(-1, SIGKILL)
        except ProcessLookupError:
            pass
    elif uid is not None:
        killer = os.fork()
        if killer == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                if os.getuid() == uid and os.geteuid() == uid:
                    os.kill(-1, SIGKILL)  # one pass reaches all: forks racing it fail (SIGKILL pending)
                    os.kill(-1, SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os._exit(0)
        os.waitpid(killer, 0)
    else:
        deadline = time.monotonic() + 2.0
        me = os.getpid()
        while time.monotonic() < deadline:
            kids = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open("/proc/%s/stat" % name, "rb") as f:
                            data = f.read()
                    except OSError:
                        continue
                    if int(data[data.rindex(b")") + 2:].split()[1]) == me:
                        kids.append(int(name))
            if not kids:
                break
            for k in kids:
                try:
                    os.kill(k, SIGKILL)
                except ProcessLookupError:
                    pass
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.001)
        except ChildProcessError:
            break


_main()
"""


# ------------------------------------------------------------------------------------ the parent side


def _interpreter() -> str:
    """The trainer's own base interpreter (not the venv shim): the sandbox runs with -I -S, stdlib only."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _prefix_of(python: str) -> str:
    """The installation prefix of an interpreter at PREFIX/bin/pythonX.Y."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def _hidden_ancestor(path: str) -> str | None:
    """The highest directory on the way to `path` that other users cannot enter (no o+x), or None."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        d = os.path.join(*parts[:i])
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        except OSError:
            return d
    return None


def _world_usable(python: str) -> bool:
    real = os.path.realpath(python)
    try:
        return _hidden_ancestor(_prefix_of(real)) is None and bool(os.stat(real).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def _is_root() -> bool:
    return os.geteuid() == 0


def _mapped_uid_range(lo: int, hi: int) -> bool:
    """Does this process's user namespace map uids lo..hi (a container may map only a few)?"""
    try:
        lines = Path("/proc/self/uid_map").read_text().split("\n")
    except OSError:
        return False
    for line in lines:
        f = line.split()
        if len(f) == 3 and int(f[0]) <= lo and hi < int(f[0]) + int(f[2]):
            return True
    return False


class _UidLease:
    """An unused uid held for the lifetime of one sandbox slot (flock on a per-uid lock file, so two
    trainers on one machine never share a uid: RLIMIT_NPROC and the cleanup `kill(-1)` are per uid)."""

    def __init__(self) -> None:
        lock_dir = Path(tempfile.gettempdir()) / "keelrl-sandbox-uids"
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_RANGE):
            try:
                pwd.getpwuid(uid)
                continue  # a real account: never borrow it
            except KeyError:
                pass
            fd = os.open(lock_dir / str(uid), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise SandboxError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_RANGE - 1} (all locked)")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _bwrap_supports_size() -> bool:
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in out.stdout + out.stderr


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (scan of /proc: /proc/PID/task/*/children needs a kernel option)."""
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if int(data[data.rindex(b")") + 2 :].split()[1]) == pid:
            kids.append(int(name))
    return kids


def _wait_gone(pidfds: list[int], timeout: float) -> bool:
    """Wait until every pidfd reports its process exited; True when all did."""
    deadline = time.monotonic() + timeout
    pending = list(pidfds)
    with selectors.DefaultSelector() as sel:
        for fd in pending:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in sel.select(left):
                sel.unregister(key.fd)
    return True


def _excerpt(data: bytes, limit: int) -> str:
    return data[:limit].decode("utf-8", "replace")


_SIGNAMES = {int(s): s.name for s in signal.Signals}


class Sandbox:
    """One sandbox slot: runs one execution at a time (use `SandboxPool` for many at once).

    isolation: "auto" (strongest available, with a warning when below bwrap) or a level, which must work.
    limits: default limits for `run`. python: interpreter for the code (default: the trainer's own).
    """

    def __init__(
        self,
        isolation: IsolationRequest = "auto",
        limits: SandboxLimits | None = None,
        python: str | None = None,
        *,
        _probing: bool = False,
    ) -> None:
        if isolation not in ("auto", *LEVELS):
            raise SandboxError(f"unknown isolation {isolation!r}; use one of: auto, {', '.join(LEVELS)}")
        self.level: IsolationLevel = isolation if _probing else resolve_isolation(isolation)  # type: ignore[assignment]
        self.limits = limits or SandboxLimits()
        self.python = os.path.realpath(python) if python else _interpreter()
        self._lease: _UidLease | None = None
        self._hidden: str | None = None
        if _is_root():
            self._lease = self._lease_uid()
            if self.level == "rlimit" and self._lease is not None:
                _sweep_uid(self._lease.uid)  # leftovers of a trainer that was killed mid-run
                for stale in Path(tempfile.gettempdir()).glob("keelrl-sandbox-*"):
                    if (
                        stale.is_dir()
                        and stale.name != "keelrl-sandbox-uids"
                        and stale.stat().st_uid == self.uid
                    ):
                        shutil.rmtree(stale, ignore_errors=True)  # its work dir (the uid is ours alone now)
        if self.level != "rlimit" and self._lease is not None:
            self._hidden = _hidden_ancestor(_prefix_of(self.python))
        self._host_pidns = os.readlink("/proc/self/ns/pid")

    def _lease_uid(self) -> _UidLease | None:
        """As root, a separate uid for the code (see the module docstring), or None with a warning."""
        if not _mapped_uid_range(UID_BASE, UID_BASE + UID_RANGE):
            _warn_once(
                "uid-unmapped",
                f"sandbox: uids {UID_BASE}.. are not mapped in this user namespace, so model code runs as root: the "
                "process-count limit is not enforced for root (fork bombs are bounded only by the time limit).",
            )
            return None
        if self.level == "rlimit" and not _world_usable(self.python):
            candidates = ("/usr/bin/python3", "/usr/local/bin/python3")
            fallback = next((p for p in candidates if _world_usable(p)), None)
            if fallback is None:
                _warn_once(
                    "rlimit-root",
                    f"sandbox: {self.python} is not usable by an unprivileged user and no world-readable python3 "
                    "was found, so model code runs AS ROOT with resource limits only: it can write anywhere and "
                    "kill any process. Install bubblewrap (apt-get install bubblewrap).",
                )
                return None
            self.python = os.path.realpath(fallback)
        return _UidLease()

    @property
    def uid(self) -> int | None:
        """The uid the code runs under (None: the trainer's own)."""
        return self._lease.uid if self._lease else None

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- run

    def run(
        self,
        code: str,
        tests: Sequence[str] = (),
        entry_point: str | None = None,
        limits: SandboxLimits | None = None,
    ) -> ExecResult:
        """Execute `code`, then each statement of `tests` in its namespace; never raises on anything the
        code does. When `entry_point` is given, its return values must be built-in data."""
        lim = limits or self.limits
        nonce, exec_id = secrets.token_hex(16), secrets.token_hex(6)
        host_work = tempfile.mkdtemp(prefix="keelrl-sandbox-") if self.level == "rlimit" else None
        work = host_work or "/tmp/work"
        job = {
            "nonce": nonce,
            "level": self.level,
            "uid": self.uid,
            "work": work,
            "host_pidns": self._host_pidns,
            "parent_pid": os.getpid(),
            "hidden": self._hidden,
            "prefix": _prefix_of(self.python),
            "tmp_bytes": lim.tmp_mb << 20,
            "code": code,
            "tests": list(tests),
            "entry_point": entry_point,
            "limits": {
                "cpu_s": lim.cpu_seconds,
                "memory_bytes": lim.memory_mb << 20,
                "processes": lim.processes,
                "file_bytes": lim.file_mb << 20,
            },
        }
        env = {"PATH": _SAFE_PATH, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        r_fd, w_fd = os.pipe()
        job["fd"] = w_fd
        argv = [
            *self._launcher(lim),
            self.python,
            "-I",
            "-S",
            "-B",
            "-c",
            _HARNESS,
            "keelrl-sandbox",
            exec_id,
        ]
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
                "sandbox_error", 0, len(tests), 0.0, self.level, detail=f"cannot start {argv[0]}: {err}"
            )
        os.close(w_fd)
        stopped: str | None = "error"  # until _drive returns
        try:
            res_cap = 600 * (len(job["tests"]) + 8)  # a record is at most ~550 bytes
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
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything left in the launcher's group (not yet reaped)
            except (ProcessLookupError, PermissionError):
                pass
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
                _sweep_uid(self.uid)  # H did not get to clean up
            if host_work:
                shutil.rmtree(host_work, ignore_errors=True)
        wall = time.perf_counter() - t0
        return _interpret(
            nonce, res, out, err, stopped, list(tests), lim, wall, self.level, exec_id, proc.returncode
        )

    def _launcher(self, lim: SandboxLimits) -> list[str]:
        if self.level == "bwrap":
            args = [
                "bwrap",
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
            if not _is_root():
                args.append("--unshare-user")
            args += [
                "--die-with-parent",
                "--new-session",
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
            ]
            if _bwrap_size_ok():
                args += ["--size", str(lim.tmp_mb << 20)]
            args += ["--tmpfs", "/tmp"]
            if self._hidden:
                prefix = _prefix_of(self.python)
                args += ["--perms", "0755", "--tmpfs", self._hidden]
                path = self._hidden
                for part in os.path.relpath(prefix, self._hidden).split("/")[:-1]:
                    path = os.path.join(path, part)
                    args += ["--perms", "0755", "--dir", path]
                args += ["--ro-bind", prefix, prefix]
            return [*args, "--chdir", "/", "--"]
        if self.level == "unshare":
            # setpriv: unshare gets SIGKILL if the trainer dies, and --kill-child passes it to the namespace
            args = [
                *(["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []),
                "unshare",
                "--net",
                "--pid",
                "--ipc",
                "--uts",
                "--fork",
                "--mount-proc",
                "--kill-child=SIGKILL",
            ]
            if not _is_root():
                args.append("--map-root-user")
            return [*args, "--"]
        return []

    def _drive(
        self,
        proc: subprocess.Popen[bytes],
        payload: bytes,
        r_fd: int,
        deadline: float,
        lim: SandboxLimits,
        res_cap: int,
    ) -> tuple[bytes, bytes, bytes, str | None]:
        """Feed the job, collect stdout/stderr heads and the result pipe until all close, the deadline
        passes ("timeout") or the output cap is hit ("output_limit")."""
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
        kids = _children(proc.pid)
        pidfds = []
        for k in kids:
            try:
                pidfds.append(os.pidfd_open(k))
            except OSError:
                continue
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if not _wait_gone(pidfds, 10.0):
            logger.warning("sandbox: processes of a killed execution did not exit within 10 s")
        for fd in pidfds:
            os.close(fd)


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk or sum(map(len, chunks)) > 1 << 20:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _sweep_uid(uid: int) -> None:
    """rlimit level, root: SIGKILL every process of the slot's uid (what escaped the process group by
    `setsid` and outlived H), from a shell that runs as that uid, so nothing else can be hit."""
    try:
        subprocess.run(
            ["/bin/sh", "-c", "i=0; while kill -9 -1 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); done"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={"PATH": _SAFE_PATH},
            cwd="/",
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        logger.warning("sandbox: sweeping uid %d failed: %s", uid, err)


def _interpret(
    nonce: str,
    res: bytes,
    out: bytes,
    err: bytes,
    stopped: str | None,
    tests: list[str],
    lim: SandboxLimits,
    wall: float,
    level: IsolationLevel,
    exec_id: str,
    launcher_rc: int | None,
) -> ExecResult:
    """Turn the nonce'd records into an ExecResult (see the module docstring for the precedence)."""
    tag = nonce + " "
    first: dict[str, str] = {}
    outcome: dict[int, tuple[bool, str]] = {}
    for raw in res.decode("utf-8", "replace").split("\n"):
        if not raw.startswith(tag):
            continue
        kind, _, text = raw[len(tag) :].partition(" ")
        if kind == "test":
            idx, _, rest = text.partition(" ")
            ok, _, error = rest.partition(" ")
            if idx.isdigit() and int(idx) < len(tests) and int(idx) not in outcome:
                outcome[int(idx)] = (ok == "1", error)
        else:
            first.setdefault(kind, text)
    flags = tuple(outcome.get(i, (False, ""))[0] for i in range(len(tests)))
    passed = sum(flags)
    cpu = None
    exit_sig = exit_code = None
    if "exit" in first:
        f = first["exit"].split()
        try:
            if f[0] == "signal":
                exit_sig = int(f[1])
            else:
                exit_code = int(f[1])
            cpu = float(f[3])
        except (IndexError, ValueError):
            pass
    failing = next((i for i in range(len(tests)) if not flags[i]), None)

    def fail_detail() -> str:
        if failing is None:
            return ""
        error = outcome.get(failing, (False, "did not run"))[1] or "failed"
        return f"test {failing} `{tests[failing][:200]}`: {error}"

    status: Status
    if stopped == "timeout":
        status, detail = "timeout", f"wall-clock limit of {lim.wall_s:g} s reached"
    elif stopped == "output_limit":
        status, detail = "output_limit", f"output over {lim.output_bytes} bytes"
    elif "fault" in first:
        status, detail = "sandbox_error", first["fault"]
    elif "start" not in first:
        status = "sandbox_error"
        detail = f"the sandbox did not start (launcher exit {launcher_rc}): {_excerpt(err, 300).strip()}"
    elif "syntax" in first:
        status, detail = "syntax_error", first["syntax"]
    elif "load" in first:
        status = "memory" if first["load"].startswith("MemoryError") else "runtime_error"
        detail = first["load"]
    elif exit_sig is not None:
        name = _SIGNAMES.get(exit_sig, f"signal {exit_sig}")
        if exit_sig == signal.SIGXCPU or (
            exit_sig == signal.SIGKILL and cpu is not None and cpu >= lim.cpu_seconds - 0.05
        ):
            status, detail = "timeout", f"CPU limit of {lim.cpu_seconds} s reached ({name})"
        elif exit_sig == signal.SIGXFSZ:
            status, detail = "output_limit", f"file size limit of {lim.file_mb} MB reached ({name})"
        else:
            status, detail = (
                "crash",
                f"killed by {name}" + (f" after test {len(outcome) - 1}" if outcome else ""),
            )
    elif "exit" not in first:
        status, detail = "crash", "the harness was killed before it reported"
    elif "done" not in first:
        status = "crash"
        detail = f"exited with code {exit_code} before the tests finished ({len(outcome)} of {len(tests)} reported)"
    elif any(e.startswith("MemoryError") for ok, e in outcome.values() if not ok):
        status, detail = "memory", fail_detail()
    elif passed == len(tests):
        status, detail = "ok", ""
    else:
        status, detail = "wrong_answer", fail_detail()
    if status not in ("ok", "wrong_answer") and failing is not None and status != "sandbox_error":
        detail = f"{detail}; first failing: {fail_detail()}" if outcome else detail
    return ExecResult(
        status=status,
        passed=passed,
        total=len(tests),
        wall_s=wall,
        isolation=level,
        cpu_s=cpu,
        stdout=_excerpt(out, lim.excerpt_chars),
        stderr=_excerpt(err, lim.excerpt_chars),
        detail=detail,
        test_passed=flags,
        exec_id=exec_id,
    )


# ---------------------------------------------------------------------------------------- detection

_detect_lock = threading.Lock()
_probe_results: dict[str, str | None] = {}
_warned: set[str] = set()
_bwrap_size: list[bool] = []


def _bwrap_size_ok() -> bool:
    if not _bwrap_size:
        _bwrap_size.append(_bwrap_supports_size())
    return _bwrap_size[0]


def _warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(message)
    warnings.warn(message, SandboxWarning, stacklevel=3)


def probe(level: IsolationLevel) -> str | None:
    """None when `level` works on this machine, else why not. Runs a real sandboxed execution once per
    process and level (cached)."""
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
                    r = box.run("def f(x):\n    return x + 1\n", ["assert f(1) == 2"], "f")
                if r.status != "ok":
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
                    "rlimit": "RESOURCE LIMITS ONLY: model code can use the network and write to world-writable "
                    "directories"
                    + ("" if _is_root() else ", signal your processes and read their environment"),
                }[lv]
                _warn_once(
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


# --------------------------------------------------------------------------------------------- pool


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


@dataclass
class _Work:
    job: Job
    future: Future[ExecResult] = field(default_factory=Future)


class SandboxPool:
    """`workers` sandbox slots, each driven by one thread, fed from a bounded queue (`submit` blocks when
    it is full, so a producer cannot pile up unbounded work). Results come back as futures;
    `run_many` keeps the input order. Each slot leases its own uid when running as root."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        queue_size: int | None = None,
        isolation: IsolationRequest = "auto",
        limits: SandboxLimits | None = None,
        python: str | None = None,
    ) -> None:
        self.workers = workers or default_workers()
        if self.workers < 1:
            raise SandboxError(f"workers must be >= 1 (got {self.workers})")
        self._queue: queue.Queue[_Work | None] = queue.Queue(maxsize=queue_size or 2 * self.workers)
        self._boxes = [Sandbox(isolation, limits, python) for _ in range(self.workers)]
        self.level: IsolationLevel = self._boxes[0].level
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, args=(box,), name=f"keelrl-sandbox-{i}", daemon=True)
            for i, box in enumerate(self._boxes)
        ]
        for t in self._threads:
            t.start()

    def _serve(self, box: Sandbox) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            if not work.future.set_running_or_notify_cancel():
                continue
            try:
                j = work.job
                work.future.set_result(box.run(j.code, j.tests, j.entry_point, j.limits))
            except Exception as err:  # a bug in the sandbox itself: hand it to the caller, keep serving
                work.future.set_exception(err)

    def submit(self, job: Job) -> Future[ExecResult]:
        if self._closed:
            raise SandboxError("this SandboxPool is closed")
        work = _Work(job)
        self._queue.put(work)
        return work.future

    def run_many(self, jobs: Iterable[Job]) -> list[ExecResult]:
        """Run all jobs (up to `workers` at a time) and return their results in order."""
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def run(self, code: str, tests: Sequence[str] = (), entry_point: str | None = None) -> ExecResult:
        return self.submit(Job(code, tests, entry_point)).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        for box in self._boxes:
            box.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "LEVELS",
    "STATUSES",
    "ExecResult",
    "IsolationLevel",
    "Job",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "SandboxWarning",
    "Status",
    "available_levels",
    "default_workers",
    "detect_isolation",
    "probe",
    "resolve_isolation",
]
