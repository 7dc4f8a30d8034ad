"""Countdown reward: every rule of the checker, adversarial inputs, and the problem generator."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from keelrl.tasks import get_task
from keelrl.tasks.countdown import check_expression, score_countdown, solve

NUMS = [3, 5, 7]  # 3*5+7 = 22


def ans(expr: str) -> str:
    return f"<think>some thinking</think><answer>{expr}</answer>"


@pytest.mark.parametrize(
    ("completion", "reward", "correct", "reason"),
    [
        (ans("3*5+7"), 1.0, True, "correct"),
        (ans(" ( 3 * 5 ) + 7 "), 1.0, True, "correct"),
        (ans("7+5*3"), 1.0, True, "correct"),
        (ans("3*5+7 = 22"), 1.0, True, "correct"),  # a stated value that is true
        (ans("3+5+7 = 22"), 0.1, False, "wrong_stated_value"),  # stating the target does not help
        (ans("3+5+7"), 0.1, False, "wrong_value"),
        (ans("3*5"), 0.1, False, "wrong_numbers"),  # a number unused
        (ans("3*5+7+7"), 0.1, False, "wrong_numbers"),  # a number reused
        (ans("3*5+8-1"), 0.1, False, "wrong_numbers"),  # numbers not given
        (ans("3**5+7"), 0.1, False, "parse_error"),  # power is not an operation here
        (ans("35//5+7"), 0.1, False, "parse_error"),
        (ans("3//5+7"), 0.1, False, "parse_error"),
        (ans("2.5*3+7"), 0.1, False, "bad_char"),  # decimals are invalid (TinyZero read 2 and 5)
        (ans("-3+5*7"), 0.1, False, "parse_error"),  # no unary minus
        (ans("abs(3)*5+7"), 0.1, False, "bad_char"),  # names and calls
        (ans("__import__('os')"), 0.1, False, "bad_char"),
        (ans("(3*5+7"), 0.1, False, "parse_error"),
        (ans(""), 0.1, False, "parse_error"),
        (ans("03*5+7"), 0.1, False, "bad_number"),
        ("<answer>3*5+7", 0.0, False, "no_answer"),  # unclosed
        ("3*5+7 = 22", 0.0, False, "no_answer"),
        ("", 0.0, False, "no_answer"),
    ],
)
def test_countdown_rules(completion: str, reward: float, correct: bool, reason: str) -> None:
    s = score_countdown(NUMS, 22, completion)
    assert (s.reward, s.correct, s.info["reason"]) == (reward, correct, reason)
    assert s.info["formatted"] == (reward > 0)


def test_last_answer_block_counts_anywhere_not_only_last_line() -> None:
    assert score_countdown(NUMS, 22, ans("3+5+7") + "\n" + ans("3*5+7")).correct
    assert not score_countdown(NUMS, 22, ans("3*5+7") + ans("3+5+7")).correct
    multiline = "<answer>\n3*5\n+7\n</answer>\nsome trailing text"
    assert score_countdown(NUMS, 22, multiline).correct


def test_division_is_exact_and_division_by_zero_is_invalid() -> None:
    # 6 / (1 - 3/4) = 24 exactly; floating point gives 23.999999999999996
    assert score_countdown([1, 3, 4, 6], 24, ans("6/(1-3/4)")).correct
    s = score_countdown([3, 3, 5], 5, ans("5/(3-3)"))
    assert (s.reward, s.info["reason"]) == (0.1, "div_zero")
    assert check_expression("7/2", [7, 2]) * 2 == 7


def test_adversarial_inputs_return_fast() -> None:
    cases = [
        ans("9**9**9**9"),
        ans("(" * 5000 + "3" + ")" * 5000),
        ans("9" * 100_000),
        ans("3*" * 50_000 + "3"),
        "<answer>" * 50_000,
        ans("1+") * 10_000,
        "x" * 1_000_000 + ans("3*5+7"),
    ]
    for text in cases:
        t0 = time.perf_counter()
        s = score_countdown(NUMS, 22, text)
        elapsed = time.perf_counter() - t0
        assert s.reward in (0.0, 0.1, 1.0)
        assert elapsed < 0.5, f"{text[:30]!r}... took {elapsed:.3f}s"


def test_problems_are_solvable_deterministic_and_splits_disjoint() -> None:
    task = get_task("countdown", seed=7, min_numbers=3, max_numbers=4, max_number=30)
    for i in range(40):
        p = task.problem("train", i)
        assert p == task.problem("train", i)
        assert solve(p["numbers"], p["target"]) is not None
        assert task.score(p, ans(solve(p["numbers"], p["target"]))).correct
    train_sets = {tuple(sorted(task.problem("train", i)["numbers"])) for i in range(3000)}
    test_sets = {tuple(sorted(task.problem("test", i)["numbers"])) for i in range(500)}
    assert not train_sets & test_sets
    assert len(test_sets) > 50
    assert Counter(len(task.problem("train", i)["numbers"]) for i in range(200)).keys() == {3, 4}
    assert get_task("countdown", seed=8).problem("train", 0) != get_task("countdown", seed=7).problem(
        "train", 0
    )


def test_prompts_follow_tinyzero() -> None:
    task = get_task("countdown")
    p = {"numbers": [1, 2, 3], "target": 6}
    base = task.prompt(p, "base")
    assert "Using the numbers [1, 2, 3], create an equation that equals 6." in base.user
    assert base.assistant_prefix.endswith("<think>")
    assert task.prompt(p, "compact").user == "3 2 1 -> 6"  # largest first: one canonical order per set
    assert task.difficulty(p) == "n3"


def test_answer_only_prompt_and_line_answers() -> None:
    task = get_task("countdown", think=False)
    p = {"numbers": [5, 3], "target": 8}
    chat = task.prompt(p, "chat")
    assert chat.assistant_prefix == "<answer>" and "<think>" not in chat.user
    assert "(1 + 2) / 3" not in chat.user  # a concrete example gets copied by small models
    # the prompt opened the tag: the answer may end at the end of its line, and is checked the same way
    assert task.score(p, "<answer> 5 + 3 = 8\n\nThe answer is: 8").reward == 1.0
    assert task.score(p, "<answer> 5 + 3").correct
    wrong = task.score(p, "<answer> 5 * 3 = 8\nmore")
    assert (wrong.reward, wrong.info["reason"]) == (0.1, "wrong_stated_value")
    assert task.score(p, "<answer>\nthe answer is 8").reward == 0.0  # nothing on the answer's line
    assert task.score(p, "<answer> 5 - 3 </answer> 5 + 3").reward == 0.1  # a closed tag still wins
    # with thinking (TinyZero's setting, the default) the closing tag stays required
    assert get_task("countdown").score(p, "<answer> 5 + 3").reward == 0.0
