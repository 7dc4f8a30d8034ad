"""An episode's private working copy of a repository, the tools that edit it, and running it in the sandbox.

A `Workspace` is a repository as an in-memory dict, path -> text. The model changes it only through the
tools (`workspace_tools`: list_files, read_file, replace_in_file, write_file, run_tests), each of which
returns a string for the model or raises a ValueError saying what is wrong (`run_tool_calls` turns that
into an error message counted in `tool_errors`). The host filesystem is never written: the copy exists on
disk only inside a sandboxed execution, in the sandbox's private tmpfs, for the length of that execution.

Paths are relative POSIX paths, normalised (`./a//b` is `a/b`), of at most `MAX_PATH_CHARS` characters and
`MAX_DEPTH` components of letters, digits, `_`, `-` and `.`. Refused: absolute paths, `..`, a component
starting with "." (hidden files: `.git`, `.env`), a write under a `readonly` prefix given to the Workspace,
a file where a directory is (or the reverse), a file over `max_file_bytes` (UTF-8), more than `max_files`
files, or more than `max_total_bytes` in all.

Running code (`sandbox_job`): the job's code first writes the files under `<the sandbox's work
directory>/repo` (the harness's cwd, a private tmpfs under bwrap / unshare), puts that directory first on
`sys.path` and changes into it, then runs `program`, which defines the entry point. Two programs ship:
- `CALL_PROGRAM`, entry `CALL_ENTRY`: `_keel_call("pkg.mod", "fn", *args)` imports a module of the working
  copy and returns what its function returns. A hidden test is a judge case whose `args` start with the
  module and function names (`{"args": "'pkg.mod', 'fn', 3, 4", "expected": 7}`); the judge
  (keelrl.sandbox.judge) compares the answers with the expected values in the trainer's process. No test
  file and no test runner of the working copy takes part, so editing, deleting or skipping tests, exiting
  (`sys.exit`, `os._exit`), patching builtins or a runner, `conftest.py` / `sitecustomize.py` (the
  interpreter runs with -I -S) and printing "OK" can at most choose the answers, which is what a fix does.
- `TEST_PROGRAM`, entry `TEST_ENTRY`: the visible tests of the working copy (`run_visible_tests`): functions
  named `test_*` at the top level of files named `test_*.py`, found here by parsing the files, each run as
  one call (an exception is a failure; `assert` messages are shown). No pytest: no fixtures, no
  parametrisation, no assertion rewriting. This is feedback for the model, never a reward: the model owns
  those files and that process.

Not defended: code that recognises the hidden inputs and returns memorised outputs (it would need to
know them: they are not in the working copy), and a working copy that is a correct rewrite of the code
rather than a minimal fix (it is a fix).
"""

from __future__ import annotations

import ast
import json
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from keelrl.sandbox.pool import SandboxPool
from keelrl.sandbox.result import Call, ExecResult, Job, SandboxLimits
from keelrl.tasks.tools import CLOSE_TAG, OPEN_TAG, Tool, tool

MAX_PATH_CHARS = 200
MAX_DEPTH = 8
MAX_TESTS = 200  # visible tests run per run_tests call
REPORT_FAILURES = 12  # failing tests listed in full by run_tests
REPORT_LINE_CHARS = 300
_COMPONENT_RE = re.compile(r"[A-Za-z0-9_.-]+")


