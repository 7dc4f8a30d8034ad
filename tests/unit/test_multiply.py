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
        ("<answer>+56088</answer>", 1.0, True),  # TinyZero's int() reads a sign
        ("<answer>-56088</answer>", 0.1, False),
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


def test_worked_product_writes_the_long_multiplication() -> None:
    from keelrl.tasks.multiply import worked_product

    assert worked_product(47, 8) == "47 * 8 = 40 * 8 + 7 * 8 = 320 + 56 = 376\n<answer>376</answer>"
    assert worked_product(47, 23) == (
        "47 * 23 = 47 * 20 + 47 * 3\n"
        "47 * 20 = 40 * 20 + 7 * 20 = 800 + 140 = 940\n"
        "47 * 3 = 40 * 3 + 7 * 3 = 120 + 21 = 141\n"
        "940 + 141 = 1081\n"
        "<answer>1081</answer>"
    )
    assert worked_product(40, 7) == "40 * 7 = 280\n<answer>280</answer>"  # a zero digit is no step


@pytest.mark.parametrize(("a", "b"), [(9, 7), (305, 4), (12, 10), (99, 99), (1001, 207), (5, 0)])
def test_every_step_of_a_worked_product_is_true_and_it_ends_in_the_product(a: int, b: int) -> None:
    from keelrl.tasks.countdown import evaluate_expression
    from keelrl.tasks.multiply import worked_product

    text = worked_product(a, b)
    assert get_task("multiply").score({"a": a, "b": b}, text).correct
    for line in text.splitlines()[:-1]:
        sides = [evaluate_expression(side) for side in line.split("=")]
        assert len(set(sides)) == 1, line  # every side of every line has the same value


def test_answer_only_prompt_starts_the_answer_and_takes_an_answer_ending_at_its_line() -> None:
    task = get_task("multiply", think=False)
    prompt = task.prompt({"a": 12, "b": 3}, "chat")
    assert prompt.assistant_prefix == "<answer>" and prompt.user.startswith("What is 12 * 3?")
    assert task.score({"a": 12, "b": 3}, "<answer>36\nmore").correct
    assert not task.score({"a": 12, "b": 3}, "<answer>12 * 3 = 36</answer>").correct
    assert not get_task("multiply").score({"a": 12, "b": 3}, "<answer>36\nmore").correct  # needs the tag
