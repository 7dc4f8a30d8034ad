"""Code proposals: the proposer writes a programming problem (a specification, a reference solution and tests),
and the sandbox decides whether it is a fair one.

What the proposer writes (the start `<spec>` is given):

    <spec>Return the largest of three numbers.</spec>
    ```python
    def largest(a, b, c):
        return max(a, b, c)
    ```
    <tests>
    assert largest(1, 5, 3) == 5
    assert largest(-1, -5, -3) == -1
    </tests>

`check_code_proposal` parses it (the tests must be `assert name(ARGS) == LITERAL` lines, keelrl's code-task case
form, all calling one function the reference defines at top level) and runs the reference on the tests' arguments
in the code task's sandbox twice, with the task's limits. Form `problem`: the reference must pass every test in
both runs. Form `worked`: the tests' written values are ignored and the expected values are what the reference
returned (Absolute Zero's executor computes the answer key); both runs must return the same values. Either way
a problem whose reference does not give the same answers twice is refused as `nondeterministic`, so the solver
is judged against a stable key. A function named like a held-out problem of the task's test split is refused
(`held_out`), so the fixed eval set is not proposed back. The solver sees the specification and the function's
signature, never the tests (they stay hidden, as the code task's are). The key is a hash of the entry point and
its cases, so the same tests under another wording are one problem.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from typing import Any

from keelrl.sandbox.judge import calls_of, judge
from keelrl.sandbox.result import Job
from keelrl.stages.selfplay.base import Proposal
from keelrl.stages.selfplay.buffer import ProblemBuffer
from keelrl.tasks import TaskError
from keelrl.tasks.code import CodeTask, case_from_assert, extract_code, shared_pool, validate_problem

SPEC = re.compile(r"<spec>(.*?)</spec>", re.DOTALL)
TESTS = re.compile(r"<tests>(.*?)</tests>", re.DOTALL)
MAX_SPEC_CHARS = 1000
MAX_TESTS = 12

SEED_EXAMPLE = (  # the format, shown until the buffer has a problem of the run's own (Absolute Zero starts so)
    "<spec>Return the argument unchanged.</spec>\n```python\ndef identity(x):\n    return x\n```\n"
    "<tests>\nassert identity(3) == 3\nassert identity('a') == 'a'\n</tests>"
)
PROPOSE_TEXT = (
    "Write a new Python programming problem, different from the example. Give its specification in "
    "<spec> </spec>, a reference solution (one top-level function) in a ```python block, and 2 to {max_tests} "
    "tests in <tests> </tests>, one `assert name(arguments) == value` per line.\n\nExample:\n{example}"
)


def parse_code_proposal(text: str) -> tuple[dict[str, Any] | None, str]:
    """(problem without its answer key checked, "") or (None, why): spec, reference, entry point, cases."""
    spec, tests = SPEC.search(text), TESTS.search(text)
    reference = extract_code(text)
    if spec is None or tests is None or not spec.group(1).strip() or len(spec.group(1)) > MAX_SPEC_CHARS:
        return None, "malformed"
    if reference is None:
        return None, "no_solution"
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return None, "invalid_solution"
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    lines = [line.strip() for line in tests.group(1).splitlines() if line.strip()]
    called = {m.group(1) for line in lines if (m := re.match(r"assert\s+([A-Za-z_]\w*)\s*\(", line))}
    if len(called) != 1 or not 2 <= len(lines) <= MAX_TESTS:
        return None, "malformed"
    entry = called.pop()
    if entry not in functions:
        return None, "invalid_solution"
    cases = []
    for line in lines:
        try:
            case = case_from_assert(line, entry)
        except SyntaxError:
            case = None
        if case is None:
            return None, "malformed"
        if case not in cases:
            cases.append(case)
    signature = f"{entry}({ast.unparse(functions[entry].args)})"
    problem = {
        "id": "",
        "prompt": f"{spec.group(1).strip()}\nWrite a Python function `{signature}`.",
        "entry_point": entry,
        "tests": cases,
        "reference": reference,
    }
    return problem, ""


def code_problem_key(problem: dict[str, Any]) -> str:
    """A hash of the entry point and its cases (their order does not matter)."""
    cases = sorted(json.dumps(c, sort_keys=True) for c in problem["tests"])
    digest = hashlib.sha256(json.dumps([problem["entry_point"], cases]).encode()).hexdigest()[:16]
    return f"{problem['entry_point']}:{digest}"


def check_code_proposal(task: CodeTask, text: str, form: str = "problem") -> Proposal:
    """Parse, then run the reference twice in the sandbox (see the module docstring)."""
    if form not in ("problem", "worked"):
        raise ValueError(f"unknown proposal form {form!r} (problem, worked)")
    problem, reason = parse_code_proposal(text)
    if problem is None:
        return Proposal(None, reason)
    if problem["entry_point"] in {p["entry_point"] for p in task.splits["test"]}:
        return Proposal(None, "held_out")
    try:  # the code task's own checks of a problem, before any sandbox run; the id follows from the key
        problem = validate_problem({**problem, "id": "proposal"}, "proposal")
    except TaskError:
        return Proposal(None, "malformed")
    pool = shared_pool(task.sandbox.isolation, task.params.workers, task.hide)
    job = Job(problem["reference"], problem["entry_point"], calls_of(problem["tests"]), task.limits)
    runs = [pool.submit(job), pool.submit(job)]
    first, second = (run.result() for run in runs)
    if not (first.ok and second.ok) or first.answers != second.answers:
        return Proposal(None, "nondeterministic" if first.ok and second.ok else "invalid_solution")
    if form == "worked":
        if any(a is None or a.kind != "value" for a in first.answers):
            return Proposal(None, "invalid_solution")
        problem["tests"] = [
            {"args": c["args"], "expected": json.loads(a.text)}
            for c, a in zip(problem["tests"], first.answers)
        ]
    elif not judge(problem["tests"], first, problem["entry_point"]).ok:
        return Proposal(None, "invalid_solution")
    key = code_problem_key(problem)
    return Proposal({**problem, "id": f"selfplay-{key}"}, "valid", key)


class CodeProposer:
    """The code task's `Proposer` (stages/selfplay/base.py): a prompt's cue picks the example it shows, a problem of
    the buffer (the seed example while the buffer is empty), so proposals drift with what the run has made."""

    reasons = ("malformed", "no_solution", "invalid_solution", "nondeterministic", "held_out")

    def cue(self, task: CodeTask, draw: int, buffer: ProblemBuffer) -> dict[str, Any]:
        keys = list(buffer.entries)
        return {
            "example": example_text(buffer.entries[keys[draw % len(keys)]].problem) if keys else SEED_EXAMPLE
        }

    def prompt(self, task: CodeTask, cue: dict[str, Any], template: str, form: str) -> tuple[str, str]:
        return PROPOSE_TEXT.format(max_tests=MAX_TESTS, example=cue["example"]), "<spec>"

    check = staticmethod(check_code_proposal)
    key = staticmethod(code_problem_key)


def example_text(problem: dict[str, Any]) -> str:
    """A buffer problem written back in the proposal format (the example a proposer prompt shows)."""
    spec = problem["prompt"].rsplit("\nWrite a Python function", 1)[0]
    tests = "\n".join(
        f"assert {problem['entry_point']}({c['args']}) == {c['expected']!r}" for c in problem["tests"]
    )
    return f"<spec>{spec}</spec>\n```python\n{problem['reference'].rstrip()}\n```\n<tests>\n{tests}\n</tests>"
