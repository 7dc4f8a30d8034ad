"""What goes into one sandboxed execution and what comes out: limits, jobs, results, and the reading of
the harness's nonce'd records into an `ExecResult` (the results channel: see the package docstring)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

IsolationLevel = Literal["bwrap", "unshare", "rlimit"]
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


def _excerpt(data: bytes, limit: int) -> str:
    return data[:limit].decode("utf-8", "replace")


_SIGNAMES = {int(s): s.name for s in signal.Signals}


def interpret(
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
    """Turn the nonce'd records into an ExecResult (see the package docstring for the results channel)."""
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
