"""Programming: write a Python function from a specification; hidden unit tests decide.

Problem: `{"id": str, "prompt": str, "entry_point": str, "tests": [case, ...]}` plus optional
`"difficulty"` (a bucket name, e.g. easy / medium / hard) and `"reference"` (a known-correct solution).
A test is a case, `{"args": "2, 3", "expected": 5}` or `{"args": "'a', 'ab'", "raises": "ValueError"}`
(fields: keelrl.sandbox.judge): the sandbox calls the entry point on the arguments and reports what it
returned, and the judge compares that with `expected` in this process, so the solution can neither see
nor influence the answer key. A test may also be written `assert f(ARGS) == LITERAL` (or `is None /
True / False`); it is turned into the case it means when the file is loaded. Other statements are
refused: run in the solution's process they could be fooled (`ValueError = AssertionError`).
The shipped set (`keelrl/data/code_problems.jsonl`) was written for keelrl: 73 problems, 24 easy, 27
medium, 22 hard, each with 4-7 cases and a reference solution that the test suite checks passes. Users
can give their own JSONL file (`problems_file`); it is validated up front, and every error names the
line and the field. The file itself is hidden from the sandbox (bwrap, unshare).

Splits: `in_test_split(id, seed, test_fraction)` (a hash of the id), so train and test never share a problem
and adding problems does not move the others. `problem(split, i)` walks a seeded permutation, a new one each
pass.

Answer: the last complete fenced code block of the completion tagged python / py / python3 or untagged
(a closing fence alone on its line is required; blocks tagged as another language, e.g. example output,
are skipped; see `extract_code`).
Reward: 1.0 when every case passes; 0.1 for a code block that fails (does not compile, raises, is
wrong, times out...); 0.0 without a code block. With `partial_credit`, a failing block earns
0.1 + 0.9 x passed / total instead (always < 1.0, so only a full pass reaches 1.0). `Score.correct` is
True only when all cases pass; `info["reason"]` is the judge's verdict (`ok`, `wrong_answer`) or the sandbox
status (`timeout`, `memory`, `crash`, `syntax_error`, `runtime_error`, `output_limit`), or `no_code` /
`too_long`.

Execution: `keelrl.sandbox` (isolation levels, chosen by `[sandbox] isolation`, and what is defended: its
docstring). `score_many` runs a batch on a process-wide `SandboxPool`, which is what a trainer should call. If the sandbox itself keeps
failing (`sandbox_error` many times in a row), scoring raises instead of training on meaningless rewards.
"""

from __future__ import annotations

import ast
import builtins
import json
import logging
import re
import textwrap
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field

from keelrl.sandbox.config import SandboxConfig, sandbox_of
from keelrl.sandbox.judge import CASE_FIELDS, VIEWS, Case, calls_of, judge
from keelrl.sandbox.pool import SandboxPool
from keelrl.sandbox.result import ExecResult, Job, SandboxError, SandboxLimits
from keelrl.tasks import TaskError
from keelrl.tasks.base import (
    THINK_PREFIX,
    Prompt,
    Score,
    Split,
    TaskParams,
    Template,
    check_bucket,
    in_test_split,
    shuffled_pick,
)

logger = logging.getLogger("keelrl.tasks.code")

SYSTEM_CODE_BASE = (
    "A conversation between User and Assistant. The user asks for a Python function, and the Assistant writes "
    "it. The assistant first thinks about the problem in the mind and then gives the complete solution."
)
SYSTEM_CODE_CHAT = (
    "You are a careful Python programmer. You first think about the problem and then give the complete "
    "solution in one fenced Python code block."
)
USER_SUFFIX = (
    "\n\nShow your reasoning in <think> </think> tags, then give the complete function in a single ```python "
    "code block. Use only the Python standard library, and do not read input or print."
)
PYTHON_TAGS = ("python", "py", "python3", "")
MAX_CONSECUTIVE_SANDBOX_ERRORS = 20
REQUIRED_FIELDS = {"id": str, "prompt": str, "entry_point": str, "tests": list}
OPTIONAL_FIELDS = {"difficulty": str, "reference": str}


def shipped_problems_path() -> Path:
    return Path(str(resources.files("keelrl") / "data" / "code_problems.jsonl"))


