"""The `code` task: the shipped problem set, splits, prompts, code extraction, rewards, problem files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

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


def test_every_reference_solution_passes_and_no_test_set_is_vacuous() -> None:
    pool = shared_pool("auto", 0)
    refs = pool.run_many([Job(p["reference"], p["tests"], p["entry_point"]) for p in SHIPPED])
    failed = {p["id"]: f"{r.status}: {r.detail}" for p, r in zip(SHIPPED, refs) if r.status != "ok"}
    assert failed == {}, f"reference solutions failing under {refs[0].isolation}: {failed}"
    # a solution that returns None (or a constant) must fail at least one test of every problem
    stubs = [f"def {p['entry_point']}(*args, **kwargs):\n    return None\n" for p in SHIPPED]
    stub_results = pool.run_many([Job(s, p["tests"], p["entry_point"]) for s, p in zip(stubs, SHIPPED)])
    vacuous = [p["id"] for p, r in zip(SHIPPED, stub_results) if r.status == "ok"]
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
    broken = ExecResult("sandbox_error", 0, 3, 0.0, "rlimit", detail="launcher missing")
    for _ in range(MAX_CONSECUTIVE_SANDBOX_ERRORS - 1):
        score = task._score_result(broken)
        assert (score.reward, score.correct, score.info["reason"]) == (0.1, False, "sandbox_error")
    with pytest.raises(SandboxError, match="failed 20 times in a row"):
        task._score_result(broken)


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
        "empty",
    ],
)
def test_problem_file_errors_name_line_and_field(tmp_path: Path, rows: list, message: str) -> None:
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TaskError, match=message):
        get_task("code", problems_file=str(path))


def test_missing_file_and_empty_split_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="cannot read problems file"):
        get_task("code", problems_file=str(tmp_path / "nope.jsonl"))
    one = _write(tmp_path / "one.jsonl", [GOOD])
    with pytest.raises(TaskError, match=r"split of .* is empty"):
        get_task("code", problems_file=str(one))
