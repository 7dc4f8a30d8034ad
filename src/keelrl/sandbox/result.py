"""What goes into one sandboxed execution and what comes out: limits, calls, jobs, answers, results, and
the reading of the harness's nonce'd records into an `ExecResult` (the results channel: see the package
docstring). An execution reports what the code's calls gave, never whether they were right: that is the
judge's (judge.py), outside the sandbox."""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

IsolationLevel = Literal["bwrap", "unshare", "rlimit"]
Status = Literal[
    "ok",  # ran to the end: every call has an answer (a value, an exception, or an invalid value)
    "wrong_answer",  # the judge's verdict (judge.py), never an execution's: some answer is not the expected one
    "syntax_error",  # the solution does not compile
    "runtime_error",  # the solution's top level raised (before any call)
    "timeout",  # wall-clock or CPU limit
    "memory",  # MemoryError (address-space limit)
    "crash",  # killed by a signal (segfault, abort) or exited before the calls finished
    "output_limit",  # stdout + stderr (or a file) over the limit
    "sandbox_error",  # the sandbox itself failed (launcher missing, setup error): not the code's fault
]
LEVELS: tuple[IsolationLevel, ...] = ("bwrap", "unshare", "rlimit")
STATUSES: tuple[str, ...] = Status.__args__  # type: ignore[attr-defined]


class SandboxError(RuntimeError):
    """The sandbox cannot run here as configured (e.g. an isolation level that is not available)."""


class SandboxWarning(RuntimeWarning):
    """The sandbox runs with weaker isolation than the strongest level keelrl supports."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-execution limits. `cpu_s` defaults to `wall_s`; the memory limit is the address space of each
    process, so the aggregate is at most `processes x memory_mb`. `answer_bytes` bounds the JSON of all
    the answers of one execution together (a bigger answer is `invalid`)."""

    wall_s: float = 5.0
    cpu_s: float | None = None
    memory_mb: int = 512
    processes: int = 8
    output_bytes: int = 256_000
    file_mb: int = 16
    tmp_mb: int = 64
    excerpt_chars: int = 2000
    answer_bytes: int = 4_000_000

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
        for name in ("processes", "output_bytes", "file_mb", "tmp_mb", "excerpt_chars", "answer_bytes"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if problems:
            raise ValueError("bad sandbox limits: " + "; ".join(problems))

    @property
    def cpu_seconds(self) -> int:
        """RLIMIT_CPU takes whole seconds."""
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.wall_s))


@dataclass(frozen=True)
class Call:
    """One call of the entry point: `args` is Python source of its arguments as written between the
    parentheses (`"[3, 1], key=2"`), evaluated inside the sandbox (inputs are not secret). With
    `show_args`, the arguments as they are after the call are reported too (functions that must not, or
    must, change their input)."""

    args: str
    show_args: bool = False


@dataclass(frozen=True)
class Answer:
    """What one call gave. kind `value`: `text` is the return value as JSON; `raised`: `text` is
    "Name: message" and `raised` the built-in exception classes it is an instance of, most specific
    first (the text names the class raised, which may be the code's own); `invalid`: the return value is not JSON data (or over `answer_bytes`), `text` says why.
    `args_after`: JSON of the arguments after the call, when the call asked for it."""

    kind: Literal["value", "raised", "invalid"]
    text: str
    raised: tuple[str, ...] = ()
    args_after: str | None = None


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed execution did. `answers[i]` is call i's (None when it never reported);
    `total` is the number of calls. `detail` is a one-line human explanation of `status`."""

    status: Status
    total: int
    wall_s: float
    isolation: IsolationLevel
    cpu_s: float | None = None
    stdout: str = ""
    stderr: str = ""
    detail: str = ""
    answers: tuple[Answer | None, ...] = ()
    exec_id: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Job:
    """One execution for `SandboxPool`: the solution source, the function to call, the calls (a plain
    string is `Call(args)`), optional limits."""

    code: str
    entry_point: str | None = None
    calls: Sequence[Call | str] = ()
    limits: SandboxLimits | None = None


def as_calls(calls: Sequence[Call | str]) -> list[Call]:
    return [Call(c) if isinstance(c, str) else c for c in calls]


def _excerpt(data: bytes, limit: int) -> str:
    return data[:limit].decode("utf-8", "replace")


_SIGNAMES = {int(s): s.name for s in signal.Signals}


def _records(nonce: str, res: bytes, n: int) -> tuple[dict[str, str], dict[int, Answer]]:
    """The lines that carry the nonce -> the first text of each kind of record (start, fault, exit, done...),
    and from `answer <i> <kind> <payload>` and `args <i> <json>` records the first answer per call index."""
    tag = nonce + " "
    first: dict[str, str] = {}
    answers: dict[int, Answer] = {}
    args_after: dict[int, str] = {}
    for raw in res.decode("utf-8", "replace").split("\n"):
        if not raw.startswith(tag):
            continue
        kind, _, text = raw[len(tag) :].partition(" ")
        if kind not in ("answer", "args"):
            first.setdefault(kind, text)
            continue
        idx, _, rest = text.partition(" ")
        if not (idx.isdigit() and int(idx) < n):
            continue
        i = int(idx)
        if kind == "args":
            args_after.setdefault(i, rest)
            continue
        how, _, payload = rest.partition(" ")
        if i in answers or how not in ("value", "raised", "invalid"):
            continue
        if how == "raised":
            names, _, message = payload.partition(" ")
            classes = tuple(names.split(","))
            answers[i] = Answer("raised", message or classes[0], classes)
        else:
            answers[i] = Answer(how, payload)  # type: ignore[arg-type]
    return first, {i: replace(a, args_after=args_after.get(i)) for i, a in answers.items()}


def interpret(
    nonce: str,
    res: bytes,
    out: bytes,
    err: bytes,
    stopped: str | None,
    calls: int,
    lim: SandboxLimits,
    wall: float,
    level: IsolationLevel,
    exec_id: str,
    launcher_rc: int | None,
) -> ExecResult:
    """Turn the nonce'd records into an ExecResult (see the package docstring for the results channel)."""
    first, found = _records(nonce, res, calls)
    answers = tuple(found.get(i) for i in range(calls))
    cpu = None
    exit_sig = exit_code = None
    if "exit" in first:
        f = first["exit"].split()
        with contextlib.suppress(IndexError, ValueError):
            if f[0] == "signal":
                exit_sig = int(f[1])
            else:
                exit_code = int(f[1])
            cpu = float(f[3])
    memory = next((a.text for a in answers if a and "MemoryError" in a.raised), None)
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
            status, detail = "crash", f"killed by {name} after {len(found)} of {calls} calls"
    elif "exit" not in first:
        status, detail = "crash", "the harness was killed before it reported"
    elif "done" not in first:
        status = "crash"
        detail = f"exited with code {exit_code} before the calls finished ({len(found)} of {calls} answered)"
    elif memory is not None:
        status, detail = "memory", memory
    else:
        status, detail = "ok", ""
    return ExecResult(
        status=status,
        total=calls,
        wall_s=wall,
        isolation=level,
        cpu_s=cpu,
        stdout=_excerpt(out, lim.excerpt_chars),
        stderr=_excerpt(err, lim.excerpt_chars),
        detail=detail,
        answers=answers,
        exec_id=exec_id,
    )