class CodeParams(TaskParams):
    problems_file: str | None = Field(
        None,
        description="JSONL file of problems ({id, prompt, entry_point, tests, [difficulty], [reference]} per line; "
        "a test is {args, expected} or {args, raises}, see the task's docs); default: the shipped set of 73 problems.",
    )
    test_fraction: float = Field(
        0.25,
        gt=0.0,
        lt=1.0,
        description="Share of problems held out for the test split (chosen by a hash of the id).",
    )
    partial_credit: bool = Field(
        False,
        description="Reward a failing solution 0.1 + 0.9 x passed/total instead of a flat 0.1 (never 1.0).",
    )
    timeout_s: float = Field(
        5.0, gt=0.0, le=600.0, description="Wall-clock limit per execution (seconds); CPU limit too."
    )
    memory_mb: int = Field(
        512, ge=64, le=1 << 20, description="Address-space limit per process of an execution (MB)."
    )
    max_processes: int = Field(
        8, ge=1, le=4096, description="Processes and threads an execution may have (fork bombs)."
    )
    max_code_chars: int = Field(
        20_000, ge=1, description="Longer code blocks are not run (reason too_long, reward 0.1)."
    )
    workers: int = Field(0, ge=0, description="Sandboxes score_many runs at once; 0 means one per CPU.")


def _field_error(where: str, field: str, message: str) -> TaskError:
    return TaskError(f"{where}: field `{field}`: {message}")


def _syntax_error(source: str, field: str, mode: str = "exec") -> SyntaxError | None:
    """Why `source` does not compile (None when it does), named `<field>`."""
    try:
        compile(source, f"<{field}>", mode, dont_inherit=True)
    except SyntaxError as err:
        return err
    return None