class Workspace:
    """A repository's working copy, path -> text, with the checks of the module docstring."""

    def __init__(
        self,
        files: Mapping[str, str],
        *,
        readonly: Sequence[str] = (),
        max_file_bytes: int = 100_000,
        max_files: int = 200,
        max_total_bytes: int = 1_000_000,
    ) -> None:
        # a prefix read as a path is: "./tests/" is tests
        self.readonly = tuple(posixpath.normpath(p.strip()).strip("/") for p in readonly)
        self.max_file_bytes, self.max_files, self.max_total_bytes = max_file_bytes, max_files, max_total_bytes
        self.files: dict[str, str] = {}
        for path, text in files.items():
            self._put(self.normalise(path), text)
        self.edits = 0  # successful replace_in_file / write_file calls

    # ------------------------------------------------------------------------------------------ paths

    def normalise(self, path: object) -> str:
        """`path` as a clean relative path; ValueError naming the problem otherwise."""
        if not isinstance(path, str) or not path.strip():
            raise ValueError(
                "a path is a non-empty string, relative to the repository root, like 'pkg/mod.py'"
            )
        p = path.strip()
        if p.startswith("/") or p.startswith("~") or re.match(r"[A-Za-z]:", p):
            raise ValueError(f"{p!r} is absolute: give a path relative to the repository root")
        if "\\" in p:
            raise ValueError(f"{p!r}: use '/' to separate directories")
        if ".." in p.split("/"):
            raise ValueError(f"{p!r} leaves the repository ('..' is not allowed)")
        p = posixpath.normpath(p)
        parts = p.split("/")
        if p == "." or not parts:
            raise ValueError("give a file's path, not the repository root")
        if len(p) > MAX_PATH_CHARS or len(parts) > MAX_DEPTH:
            raise ValueError(
                f"{p[:80]!r}: paths are at most {MAX_PATH_CHARS} characters and {MAX_DEPTH} levels"
            )
        for part in parts:
            if part.startswith("."):
                raise ValueError(f"{p!r}: hidden files and directories (starting with '.') are not available")
            if not _COMPONENT_RE.fullmatch(part):
                raise ValueError(f"{p!r}: path components may hold only letters, digits, '_', '-' and '.'")
        return p

    def _writable(self, path: object) -> str:
        p = self.normalise(path)
        for prefix in self.readonly:
            if p == prefix or p.startswith(prefix + "/"):
                raise ValueError(f"{p!r} is read-only ({prefix} cannot be changed)")
        return p

    def _existing(self, path: object) -> str:
        p = self.normalise(path)
        if p not in self.files:
            near = [f for f in self.files if posixpath.basename(f) == posixpath.basename(p)]
            hint = f"; did you mean {near[0]!r}?" if near else "; list_files shows the files"
            raise ValueError(f"no file {p!r}{hint}")
        return p

    def _put(self, p: str, text: object) -> None:
        if not isinstance(text, str):
            raise ValueError(f"the content of {p!r} must be a string, got {type(text).__name__}")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"the content of {p!r} is not valid Unicode text (a lone surrogate)") from None
        if size > self.max_file_bytes:
            raise ValueError(f"{p!r} would be {size} bytes; files are at most {self.max_file_bytes} bytes")
        if p not in self.files:
            if len(self.files) >= self.max_files:
                raise ValueError(f"the repository already has {len(self.files)} files (the most allowed)")
            for other in self.files:
                if other.startswith(p + "/"):
                    raise ValueError(f"{p!r} is a directory")
                if p.startswith(other + "/"):
                    raise ValueError(f"{other!r} is a file, so {p!r} cannot be created under it")
        others = sum(len(t.encode("utf-8")) for q, t in self.files.items() if q != p)
        if others + size > self.max_total_bytes:
            raise ValueError(f"the repository would exceed {self.max_total_bytes} bytes in all")
        self.files[p] = text

    # ------------------------------------------------------------------------------------------ tools

    def list_files(self) -> str:
        """Every file, one per line, sorted, with its number of lines."""
        if not self.files:
            return "(the repository is empty)"
        return "\n".join(f"{p} ({len(t.splitlines())} lines)" for p, t in sorted(self.files.items()))

    def read_file(self, path: str) -> str:
        """The file's exact text (no line numbers, so it can be copied into replace_in_file)."""
        return self.files[self._existing(path)] or "(empty file)"

    def replace_in_file(self, path: str, old: str, new: str) -> str:
        """Replace the one occurrence of `old` in the file by `new`."""
        p = self._existing(path)
        self._writable(p)
        self._put(p, replace_once(self.files[p], old, new, p))
        self.edits += 1
        return f"replaced {len(old.splitlines()) or 1} line(s) with {len(new.splitlines())} in {p}"

    def write_file(self, path: str, content: str) -> str:
        """Create the file, or replace its whole text."""
        p = self._writable(path)
        existed = p in self.files
        self._put(p, content)
        self.edits += 1
        return f"{'overwrote' if existed else 'created'} {p} ({len(content.splitlines())} lines)"


