"""Countdown sets (tasks/countdown_set.py): all-or-nothing reward, buckets, splits, prompts."""

from __future__ import annotations

import pytest

from keelrl.tasks import TaskError, get_task
from keelrl.tasks.base import BucketedTask

SET = {"items": [{"numbers": [3, 5], "target": 15}, {"numbers": [9, 2], "target": 7}]}


@pytest.mark.parametrize(
    ("completion", "reward", "correct", "solved", "reason"),
    [
        ("<answer>3*5;9-2</answer>", 1.0, True, 2, "correct"),
        ("<answer> 5*3 ; 9-2 </answer>", 1.0, True, 2, "correct"),
        ("<answer>3*5;9+2</answer>", 0.1, False, 1, "wrong_value"),  # one of two right earns nothing extra
        ("<answer>3+5;9-2</answer>", 0.1, False, 1, "wrong_value"),
        ("<answer>3*5;9-2;1+1</answer>", 0.1, False, 0, "wrong_count"),  # a third equation
        ("<answer>3*5</answer>", 0.1, False, 0, "wrong_count"),
        ("<answer>3*5;9-2-0</answer>", 0.1, False, 1, "wrong_numbers"),  # a number not given
        ("<answer>3*5;9**2</answer>", 0.1, False, 1, "parse_error"),  # Countdown's checker's reason
        ("3*5;9-2", 0.0, False, 0, "no_answer"),
        ("<answer>3*5;9-2", 1.0, True, 2, "correct"),  # left open at the end of its line
    ],
)
def test_reward_is_all_or_nothing(
    completion: str, reward: float, correct: bool, solved: int, reason: str
) -> None:
    score = get_task("countdown_set").score(SET, completion)
    assert (score.reward, score.correct, score.info["items_correct"], score.info["reason"]) == (
        reward,
        correct,
        solved,
        reason,
    )


def test_buckets_splits_and_reference_answers() -> None:
    task = get_task("countdown_set", seed=4, min_problems=1, max_problems=3, min_numbers=2, max_numbers=2)
    assert isinstance(task, BucketedTask) and task.buckets() == ["x1", "x2", "x3"]
    for k, bucket in enumerate(task.buckets(), start=1):
        train = [task.problem_in(bucket, "train", i) for i in range(30)]
        test = [task.problem_in(bucket, "test", i) for i in range(15)]
        assert all(len(p["items"]) == k and task.difficulty(p) == bucket for p in train + test)
        assert train == [task.problem_in(bucket, "train", i) for i in range(30)]  # deterministic
        multisets = lambda sets: {tuple(sorted(it["numbers"])) for p in sets for it in p["items"]}  # noqa: E731
        assert multisets(train).isdisjoint(multisets(test))  # every item keeps Countdown's split
        for p in train[:5]:
            assert task.score(p, f"<answer>{task.reference_answer(p)}</answer>").correct
    assert {len(task.problem("train", i)["items"]) for i in range(60)} == {1, 2, 3}
    with pytest.raises(ValueError, match="no difficulty bucket 'x4'"):
        task.problem_in("x4", "train", 0)
    with pytest.raises(TaskError, match="min_problems=3 > max_problems=2"):
        get_task("countdown_set", min_problems=3, max_problems=2)


def test_prompts() -> None:
    task = get_task("countdown_set")
    compact = task.prompt(SET, "compact")
    assert (compact.system, compact.user, compact.assistant_prefix) == ("", "5 3 -> 15\n9 2 -> 7", "")
    chat = task.prompt(SET, "chat")
    assert "1. numbers [3, 5], target 15\n2. numbers [9, 2], target 7" in chat.user
    assert chat.assistant_prefix == "<answer>" and ";" in chat.user
