"""The task registry: names in `TASKS`, users' tasks by import path, and the errors a user can cause; and the
optional `reference_answer` task method that `keelrl eval --perplexity reference` uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from keelrl.evals.likelihood import reference_completion
from keelrl.tasks import TASKS, TaskError, get_task
from keelrl.tasks.countdown import Countdown
from keelrl.tasks.multiply import Multiply


def test_every_registered_name_builds_its_task() -> None:
    assert set(TASKS) == {
        "countdown",
        "multiply",
        "code",
        "mixture",
        "countdown_search",
        "countdown_set",
        "cipher",
        "countdown_tools",
        "code_feedback",
        "swe_mini",
        "dataset",
    }
    shipped = {"path": "configs/dataset/sums.jsonl", "reward": "configs/dataset/rewards.py:exact_match"}
    for name in TASKS:
        params = {"mixture": {"tasks": [{"task": "multiply"}]}, "dataset": shipped}.get(name, {})
        task = get_task(name, seed=3, **params)
        assert task.name == name and task.seed == 3
    assert isinstance(get_task("countdown"), Countdown)


def test_code_and_mixture_import_their_modules_only_when_used() -> None:
    code = (
        "import sys; from keelrl.tasks import get_task; get_task('countdown'); "
        "assert 'keelrl.sandbox' not in sys.modules and 'keelrl.tasks.mixture' not in sys.modules; "
        "get_task('code'); assert 'keelrl.sandbox' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_task_by_import_path_gets_seed_and_params() -> None:
    from user_tasks import HackableMultiply

    task = get_task("user_tasks:HackableMultiply", seed=5, digits_a=2, digits_b=1)
    assert isinstance(task, HackableMultiply) and task.seed == 5
    assert task.problem("train", 0) == Multiply(seed=5, digits_a=2, digits_b=1).problem("train", 0)
    fn = get_task("user_tasks:make_multiply", seed=2, digits_a=3)  # a factory function works too
    assert isinstance(fn, Multiply) and fn.params.digits_a == 3
    assert isinstance(get_task("keelrl.tasks.multiply:Multiply"), Multiply)
    # mixture members take the same forms
    mix = get_task(
        "mixture", tasks=[{"task": "user_tasks:HackableMultiply", "name": "hack"}, {"task": "countdown"}]
    )
    assert isinstance(mix.members["hack"], HackableMultiply)


def test_a_mixture_refuses_an_environment_member_when_built() -> None:
    # a mixture asks its members prompt() and score(): a multi-turn environment has neither
    with pytest.raises(TaskError, match=r"mixture member 'countdown_tools' is a multi-turn environment"):
        get_task("mixture", tasks=[{"task": "countdown_tools"}, {"task": "multiply"}])


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("no_such_module_xyz:Task", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
        ("user_tasks:NoSuchTask", "AttributeError"),
        ("user_tasks:NOT_A_TASK", "user_tasks.NOT_A_TASK is a int, not a class or function"),
        (":Task", "ValueError"),
    ],
)
def test_a_bad_import_path_says_what_failed_and_the_accepted_forms(path: str, what: str) -> None:
    with pytest.raises(TaskError) as err:
        get_task(path)
    message = str(err.value)
    assert f"cannot load task {path!r}" in message and what in message
    assert "'package.module:Class'" in message and "countdown, multiply, code, mixture" in message
    assert "\n" not in message


def test_an_imported_class_that_is_neither_task_nor_environment_says_what_it_lacks() -> None:
    with pytest.raises(TaskError) as err:
        get_task("user_tasks:HalfAnEnvironment")
    message = str(err.value)
    assert "neither a task nor an environment: it lacks step." in message
    assert "reset(problem, seed) and step(state, assistant_turn)" in message


def test_bad_params_and_unknown_names_stay_helpful() -> None:
    with pytest.raises(TaskError, match=r"bad parameters for task 'user_tasks:HackableMultiply'.*digitz"):
        get_task("user_tasks:HackableMultiply", digitz=2)
    with pytest.raises(
        TaskError, match=r"unknown task 'multipy' \(did you mean 'multiply'\?\).*package\.module"
    ):
        get_task("multipy")


class Plain:
    """A user's task without the optional `reference_answer` (its problems are fields evaluate does not know)."""

    name = "plain"

    def problem(self, split, index):
        return {"word": f"w{index}"}

    def prompt(self, problem, template):
        raise NotImplementedError

    def score(self, problem, completion):
        from keelrl.tasks.base import Score, last_answer

        ok = last_answer(completion) == problem["word"]
        return Score(float(ok), ok, {"formatted": True})

    def difficulty(self, problem):
        return "all"


class Echo(Plain):
    def reference_answer(self, problem):
        return problem["word"]


def test_reference_completion_asks_the_task_for_its_reference_answer() -> None:
    echo = Echo()
    assert reference_completion(echo, {"word": "w7"}, "<answer>") == "w7</answer>"
    assert reference_completion(echo, {"word": "w7"}, "") == "</think>\n<answer>w7</answer>"
    # without reference_answer: no reference, unless the problem carries one
    assert reference_completion(Plain(), {"word": "w7"}, "<answer>") is None
    assert reference_completion(Plain(), {"word": "w7", "reference": "w7"}, "<answer>") == "w7</answer>"


def test_builtin_reference_answers_are_correct() -> None:
    cd, mul = get_task("countdown", max_numbers=3, max_number=20), get_task("multiply", digits_a=2)
    for i in range(5):
        p, q = cd.problem("test", i), mul.problem("test", i)
        assert cd.score(p, f"<answer>{cd.reference_answer(p)}</answer>").correct
        assert mul.reference_answer(q) == str(q["a"] * q["b"])
    assert cd.reference_answer({"numbers": [2, 2], "target": 7}) is None  # unsolvable: no reference