def replace_once(text: str, old: str, new: str, where: str) -> str:
    """`text` with the one occurrence of `old` replaced by `new`; a ValueError saying what is wrong otherwise (shared
    by the Workspace's and the terminal tasks' replace_in_file)."""
    if not isinstance(old, str) or not isinstance(new, str):
        raise ValueError("old and new must be strings")
    if not old:
        raise ValueError("old is empty: give the exact text to replace (write_file replaces a whole file)")
    count = text.count(old)
    if count == 0:
        stripped = old.strip()
        hint = (
            " (it does occur without its leading / trailing whitespace: copy the text exactly)"
            if stripped and stripped in text
            else ""
        )
        raise ValueError(f"old does not occur in {where}{hint}; read_file shows the exact text")
    if count > 1:
        raise ValueError(
            f"old occurs {count} times in {where}; include more surrounding text so it occurs once"
        )
    return text.replace(old, new, 1)


def workspace_tools(ws: Workspace | None, run_tests: Callable[[], str] | None) -> list[Tool]:
    """The five tools bound to `ws` and `run_tests`; with None, placeholders that only carry the schema
    (an environment's `tools` attribute) and raise when called."""

    def need() -> Workspace:
        if ws is None:
            raise ValueError("no working copy is bound to this tool")
        return ws

    def list_files() -> str:
        """List the repository's files (one per line, with their number of lines)."""
        return need().list_files()

    def read_file(path: str) -> str:
        """Show a file's exact text (no line numbers). path: relative to the repository root, e.g. 'pkg/mod.py'."""
        return need().read_file(path)

    def replace_in_file(path: str, old: str, new: str) -> str:
        """Edit a file: replace the text `old`, which must occur exactly once in the file, by `new`.

        Copy `old` exactly from read_file, with enough surrounding lines to make it unique."""
        return need().replace_in_file(path, old, new)

    def write_file(path: str, content: str) -> str:
        """Create a file, or replace a file's whole text, with `content`."""
        return need().write_file(path, content)

    def run_tests_() -> str:
        """Run the repository's tests and show which fail, with their messages."""
        if run_tests is None:
            raise ValueError("running the tests is not available here")
        return run_tests()

    fns = (list_files, read_file, replace_in_file, write_file)
    return [*(tool(f) for f in fns), tool(run_tests_, name="run_tests")]


# ------------------------------------------------------------------------------------------ sandbox

_MATERIALISE = """\
def _keel_materialise(files):
    import os, sys
    root = os.path.join(os.getcwd(), "repo")
    for path, text in files.items():
        full = os.path.join(root, *path.split("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    sys.path.insert(0, root)
    os.chdir(root)


_keel_materialise(%s)
del _keel_materialise
"""

CALL_ENTRY = "_keel_call"
CALL_PROGRAM = f"""
def {CALL_ENTRY}(_module, _function, /, *args, **kwargs):
    import importlib
    return getattr(importlib.import_module(_module), _function)(*args, **kwargs)
"""

TEST_ENTRY = "_keel_test"
TEST_PROGRAM = f"""
def {TEST_ENTRY}(_module, _function):
    import importlib
    getattr(importlib.import_module(_module), _function)()
"""


def sandbox_job(
    files: Mapping[str, str],
    program: str,
    entry_point: str | None,
    calls: Sequence[Call | str],
    limits: SandboxLimits | None = None,
) -> Job:
    """A Job whose code materialises `files` in the sandbox's work directory (`<cwd>/repo`, first on
    sys.path, the cwd), then runs `program`, which defines `entry_point`."""
    return Job(_MATERIALISE % repr(dict(files)) + program, entry_point, list(calls), limits)


def call_case_args(module: str, function: str, args: str) -> str:
    """A hidden case's `args`: `CALL_PROGRAM`'s entry point calls `module.function(args)`."""
    return f"{module!r}, {function!r}" + (f", {args}" if args.strip() else "")


@dataclass(frozen=True)
class TestRef:
    path: str  # tests/test_mod.py
    module: str  # tests.test_mod
    name: str  # test_something

    @property
    def label(self) -> str:
        return f"{self.path}::{self.name}"


