"""The isolation levels (bwrap > unshare > rlimit): how each launches the harness, which work on this
machine (`probe`, `detect_isolation`), and the host-side pieces they need (interpreter, uid leases)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from keelrl.sandbox.result import IsolationLevel, SandboxError, SandboxLimits, SandboxWarning

IsolationRequest = Literal["auto", "bwrap", "unshare", "rlimit"]
UID_BASE = 61000  # first uid leased to sandbox slots when running as root
UID_RANGE = 4000
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# The host paths the sandbox's root holds at the bwrap and unshare levels (read-only, with the
# interpreter's prefix, a minimal /dev, a private /proc and /tmp): the system's programs and libraries,
# and /etc (ld.so.cache, passwd). Nothing else of the host is there (not /tmp, /run, /var, /home, /root,
# the trainer's checkout or run directory), so no host Unix socket, data file or checkpoint can be reached.
ROOT_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

logger = logging.getLogger("keelrl.sandbox")


def interpreter() -> str:
    """The trainer's own base interpreter (not the venv shim): the sandbox runs with -I -S, stdlib only."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def prefix_of(python: str) -> str:
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
        return _hidden_ancestor(prefix_of(real)) is None and bool(os.stat(real).st_mode & stat.S_IXOTH)
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
    rows = (line.split() for line in lines)  # inside-uid, outside-uid, count
    return any(len(f) == 3 and int(f[0]) <= lo and hi < int(f[0]) + int(f[2]) for f in rows)


class _UidLease:
    """An unused uid held for the lifetime of one sandbox slot (flock on a per-uid lock file, so two
    trainers on one machine never share a uid: RLIMIT_NPROC and the cleanup `kill(-1)` are per uid)."""

    def __init__(self) -> None:
        lock_dir = Path(tempfile.gettempdir()) / "keelrl-sandbox-uids"
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_RANGE):
            with contextlib.suppress(KeyError):
                pwd.getpwuid(uid)
                continue  # a real account: never borrow it
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


@functools.cache
def _bwrap_supports_size() -> bool:
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in out.stdout + out.stderr


def sweep_uid(uid: int, wait_s: float = 10.0) -> None:
    """rlimit level, root: SIGKILL every process of the slot's uid (`setsid` escapees) as that uid only, and wait
    until they are gone: a killed process still waiting for a core lives on for a moment (so does a fork made
    between two rounds), and the caller must not hand the slot on before."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            subprocess.run(
                ["/bin/sh", "-c", "i=0; while kill -9 -1 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); done"],
                user=uid,
                group=uid,
                extra_groups=[],
                env={"PATH": SAFE_PATH},
                cwd="/",
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            logger.warning("sandbox: sweeping uid %d failed: %s", uid, err)
            return
        left = live_processes(uid)
        if not left:
            return
        if time.monotonic() > deadline:
            logger.warning("sandbox: processes of uid %d outlived %.0f s of SIGKILL: %s", uid, wait_s, left)
            return
        time.sleep(0.02)


def live_processes(uid: int) -> list[int]:
    """The pids of `uid`'s processes that have not exited (a zombie has: it only waits to be reaped)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # exited while we read
            continue
        if str(uid) in fields.get("Uid", "").split() and fields.get("State", "Z")[0] not in "ZX":
            pids.append(int(status.parent.name))
    return pids


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def root_layout(python: str) -> list[tuple[str, str | None]]:
    """The sandbox root's host paths: (path, None) for a read-only bind, (path, target) for a symlink
    (merged /usr: /lib -> usr/lib): ROOT_PATHS that exist, and the interpreter's prefix."""
    layout: list[tuple[str, str | None]] = []
    for path in ROOT_PATHS:
        if os.path.islink(path):
            layout.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            layout.append((path, None))
    prefix = prefix_of(python)
    if not any(_inside(prefix, p) for p, link in layout if link is None):
        layout.append((prefix, None))
    return layout


def hidden_in(layout: list[tuple[str, str | None]], hide: Sequence[str]) -> list[str]:
    """The paths of `hide` (resolved) that the layout would show: they are covered (a file by /dev/null,
    a directory by an empty tmpfs)."""
    binds = [p for p, link in layout if link is None]
    real = (os.path.realpath(h) for h in hide)
    return [h for h in real if any(_inside(h, b) for b in binds)]


