"""Process helpers the supervisor and the sampling engines share: a child that dies with its parent, and the
tail of a child's log for an error message."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def die_with_parent() -> None:
    """Called in a child process (the worker before exec, the vLLM engine at start): on Linux, the kernel
    SIGKILLs it when its parent dies, also by SIGKILL (no orphan)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log file (its last 16 kB read), or "" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16_000))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
