from __future__ import annotations

import pytest

from keelrl.tasks import get_task


@pytest.mark.parametrize(
    ("answer", "reward", "correct"),
    [
        ("<answer>56088</answer>", 1.0, True),
        ("<answer> 56,088 </answer>", 1.0, True),
        ("<answer>56_088</answer>", 1.0, True),
        ("<answer>56089</answer>", 0.1, False),
        ("<answer>5,60,88</answer>", 0.0, False),  # not a thousands grouping
        ("<answer>56088.0</answer>", 0.0, False),
        ("<answer>about 56088</answer>", 0.0, False),
        ("56088", 0.0, False),
        ("<answer>1</answer> then <answer>56088</answer>", 1.0, True),
    ],
)
def test_multiply_reward(answer: str, reward: float, correct: bool) -> None:
    task = get_task("multiply")
    s = task.score({"a": 123, "b": 456}, answer)
    assert (s.reward, s.correct) == (reward, correct)


def test_multiply_digits_and_split() -> None:
    task = get_task("multiply", digits_a=2, digits_b=4)
    p = task.problem("train", 3)
    assert len(str(p["a"])) == 2 and len(str(p["b"])) == 4
    assert task.difficulty(p) == "2x4"
    train = {tuple(sorted(task.problem("train", i).values())) for i in range(2000)}
    test = {tuple(sorted(task.problem("test", i).values())) for i in range(300)}
    assert not train & test
