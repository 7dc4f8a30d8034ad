"""The `code` task: the shipped problem set, splits, prompts, code extraction, rewards, problem files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from keelrl.sandbox.judge import calls_of, judge
from keelrl.sandbox.result import ExecResult, Job, SandboxError
from keelrl.tasks import TaskError, get_task
from keelrl.tasks.base import THINK_PREFIX, Task
from keelrl.tasks.code import (
    MAX_CONSECUTIVE_SANDBOX_ERRORS,
    CodeTask,
    extract_code,
    load_problems,
    shared_pool,
    shipped_problems_path,
)

SHIPPED = load_problems(shipped_problems_path())


def fenced(code: str, tag: str = "python") -> str:
    return f"Here it is.\n```{tag}\n{code}\n```\nDone."


# ---------------------------------------------------------------------------------------- shipped set


def test_shipped_set_shape() -> None:
    assert len(SHIPPED) >= 60
    assert len({p["id"] for p in SHIPPED}) == len(SHIPPED)
    levels = Counter(p["difficulty"] for p in SHIPPED)
    assert set(levels) == {"easy", "medium", "hard"} and min(levels.values()) >= 15, levels
    for p in SHIPPED:
        assert len(p["tests"]) >= 3, p["id"]
        assert "reference" in p and f"def {p['entry_point']}(" in p["reference"], p["id"]
        assert p["entry_point"] in p["prompt"], p["id"]


def _verdicts(solutions: list[str]) -> list:
    pool = shared_pool("auto", 0)
    jobs = [Job(code, p["entry_point"], calls_of(p["tests"])) for code, p in zip(solutions, SHIPPED)]
    return [judge(p["tests"], r, p["entry_point"]) for p, r in zip(SHIPPED, pool.run_many(jobs))]


def test_every_reference_solution_passes_and_no_test_set_is_vacuous() -> None:
    verdicts = _verdicts([p["reference"] for p in SHIPPED])
    failed = {p["id"]: f"{v.reason}: {v.detail}" for p, v in zip(SHIPPED, verdicts) if not v.ok}
    assert failed == {}, f"reference solutions failing: {failed}"
    # a solution that returns None (or a constant) must fail at least one case of every problem
    stubs = [f"def {p['entry_point']}(*args, **kwargs):\n    return None\n" for p in SHIPPED]
    vacuous = [p["id"] for p, v in zip(SHIPPED, _verdicts(stubs)) if v.ok]
    assert vacuous == []


# --------------------------------------------------------------------------------------- task protocol


def test_get_task_builds_a_code_task_and_checks_params() -> None:
    task = get_task("code", seed=3, partial_credit=True, timeout_s=2.0)
    assert isinstance(task, CodeTask) and isinstance(task, Task)
    assert task.params.partial_credit and task.limits.wall_s == 2.0
    with pytest.raises(TaskError, match="timeout_s"):
        get_task("code", timeout_s=-1)
    with pytest.raises(TaskError, match="unknown parameter"):
        get_task("code", partial=True)


def test_splits_are_disjoint_deterministic_and_cover_the_set() -> None:
    task = CodeTask(seed=0)
    train = {p["id"] for p in task.splits["train"]}
    test = {p["id"] for p in task.splits["test"]}
    assert train.isdisjoint(test) and train | test == {p["id"] for p in SHIPPED}
    assert 0.1 < len(test) / len(SHIPPED) < 0.45
    n = len(task.splits["test"])
    first_pass = [task.problem("test", i)["id"] for i in range(n)]
    assert sorted(first_pass) == sorted(test)  # one pass visits every test problem once
    assert first_pass == [CodeTask(seed=0).problem("test", i)["id"] for i in range(n)]
    assert all(task.problem("train", i)["id"] in train for i in range(3 * len(train)))
    other = CodeTask(seed=1)
    assert {p["id"] for p in other.splits["test"]} != test


def test_prompts_for_each_template() -> None:
    task = CodeTask()
    problem = task.problem("train", 0)
    base, chat, compact = (task.prompt(problem, t) for t in ("base", "chat", "compact"))
    for prompt in (base, chat):
        assert problem["prompt"] in prompt.user and "```python" in prompt.user
        assert prompt.assistant_prefix == THINK_PREFIX and prompt.system
    assert base.system != chat.system
    assert (compact.system, compact.user, compact.assistant_prefix) == ("", problem["prompt"], "```python\n")
    assert task.difficulty(problem) in ("easy", "medium", "hard")


# ---------------------------------------------------------------------------------------- extraction


def test_extract_code_takes_the_last_python_block() -> None:
    assert extract_code("no code here") is None
    assert extract_code("```python\nx = 1\n```") == "x = 1\n"
    assert extract_code("```python\nprint('```')\n```") == "print('```')\n"  # fences are whole lines
    two = "first:\n```python\na = 1\n```\nbetter:\n```py\nb = 2\n```\n"
    assert extract_code(two) == "b = 2\n"
    assert extract_code("```\nbare = True\n```") == "bare = True\n"
    assert (
        extract_code("```python\nok = 1\n```\nOutput:\n```text\n42\n```") == "ok = 1\n"
    )  # other languages skipped
    assert extract_code("```python\nunclosed = 1\n") is None
    assert extract_code("```python\nfine = 1\n```\n```python\ntruncated") == "fine = 1\n"
    assert extract_code("  ```python\nindented = 1\n  ```") == "indented = 1\n"
    assert extract_code("<think>plan</think>```python\nafter_think = 1\n```") == "after_think = 1\n"
    assert extract_code("inline ```x``` only") is None
    assert extract_code("```python\nx = 1\n``` trailing words") is None  # a closing fence stands alone
    # the compact template's prefix opens the block; the completion closes it
    assert extract_code("```python\n" + "def f():\n    return 1\n```") == "def f():\n    return 1\n"


def test_extract_code_on_real_model_outputs() -> None:
    # a fence left open in the reasoning does not swallow the answer after </think>
    thought = "<think>try\n```python\ndef f(x):\n    return x\n</think>\n\n```python\ndef f(x):\n    return x + 1\n```\n"
    assert extract_code(thought) == "def f(x):\n    return x + 1\n"
    assert extract_code("<think>\n```python\nearly = 1\n```\n</think>\nDone.") == "early = 1\n"
    # CommonMark: spaces may come before the tag; Windows line ends; a block indented in a list item
    assert extract_code("``` python\nspaced = 1\n```") == "spaced = 1\n"
    assert extract_code("```python\r\ndef f():\r\n    return 1\r\n```\r\n") == "def f():\n    return 1\n"
    listed = "1. The code:\n   ```python\n   def f():\n       return 1\n   ```\n"
    assert extract_code(listed) == "def f():\n    return 1\n"


# ------------------------------------------------------------------------------------------- rewards


def _problem(pid: str) -> dict:
    return next(p for p in SHIPPED if p["id"] == pid)


def test_rewards_and_reasons() -> None:
    task = CodeTask(timeout_s=1.0)
    p = _problem("clamp")
    good = task.score(p, fenced(p["reference"]))
    assert (good.reward, good.correct, good.info["reason"], good.info["formatted"]) == (1.0, True, "ok", True)
    assert good.info["passed"] == good.info["total"] == len(p["tests"])
    none = task.score(p, "I think the answer is max(low, min(high, value)).")
    assert (none.reward, none.correct, none.info) == (0.0, False, {"formatted": False, "reason": "no_code"})
    wrong = task.score(p, fenced("def clamp(value, low, high):\n    return value\n"))
    assert (wrong.reward, wrong.correct, wrong.info["reason"]) == (0.1, False, "wrong_answer")
    assert 0 < wrong.info["passed"] < wrong.info["total"]
    broken = task.score(p, fenced("def clamp(value, low, high)\n    return value\n"))
    assert (broken.reward, broken.info["reason"]) == (0.1, "syntax_error")
    slow = task.score(p, fenced("def clamp(value, low, high):\n    while True:\n        pass\n"))
    assert (slow.reward, slow.correct, slow.info["reason"]) == (0.1, False, "timeout")
    long = CodeTask(max_code_chars=50).score(p, fenced("x = 1\n" * 20))
    assert (long.reward, long.info["reason"]) == (0.1, "too_long")


def test_partial_credit_is_named_and_below_one() -> None:
    p = _problem("clamp")  # 5 tests; returning `value` passes the 3 in-range cases
    solution = fenced("def clamp(value, low, high):\n    return value\n")
    flat = CodeTask().score(p, solution)
    partial = CodeTask(partial_credit=True).score(p, solution)
    passed, total = partial.info["passed"], partial.info["total"]
    assert (passed, total) == (3, 5)
    assert flat.reward == 0.1
    assert partial.reward == pytest.approx(0.1 + 0.9 * 3 / 5) and partial.reward < 1.0
    assert not partial.correct
    full = CodeTask(partial_credit=True).score(p, fenced(p["reference"]))
    assert (full.reward, full.correct) == (1.0, True)


def test_score_many_matches_score() -> None:
    task = CodeTask(timeout_s=2.0)
    problems = [_problem("clamp"), _problem("digit_sum"), _problem("edit_distance"), _problem("clamp")]
    completions = [
        fenced(problems[0]["reference"]),
        fenced("def digit_sum(n):\n    return 0\n"),
        "no code",
        fenced("import os\nos._exit(0)\n"),
    ]
    batch = task.score_many(problems, completions)
    single = [task.score(p, c) for p, c in zip(problems, completions)]
    key = [(s.reward, s.correct, s.info["reason"]) for s in batch]
    assert key == [(s.reward, s.correct, s.info["reason"]) for s in single]
    assert key == [
        (1.0, True, "ok"),
        (0.1, False, "wrong_answer"),
        (0.0, False, "no_code"),
        (0.1, False, "crash"),
    ]
    with pytest.raises(ValueError, match="2 problems but 1 completions"):
        task.score_many(problems[:2], completions[:1])


def test_a_broken_sandbox_stops_scoring() -> None:
    task = CodeTask()
    p = _problem("clamp")
    broken = ExecResult("sandbox_error", len(p["tests"]), 0.0, "rlimit", detail="launcher missing")
    for _ in range(MAX_CONSECUTIVE_SANDBOX_ERRORS - 1):
        score = task._score_result(p, broken)
        assert (score.reward, score.correct, score.info["reason"]) == (0.1, False, "sandbox_error")
    with pytest.raises(SandboxError, match="failed 20 times in a row"):
        task._score_result(p, broken)


# ------------------------------------------------------------------------------------- problem files


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GOOD = {"id": "double", "prompt": "Write `double(x)` returning 2 * x.", "entry_point": "double",
        "tests": ["assert double(2) == 4", "assert double(0) == 0"]}  # fmt: skip


def test_user_problem_file_round_trip(tmp_path: Path) -> None:
    rows = [{**GOOD, "id": f"double-{i}", "difficulty": "easy"} for i in range(12)]
    path = _write(tmp_path / "mine.jsonl", [rows[0], "", *rows[1:]])
    task = get_task("code", seed=0, problems_file=str(path), test_fraction=0.3)
    assert len(task.problems) == 12
    problem = task.problem("test", 0)
    assert problem["id"].startswith("double-") and task.difficulty(problem) == "easy"
    assert task.score(problem, fenced("def double(x):\n    return 2 * x\n")).correct


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([GOOD, "{not json"], r"line 2: not valid JSON"),
        ([{k: v for k, v in GOOD.items() if k != "tests"}], r"line 1: field `tests`: missing"),
        ([{**GOOD, "tests": []}], r"line 1: field `tests`: needs at least one"),
        (
            [{**GOOD, "tests": ["assert double(2) == 4", "assert double(("]}],
            r"line 1: field `tests\[1\]`: is not valid Python",
        ),
        ([{**GOOD, "tests": "assert 1"}], r"line 1: field `tests`: must be a list, got str"),
        (
            [{**GOOD, "entry_point": "my func"}],
            r"line 1: field `entry_point`: 'my func' is not a Python identifier",
        ),
        ([GOOD, {**GOOD}], r"line 2: field `id`: 'double' already used on line 1"),
        ([{**GOOD, "solution": "x"}], r"line 1: field `solution`: unknown field"),
        ([{**GOOD, "reference": "def double(x) return"}], r"line 1: field `reference`: is not valid Python"),
        ([[1, 2]], r"line 1: expected a JSON object, got list"),
        (
            [{**GOOD, "tests": ["r = double(2)\nassert r == 4"]}],
            r"line 1: field `tests\[0\]`: .* is not of the form `assert double\(...\) == <literal>`.*write it as a case",
        ),
        (
            [{**GOOD, "tests": ["assert len(double('ab')) == 4"]}],
            r"field `tests\[0\]`: .* is not of the form",
        ),
        (
            [{**GOOD, "tests": [{"args": "2"}]}],
            r"field `tests\[0\]`: give exactly one of `expected` and `raises`",
        ),
        (
            [{**GOOD, "tests": [{"args": "2", "raises": "Oops"}]}],
            r"`raises` 'Oops' is not a built-in exception",
        ),
        ([{**GOOD, "tests": [{"args": "2,,", "expected": 4}]}], r"`args` is not valid Python arguments"),
        ([{**GOOD, "tests": [{"args": "2", "expected": 4, "view": "sum"}]}], r"`view` must be one of len"),
        ([""], r"holds no problems"),
    ],
    ids=[
        "json",
        "missing",
        "no-tests",
        "bad-test",
        "tests-type",
        "entry",
        "duplicate",
        "unknown",
        "ref",
        "array",
        "statement",
        "not-the-entry-call",
        "case-neither",
        "case-raises",
        "case-args",
        "case-view",
        "empty",
    ],
)
def test_problem_file_errors_name_line_and_field(tmp_path: Path, rows: list, message: str) -> None:
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TaskError, match=message):
        get_task("code", problems_file=str(path))


def test_assert_tests_become_cases_judged_strictly(tmp_path: Path) -> None:
    rows = [
        {**GOOD, "id": f"even-{i}", "entry_point": "even", "prompt": "Write `even(n)`.",
         "tests": ["assert even(2) is True", "assert even(n=3) == False", {"args": "'x'", "raises": "TypeError"}]}
        for i in range(8)
    ]  # fmt: skip
    task = get_task("code", problems_file=str(_write(tmp_path / "even.jsonl", rows)), test_fraction=0.3)
    p = task.problem("test", 0)
    assert p["tests"][:2] == [{"args": "2", "expected": True}, {"args": "n=3", "expected": False}]
    right = (
        "def even(n):\n    if not isinstance(n, int):\n        raise TypeError(n)\n    return n % 2 == 0\n"
    )
    assert task.score(p, fenced(right)).correct
    ints = task.score(
        p, fenced("def even(n):\n    return 1 - n % 2\n")
    )  # 1 == True, but not `is True` (and `"x" % 2` raises the TypeError)
    assert (ints.correct, ints.info["passed"], ints.info["reason"]) == (False, 1, "wrong_answer"), ints
    assert "case 0 `even(2)`: expected true, returned 1" in ints.info["detail"]


def test_missing_file_and_empty_split_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="cannot read problems file"):
        get_task("code", problems_file=str(tmp_path / "nope.jsonl"))
    one = _write(tmp_path / "one.jsonl", [GOOD])
    with pytest.raises(TaskError, match=r"split of .* is empty"):
        get_task("code", problems_file=str(one))


# ------------------------------------------------------------------------------------- reward hacking
# Each completion below is WRONG (it does not solve its problem) and scored 1.0 when the tests ran in
# the solution's process. The judge now compares plain-data answers outside the sandbox.

SHADOW_HACKS = {
    "hamming_distance": (  # the length check is missing; `except ValueError` in a test caught anything
        "ValueError = AssertionError\n"
        "def hamming_distance(a, b):\n    return sum(1 for x, y in zip(a, b) if x != y)\n"
    ),
    "primes_below": (  # right for small n only; the tests' `len` was the solution's
        "def len(x):\n    return 78498\n"
        "def primes_below(n):\n    return [p for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29) if p < n]\n"
    ),
    "pascal_row": (  # rows 0..5 from a table; the tests' `sum` was the solution's
        "def sum(xs, start=0):\n    return 2 ** 20\n"
        "def pascal_row(n):\n    return {0: [1], 3: [1, 3, 3, 1], 5: [1, 5, 10, 10, 5, 1]}.get(n, [])\n"
    ),
}

WRONG_CLAMP = "def clamp(value, low, high):\n    return value\n"


def answer_key_hack(path: Path) -> str:
    """Reads the problems file and runs the reference solution it holds."""
    return (
        "import json\n"
        "try:\n"
        f"    for line in open({str(path)!r}):\n"
        "        p = json.loads(line)\n"
        "        if p['entry_point'] == 'clamp':\n"
        "            exec(p['reference'])\n"
        "except OSError:\n"
        "    pass\n"
        "if 'clamp' not in globals():\n" + "".join("    " + ln + "\n" for ln in WRONG_CLAMP.splitlines())
    )


INTROSPECTION_HACKS = {
    # rewrite the harness's list of tests from the frame that runs the solution
    "frame": (
        "import sys\n"
        "frame = sys._getframe(1)\n"
        "while frame is not None:\n"
        "    job = frame.f_locals.get('job')\n"
        "    if isinstance(job, dict):\n"
        "        for key in ('tests', 'calls'):\n"
        "            if key in job:\n"
        "                job[key] = ['pass'] * len(job[key])\n"
        "    frame = frame.f_back\n" + WRONG_CLAMP
    ),
    # find the job through the garbage collector and forge every result record with its nonce
    "gc": (
        "import gc, os\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict) and 'nonce' in obj and 'fd' in obj:\n"
        "        n = len(obj.get('tests') or obj.get('calls') or ())\n"
        "        lines = [f\"{obj['nonce']} test {i} 1\\n\" for i in range(n)]\n"
        "        lines += [f\"{obj['nonce']} answer {i} value 0\\n\" for i in range(n)]\n"
        "        os.write(obj['fd'], ''.join(lines).encode())\n" + WRONG_CLAMP
    ),
}


@pytest.mark.parametrize("pid", sorted(SHADOW_HACKS))
def test_shadowing_names_the_tests_use_does_not_pass(pid: str) -> None:
    task = CodeTask(timeout_s=5.0)
    p = _problem(pid)
    hacked = task.score(p, fenced(SHADOW_HACKS[pid]))
    assert not hacked.correct and hacked.reward < 1.0, hacked
    right = task.score(p, fenced(p["reference"]))
    assert (right.reward, right.correct) == (1.0, True), right


def test_the_answer_key_is_not_readable_from_the_sandbox(tmp_path: Path) -> None:
    task = CodeTask(timeout_s=5.0)
    p = _problem("clamp")
    for path in {
        shipped_problems_path().resolve(),
        Path(__file__).resolve().parents[2] / "src/keelrl/data/code_problems.jsonl",
    }:
        hacked = task.score(p, fenced(answer_key_hack(path)))
        assert not hacked.correct and hacked.reward < 1.0, (path, hacked)
    assert task.score(p, fenced(p["reference"])).correct


@pytest.mark.parametrize("how", sorted(INTROSPECTION_HACKS))
def test_introspection_cannot_rewrite_or_forge_results(how: str) -> None:
    task = CodeTask(timeout_s=5.0)
    p = _problem("clamp")
    hacked = task.score(p, fenced(INTROSPECTION_HACKS[how]))
    assert not hacked.correct and hacked.reward < 1.0, hacked
    assert task.score(p, fenced(p["reference"])).correct