def discover_tests(files: Mapping[str, str]) -> tuple[list[TestRef], list[str]]:
    """The visible tests (top-level `def test_*()` in files named test_*.py) and the files that could not
    be read as Python (`path: error`), by parsing here: nothing of the working copy runs."""
    tests: list[TestRef] = []
    errors: list[str] = []
    for path in sorted(files):
        base = posixpath.basename(path)
        if not (base.startswith("test_") and base.endswith(".py")):
            continue
        module = path[:-3].replace("/", ".")
        if not all(part.isidentifier() for part in module.split(".")):
            errors.append(f"{path}: cannot be imported (its path is not a dotted module name)")
            continue
        try:
            tree = ast.parse(files[path], filename=path)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:  # the parser's limits too
            line = getattr(err, "lineno", None)
            errors.append(
                f"{path}: {type(err).__name__}: {getattr(err, 'msg', err)}"
                + (f" (line {line})" if line else "")
            )
            continue
        names: dict[str, None] = {}  # in order, once each (a later definition replaces an earlier one)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                a = node.args
                required = len(a.posonlyargs) + len(a.args) - len(a.defaults) + a.kw_defaults.count(None)
                if required == 0:
                    names[node.name] = None
        tests += [TestRef(path, module, name) for name in names]
    return tests, errors


def visible_tests_job(
    files: Mapping[str, str], limits: SandboxLimits | None = None
) -> tuple[Job, list[TestRef], list[str]]:
    tests, errors = discover_tests(files)
    tests = tests[:MAX_TESTS]
    calls = [f"{t.module!r}, {t.name!r}" for t in tests]
    return sandbox_job(files, TEST_PROGRAM, TEST_ENTRY, calls, limits), tests, errors


def _line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REPORT_LINE_CHARS else text[: REPORT_LINE_CHARS - 3] + "..."


def format_test_report(tests: Sequence[TestRef], errors: Sequence[str], result: ExecResult | None) -> str:
    """run_tests's reply: failures first (with their messages), then the counts; bounded in length."""
    if not tests and not errors:
        return "no tests found (tests are functions named test_* in files named test_*.py)"
    lines: list[str] = []
    if result is not None and result.status != "ok":
        lines.append(f"the test run did not finish: {result.status} ({_line(result.detail)})")
    failed = [f"ERROR {_line(e)}" for e in errors]
    passed = 0
    for i, t in enumerate(tests):
        answer = result.answers[i] if result is not None and i < len(result.answers) else None
        if answer is None:
            failed.append(f"NO RESULT {t.label}")
        elif answer.kind == "raised":
            failed.append(f"FAILED {t.label} - {_line(answer.text)}")
        else:
            passed += 1
    lines += failed[:REPORT_FAILURES]
    if len(failed) > REPORT_FAILURES:
        lines.append(f"... and {len(failed) - REPORT_FAILURES} more failures")
    lines.append(f"{passed} passed, {len(failed)} failed" if failed else f"all {passed} tests passed")
    out = result.stdout.strip() if result is not None else ""
    if out:
        lines.append("captured output (not test results):\n" + out[:500] + ("..." if len(out) > 500 else ""))
    return "\n".join(lines)


def run_visible_tests(
    files: Mapping[str, str], pool: SandboxPool, limits: SandboxLimits | None = None
) -> str:
    """Run the working copy's visible tests in one sandboxed execution; the report for the model."""
    job, tests, errors = visible_tests_job(files, limits)
    result = pool.submit(job).result() if tests else None
    return format_test_report(tests, errors, result)


def _shared_prefix(x: Sequence[str], y: Sequence[str]) -> int:
    """How many items x and y share at their start."""
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))


def minimal_edit(path: str, before: str, after: str) -> dict[str, str]:
    """A replace_in_file edit turning `before` into `after`: the lines that differ with a line of context
    each side, widened until `old` occurs once in `before` ({"path", "old", "new"})."""
    b, a = before.splitlines(keepends=True), after.splitlines(keepends=True)
    pre = _shared_prefix(b, a)
    post = _shared_prefix(b[pre:][::-1], a[pre:][::-1])
    for ctx in range(1, max(len(b), len(a)) + 1):
        lo = max(0, pre - ctx)
        old = "".join(b[lo : len(b) - max(0, post - ctx)])
        if old and before.count(old) == 1:
            return {"path": path, "old": old, "new": "".join(a[lo : len(a) - max(0, post - ctx)])}
    return {"path": path, "old": before, "new": after}


def tool_call_text(name: str, **arguments: object) -> str:
    """A call as a model writes it in the JSON format (keelrl.tasks.tools), for scripted policies."""
    return OPEN_TAG + json.dumps({"name": name, "arguments": arguments}) + CLOSE_TAG