def validate_problem(obj: Any, where: str) -> dict[str, Any]:
    """Check one problem dict; `where` (e.g. 'problems.jsonl line 3') starts every error message."""
    if not isinstance(obj, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    allowed = {**REQUIRED_FIELDS, **OPTIONAL_FIELDS}
    for key in obj:
        if key not in allowed:
            raise _field_error(where, key, f"unknown field; allowed: {', '.join(allowed)}")
    for key in REQUIRED_FIELDS:
        if key not in obj:
            raise _field_error(where, key, "missing (required: id, prompt, entry_point, tests)")
    for key, typ in allowed.items():
        if key in obj and not isinstance(obj[key], typ):
            raise _field_error(where, key, f"must be a {typ.__name__}, got {type(obj[key]).__name__}")
    for key in ("id", "prompt"):
        if not obj[key].strip():
            raise _field_error(where, key, "must not be empty")
    if not obj["entry_point"].isidentifier():
        raise _field_error(where, "entry_point", f"{obj['entry_point']!r} is not a Python identifier")
    if not obj["tests"]:
        raise _field_error(where, "tests", "needs at least one test")
    tests = [_case(test, obj["entry_point"], where, f"tests[{i}]") for i, test in enumerate(obj["tests"])]
    if "reference" in obj and (err := _syntax_error(obj["reference"], "reference")):
        raise _field_error(where, "reference", f"is not valid Python: {err.msg} (line {err.lineno})")
    return {**obj, "tests": tests}


CASE_HELP = (
    'write it as a case, {"args": "<the arguments, as Python source>", "expected": <JSON value>} or '
    '{"args": "...", "raises": "ValueError"}; the answer is compared outside the solution\'s process '
    "(keelrl.sandbox.judge)"
)


def _case(test: Any, entry: str, where: str, field: str) -> Case:
    """A test as a validated case: a case dict, or an `assert entry(...) == literal` statement."""
    if isinstance(test, str):
        if err := _syntax_error(test, field):
            raise _field_error(where, field, f"is not valid Python: {err.msg} ({test[:80]!r})")
        case = case_from_assert(test, entry)
        if case is None:
            raise _field_error(
                where,
                field,
                f"{test[:80]!r} is not of the form `assert {entry}(...) == <literal>` (or `is None/True/False`), "
                f"the only statements that can be judged outside the solution's process; {CASE_HELP}",
            )
        return case
    if not isinstance(test, dict):
        raise _field_error(where, field, f"must be a case object or a string, got {type(test).__name__}")
    problems = [f"unknown field `{k}`" for k in test if k not in CASE_FIELDS]
    wrong_type = [k for k, t in CASE_FIELDS.items() if k in test and not isinstance(test[k], t)]
    problems += [f"`{k}` must be a {CASE_FIELDS[k].__name__}" for k in wrong_type]
    if ("expected" in test) == ("raises" in test):
        problems.append("give exactly one of `expected` and `raises`")
    if not isinstance(test.get("args"), str):
        problems.append("`args` (a string) is required")
    elif err := _syntax_error(f"f({test['args']})", field, "eval"):
        problems.append(f"`args` is not valid Python arguments: {err.msg}")
    raises = getattr(builtins, str(test.get("raises")), None)
    if "raises" in test and not (isinstance(raises, type) and issubclass(raises, BaseException)):
        problems.append(f"`raises` {test['raises']!r} is not a built-in exception class")
    if "view" in test and test["view"] not in VIEWS:
        problems.append(f"`view` must be one of {', '.join(VIEWS)}")
    if problems:
        raise _field_error(where, field, "; ".join(problems) + f"; {CASE_HELP}")
    return dict(test)


def case_from_assert(test: str, entry: str) -> Case | None:
    """`assert entry(ARGS) == LITERAL` (or `is None / True / False`) as a case; None for anything else."""
    body = ast.parse(test).body
    if len(body) != 1 or not isinstance(body[0], ast.Assert) or not isinstance(body[0].test, ast.Compare):
        return None
    cmp = body[0].test
    call, op, right = cmp.left, cmp.ops[0], cmp.comparators[0]
    if len(cmp.ops) != 1 or not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    if call.func.id != entry:
        return None
    match op, right:
        case ast.Is(), ast.Constant(value=None | True | False):
            expected = right.value
        case ast.Eq(), _:
            try:
                expected = json.loads(json.dumps(ast.literal_eval(right), allow_nan=False))
            except (ValueError, TypeError, SyntaxError, RecursionError):  # not a literal, or not JSON data
                return None
        case _:
            return None
    return {"args": ", ".join(ast.unparse(a) for a in [*call.args, *call.keywords]), "expected": expected}


def load_problems(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a problems JSONL file; TaskError names the line and field of the first problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TaskError(f"cannot read problems file {p}: {err}") from None
    problems: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise TaskError(f"{where}: not valid JSON: {err.msg} (column {err.colno})") from None
        problem = validate_problem(obj, where)
        if problem["id"] in seen:
            raise _field_error(where, "id", f"{problem['id']!r} already used on line {seen[problem['id']]}")
        seen[problem["id"]] = lineno
        problems.append(problem)
    if not problems:
        raise TaskError(f"problems file {p} holds no problems")
    return problems


_OPEN_RE = re.compile(r"[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n")  # after ```: a language tag, then the line ends
_CLOSE_RE = re.compile(r"[ \t]*(?:\n|$)")  # after ```: nothing else on the line


def extract_code(completion: str) -> str | None:
    """The last complete fenced block tagged python / py / python3 or untagged, or None. An opening fence is
    ``` with an optional tag and a newline, anywhere in a line (`<think>...</think>```python`); a closing
    fence is ``` alone on its line (up to 3 spaces of indent). The text after the last `</think>` is read
    first (a fence left open in the reasoning does not swallow the answer); the block's common indentation
    is removed (a block in a list item) and Windows line ends are read as newlines. Linear in the text's length."""
    completion = completion.replace("\r\n", "\n")
    end_think = completion.rfind("</think>")
    found = _last_block(completion[end_think + len("</think>") :]) if end_think >= 0 else None
    found = found if found is not None else _last_block(completion)
    return None if found is None else textwrap.dedent(found)


def _last_block(completion: str) -> str | None:
    found: str | None = None
    open_tag: str | None = None
    start = 0
    i = completion.find("```")
    while i >= 0:
        after = i + 3
        if open_tag is None:
            if m := _OPEN_RE.match(completion, after):
                open_tag, start = m.group(1).lower(), m.end()
                after = m.end()
        else:
            line_start = completion.rfind("\n", 0, i) + 1
            indent = completion[line_start:i]  # before the fence on its line: up to 3 spaces
            if not indent.strip(" ") and len(indent) <= 3 and _CLOSE_RE.match(completion, after):
                if open_tag in PYTHON_TAGS:
                    found = completion[start:line_start]
                open_tag = None
        i = completion.find("```", after)
    return found


# ------------------------------------------------------------------------------------------------ pools

_pools: dict[tuple[str, int, tuple[str, ...]], SandboxPool] = {}
_pools_lock = threading.Lock()


def shared_pool(isolation: str, workers: int, hide: tuple[str, ...] = ()) -> SandboxPool:
    """One SandboxPool per (isolation, workers, hidden paths) per process, shared by every CodeTask
    (threads are idle daemons when unused)."""
    key = (isolation, workers, hide)
    with _pools_lock:
        if key not in _pools:
            _pools[key] = SandboxPool(workers or None, isolation=isolation, hide=hide)  # type: ignore[arg-type]
        return _pools[key]


class SandboxFailures:
    """Sandbox errors in a row (the sandbox's fault, not the code's), shared by the tasks that run code: after
    MAX_CONSECUTIVE_SANDBOX_ERRORS of them `observe` raises, rather than let a run train on meaningless rewards."""

    def __init__(self, who: str) -> None:
        self.who, self.count = who, 0
        self._lock = threading.Lock()

    def observe(self, result: ExecResult) -> bool:
        """Whether `result` is a sandbox error (counted); any other result starts the count again."""
        with self._lock:
            if result.status != "sandbox_error":
                self.count = 0
                return False
            self.count += 1
            logger.warning("%s: sandbox error: %s", self.who, result.detail)
            if self.count >= MAX_CONSECUTIVE_SANDBOX_ERRORS:
                raise SandboxError(
                    f"the sandbox failed {self.count} times in a row (last: {result.detail}); "
                    "stopping rather than training on meaningless rewards"
                )
            return True


class CodeTask:
    """Python programming problems scored by unit tests in a sandbox."""

    name = "code"

    def __init__(self, seed: int = 0, sandbox: SandboxConfig | None = None, **params: Any) -> None:
        self.seed, self.sandbox = seed, sandbox_of(sandbox)  # [sandbox] isolation
        self.params = p = CodeParams(**params)
        path = Path(p.problems_file) if p.problems_file else shipped_problems_path()
        self.problems = load_problems(path)
        self.hide = tuple(sorted({str(path.resolve()), str(shipped_problems_path().resolve())}))
        self.splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
        for problem in self.problems:
            split = "test" if in_test_split(problem["id"], seed, p.test_fraction) else "train"
            self.splits[split].append(problem)
        for split, items in self.splits.items():
            if not items:
                raise TaskError(
                    f"task code: the {split} split of {path} is empty ({len(self.problems)} problems, "
                    f"test_fraction={p.test_fraction}); add problems or change test_fraction"
                )
        self.limits = SandboxLimits(wall_s=p.timeout_s, memory_mb=p.memory_mb, processes=p.max_processes)
        self._failures = SandboxFailures("code task")

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return dict(shuffled_pick(self.splits[split], index, "code", self.seed, split))

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        if template == "compact":
            return Prompt("", problem["prompt"], "```python\n")
        system = SYSTEM_CODE_CHAT if template == "chat" else SYSTEM_CODE_BASE
        return Prompt(system, problem["prompt"] + USER_SUFFIX, THINK_PREFIX)

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        return self.score_many([problem], [completion])[0]

    def difficulty(self, problem: dict[str, Any]) -> str:
        return str(problem.get("difficulty", "unknown"))

    def buckets(self) -> list[str]:
        """The `difficulty` values of the train split: easy, medium, hard first, then any others by name."""
        found = {self.difficulty(p) for p in self.splits["train"]}
        known = [b for b in ("easy", "medium", "hard") if b in found]
        return known + sorted(found - set(known))

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        """The `index`-th problem of `split` in `bucket`, from a new seeded permutation each pass."""
        check_bucket(self, bucket)
        items = [p for p in self.splits[split] if self.difficulty(p) == bucket]
        if not items:
            raise ValueError(f"task code: the {split} split has no problem of difficulty {bucket!r}")
        return dict(shuffled_pick(items, index, "code", self.seed, split, bucket))

    def score_many(self, problems: Sequence[dict[str, Any]], completions: Sequence[str]) -> list[Score]:
        """Score a batch, running the sandboxed executions in parallel on the shared pool."""
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        scores: list[Score | None] = [None] * len(problems)
        pending = []
        for i, (problem, completion) in enumerate(zip(problems, completions)):
            code = extract_code(completion)
            if code is None:
                scores[i] = Score(0.0, False, {"formatted": False, "reason": "no_code"})
            elif len(code) > self.params.max_code_chars:
                scores[i] = Score(0.1, False, {"formatted": True, "reason": "too_long", "chars": len(code)})
            else:
                calls = calls_of(problem["tests"])
                pending.append((i, Job(code, problem["entry_point"], calls, self.limits)))
        if pending:
            pool = shared_pool(self.sandbox.isolation, self.params.workers, self.hide)
            futures = [(i, pool.submit(job)) for i, job in pending]
            for i, future in futures:
                scores[i] = self._score_result(problems[i], future.result())
        return [s for s in scores if s is not None]

    def _score_result(self, problem: dict[str, Any], r: ExecResult) -> Score:
        verdict = judge(problem["tests"], r, problem["entry_point"])
        info = verdict.info(True, exec_s=round(r.wall_s, 4), isolation=r.isolation)
        if self._failures.observe(r):
            return Score(0.1, False, info)  # not the code's fault: no worse than a failing solution
        if verdict.ok:
            return Score(1.0, True, info)
        reward = 0.1 + 0.9 * verdict.passed / verdict.total if self.params.partial_credit else 0.1
        return Score(reward, False, info)