def _bwrap(lim: SandboxLimits, python: str, hide: Sequence[str]) -> list[str]:
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    namespaces += [] if _is_root() else ["--unshare-user"]
    return [*bwrap_command(python, hide, namespaces, lim.tmp_mb << 20), "--chdir", "/", "--"]


def bwrap_command(
    python: str, hide: Sequence[str], flags: Sequence[str], tmp_bytes: int | None = None
) -> list[str]:
    """`bwrap` with `flags` (its namespaces), dying with its parent, in a new session, over the sandbox's root
    (`root_layout`, read-only; a minimal /dev, a private /proc, a tmpfs on /tmp of `tmp_bytes` where bwrap can
    size it) with the paths of `hide` covered; shared by the code sandbox and the episode boxes (sandbox/boxes.py)."""
    args = ["bwrap", *flags, "--die-with-parent", "--new-session"]
    layout = root_layout(python)
    for path, link in layout:
        for parent in reversed(Path(path).parents[:-1]):  # traversable by the sandbox uid (not /root's 0700)
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--symlink", link, path] if link is not None else ["--ro-bind", path, path]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for path in hidden_in(layout, hide):
        empty_dir = ["--tmpfs", path, "--remount-ro", path]
        args += empty_dir if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
    if tmp_bytes is not None and _bwrap_supports_size():
        args += ["--size", str(tmp_bytes)]
    return [*args, "--tmpfs", "/tmp"]


def _unshare(lim: SandboxLimits, python: str, hide: Sequence[str]) -> list[str]:
    # setpriv: unshare gets SIGKILL if the trainer dies, and --kill-child passes it to the namespace.
    # The root (root_layout) is built by the harness itself (harness._private_root).
    setpriv = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
    flags = ["--net", "--pid", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child=SIGKILL"]
    return [*setpriv, "unshare", *flags, *([] if _is_root() else ["--map-root-user"]), "--"]


# The command that starts the harness at each level (it is followed by `python -I -S -B -c <harness>`).
LAUNCHERS: dict[str, Callable[[SandboxLimits, str, Sequence[str]], list[str]]] = {
    "bwrap": _bwrap,
    "unshare": _unshare,
    "rlimit": lambda lim, python, hide: [],
}


def lease_slot(level: IsolationLevel, python: str) -> tuple[_UidLease | None, str]:
    """As root, a separate uid for the code (see the package docstring) and the interpreter to run it
    with. Without a usable uid: no lease, with a warning."""
    if not _is_root():
        return None, python
    if not _mapped_uid_range(UID_BASE, UID_BASE + UID_RANGE):
        warn_once(
            "uid-unmapped",
            f"sandbox: uids {UID_BASE}.. are not mapped in this user namespace, so model code runs as root: the "
            "process-count limit is not enforced for root (fork bombs are bounded only by the time limit).",
        )
        return None, python
    if level == "rlimit" and not _world_usable(python):
        candidates = ("/usr/bin/python3", "/usr/local/bin/python3")
        fallback = next((p for p in candidates if _world_usable(p)), None)
        if fallback is None:
            warn_once(
                "rlimit-root",
                f"sandbox: {python} is not usable by an unprivileged user and no world-readable python3 "
                "was found, so model code runs AS ROOT with resource limits only: it can write anywhere and "
                "kill any process. Install bubblewrap (apt-get install bubblewrap).",
            )
            return None, python
        python = os.path.realpath(fallback)
    lease = _UidLease()
    if level != "rlimit":
        return lease, python
    sweep_uid(lease.uid)  # leftovers of a trainer that was killed mid-run
    for stale in Path(tempfile.gettempdir()).glob("keelrl-sandbox-*"):
        if stale.is_dir() and stale.name != "keelrl-sandbox-uids" and stale.stat().st_uid == lease.uid:
            shutil.rmtree(stale, ignore_errors=True)  # its work dir (the uid is ours alone now)
    return lease, python


_warned: set[str] = set()


def warn_once(key: str, message: str, loud: bool = True) -> None:
    """Log `message` once per process (`loud`: also as a SandboxWarning, which test runs and notebooks show)."""
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(message)
    if loud:
        warnings.warn(message, SandboxWarning, stacklevel=3)
