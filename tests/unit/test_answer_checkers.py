"""The answer checkers' edge cases, for every task that reads an answer (countdown, countdown_set, multiply,
cipher, reasoning_gym, self-play proposals, countdown_search's statistics): only ASCII digits are numbers (every
Unicode decimal digit, category Nd, is tried), the whole completion is searched in time linear in its length (a
10,000-character answer, answers after long text, adversarial inputs), TinyZero's exact prompt wording as the
`qwen_instruct` template, and reasoning-gym curriculum levels checked when the ladder is made.
benchmarks/checker_agreement.py compares the checkers with TinyZero's and reasoning-gym's own scorers."""

from __future__ import annotations

import re
import sys
import time
import unicodedata

import pytest

from keelrl.models.load import build_char_tokenizer
from keelrl.rollout import render_prompt
from keelrl.stages.selfplay.countdown import parse_proposal
from keelrl.tasks import TaskError, get_task
from keelrl.tasks.base import NON_ASCII_DIGIT, last_answer
from keelrl.tasks.countdown import score_countdown
from keelrl.tasks.countdown_search import behaviour

# every decimal digit outside ASCII, with its value (Arabic-Indic, Devanagari, full-width, mathematical, ...)
DIGITS = [
    (chr(c), unicodedata.digit(chr(c)))
    for c in range(sys.maxunicode + 1)
    if unicodedata.category(chr(c)) == "Nd" and c > 0x7F
]
NUMBERS, TARGET = [1234, 5678, 90], 1234 + 5678 + 90  # every digit 0-9 appears in "1234+5678+90"


def with_digit(text: str, digit: str, value: int) -> str:
    """`text` with its first ASCII `value` replaced by the look-alike `digit`."""
    return text.replace(str(value), digit, 1)


def test_there_are_hundreds_of_digits_python_reads_as_numbers() -> None:
    assert len(DIGITS) > 600 and {v for _, v in DIGITS} == set(range(10))
    assert all(int(d) == v for d, v in DIGITS)  # what makes them dangerous: int() and \d accept every one
    assert all(NON_ASCII_DIGIT.search(d) for d, _ in DIGITS) and not NON_ASCII_DIGIT.search("0123456789")


def test_countdown_counts_only_ascii_digits_as_numbers() -> None:
    good = "<answer>1234+5678+90</answer>"
    assert score_countdown(NUMBERS, TARGET, good).reward == 1.0
    # the audit's case: an Arabic-Indic zero in front of 26 scored 1.0
    assert score_countdown([26, 79, 18], 123, "<answer>٠26+79+18</answer>").reward == 0.1
    for digit, value in DIGITS:
        s = score_countdown(NUMBERS, TARGET, with_digit(good, digit, value))
        assert (s.reward, s.correct, s.info["reason"]) == (0.1, False, "bad_char"), hex(ord(digit))
        if value == 2:  # a look-alike in a stated value is no value
            assert not score_countdown(NUMBERS, TARGET, f"<answer>1234+5678+90 = 700{digit}</answer>").correct
    # countdown_set (each item is Countdown's checker) and countdown_tools' calculator share the grammar
    cset = get_task("countdown_set")
    problem = cset.problem("train", 0)
    answer = cset.reference_answer(problem)
    assert answer is not None and cset.score(problem, f"<answer>{answer}</answer>").correct
    for digit, value in DIGITS[::7]:
        if str(value) in answer:
            assert not cset.score(problem, f"<answer>{with_digit(answer, digit, value)}</answer>").correct


def test_multiply_counts_only_ascii_digits_as_numbers() -> None:
    task = get_task("multiply", digits_a=5, digits_b=5)
    problem = task.problem("train", 3)
    product = str(problem["a"] * problem["b"])
    assert task.score(problem, f"<answer>{product}</answer>").correct
    for digit, value in DIGITS:
        if str(value) in product:
            s = task.score(problem, f"<answer>{with_digit(product, digit, value)}</answer>")
            assert (s.reward, s.info["reason"]) == (0.0, "not_an_integer"), hex(ord(digit))


def test_cipher_counts_only_ascii_letters_as_letters() -> None:
    task = get_task("cipher")
    problem = task.problem("train", 0)
    answer = task.reference_answer(problem)
    assert task.score(problem, f"<answer>{answer}</answer>").correct
    # every character that is not ASCII but whose lower case is an ASCII letter (the Kelvin sign, ...)
    lookalikes = [chr(c) for c in range(0x80, sys.maxunicode + 1) if re.fullmatch("[a-z]", chr(c).lower())]
    assert "\u212a" in lookalikes  # K
    for ch in lookalikes:
        forged = answer.replace(ch.lower(), ch, 1) if ch.lower() in answer else ch + answer[1:]
        s = task.score(problem, f"<answer>{forged}</answer>")
        assert (s.correct, s.info["reason"]) == (False, "not_ascii"), hex(ord(ch))


def test_reasoning_gym_counts_only_ascii_digits_as_numbers() -> None:
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'keelrl[envs]')")
    task = get_task("reasoning_gym:products", timeout_s=0)
    problem = task.problem("test", 0)
    answer = str(problem["answer"])
    assert task.score(problem, f"<answer>{answer}</answer>").correct
    for digit, value in DIGITS:
        if str(value) in answer:
            s = task.score(problem, f"<answer>{with_digit(answer, digit, value)}</answer>")
            assert (s.reward, s.info["reason"]) == (0.0, "non_ascii_digit"), hex(ord(digit))


def test_self_play_proposals_and_search_statistics_read_only_ascii_digits() -> None:
    assert parse_proposal("12 37 -> 49") == {"numbers": [12, 37], "target": 49}
    problem = {"numbers": [12, 37], "target": 49}
    assert behaviour(problem, "12+37=49\n<answer>12+37</answer>")["nodes"] == 1.0
    for digit, _ in DIGITS:
        assert parse_proposal(f"12 37 -> 4{digit}") is None
        assert behaviour(problem, f"12+37={digit}{digit}\n<answer>12+37</answer>")["nodes"] == 0.0


# ------------------------------------------------------------------------------------------ long answers


def test_last_answer_searches_the_whole_completion() -> None:
    answer = "".join(f"{i % 97:02d} " for i in range(3334))[:10_000]  # 10,000 characters
    text = "<think>" + "x" * 20_000 + "</think><answer>" + answer + "</answer>" + " tail" * 2_000
    assert len(answer) == 10_000 and last_answer(text) == answer
    # what re.findall(r"<answer>(.*?)</answer>", re.DOTALL) would give last, on nested and broken tags
    for t in [
        "<answer>a<answer>b</answer>",
        "<answer>a</answer></answer>",
        "</answer><answer>c",
        "<answer></answer>",
    ]:
        found = re.findall(r"<answer>(.*?)</answer>", t, re.DOTALL)
        assert last_answer(t) == (found[-1] if found else None)


def test_every_checker_finds_an_answer_after_or_before_long_text() -> None:
    before, after = "Let me think. " * 800, " I am sure." * 1_000  # 11,200 and 11,000 characters
    countdown = get_task("countdown")
    p = countdown.problem("train", 0)
    ref = countdown.reference_answer(p)
    assert countdown.score(p, f"{before}</think><answer>{ref}</answer>{after}").correct
    multiply = get_task("multiply")
    p = multiply.problem("train", 0)
    assert multiply.score(p, f"{before}<answer>{p['a'] * p['b']}</answer>{after}").correct
    cipher = get_task("cipher")
    p = cipher.problem("train", 0)
    assert cipher.score(p, f"{before}<answer>{cipher.reference_answer(p)}</answer>{after}").correct
    cset = get_task("countdown_set")
    p = cset.problem("train", 1)
    assert cset.score(
        p, f"<answer>{before}</answer><answer>{cset.reference_answer(p)}</answer>{after}"
    ).correct


def test_reasoning_gym_scores_a_10000_character_answer() -> None:
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'keelrl[envs]')")
    task = get_task(
        "reasoning_gym:number_sorting", timeout_s=0, size=4, params={"min_numbers": 1500, "max_numbers": 1500}
    )
    problem = task.problem("train", 0)
    answer = str(problem["answer"])
    assert len(answer) > 10_000
    s = task.score(problem, f"<think>{'x' * 5_000}</think><answer>{answer}</answer> done")
    assert s.correct and s.reward == 1.0  # the last 2,032 characters were searched before: no_answer


ADVERSARIAL = {  # 1.6-2 MB each; the old regex rescanned to the end from every unclosed tag (hours)
    "unclosed tags": "<answer>" * 200_000,
    "unclosed tag then text": "<answer>" + "(" * 2_000_000,
    "closing tags only": "</answer>" * 200_000,
    "many blocks": "<answer>1</answer>" * 100_000,
    "nested opens": "<answer>" * 100_000 + "</answer>",
    "equals signs": "<answer>" + "= " * 500_000 + "1 </answer>",
    "stated value tail": "<answer>1+2 =" + " " * 1_000_000 + "3x</answer>",
    "digits": "<answer>" + "9" * 1_000_000 + "</answer>",
    "parentheses": "<answer>" + "(" * 500_000 + "1" + ")" * 500_000 + "</answer>",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_checkers_take_linear_time_on_adversarial_completions(name: str) -> None:
    """A hang detector, not a speed target: each checker reads each character a bounded number of times, so a
    2 MB completion takes milliseconds; a quadratic search would take hours (2e6 squared steps)."""
    text = ADVERSARIAL[name]
    tasks = [get_task(n) for n in ("countdown", "multiply", "cipher", "countdown_set")]
    t0 = time.process_time()
    last_answer(text)
    for task in tasks:
        task.score(task.problem("train", 0), text)
    assert time.process_time() - t0 < 5.0


# ---------------------------------------------------------------------------- TinyZero's prompt wording

# TinyZero's examples/data_preprocess/countdown.py, make_prefix: the prompt text (data, not code) for both of its
# templates, with {numbers} as a Python list
TINYZERO_QWEN_INSTRUCT = (
    "<|im_start|>system\nYou are a helpful assistant. You first thinks about the reasoning process in the mind "
    "and then provides the user with the answer.<|im_end|>\n<|im_start|>user\n Using the numbers {numbers}, "
    "create an equation that equals {target}. You can use basic arithmetic operations (+, -, *, /) and each "
    "number can only be used once. Show your work in <think> </think> tags. And return the final answer in "
    "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.<|im_end|>\n<|im_start|>assistant\n"
    "Let me solve this step by step.\n<think>"
)
TINYZERO_BASE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer.\nUser: Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> "
    "</think> tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 "
    "</answer>.\nAssistant: Let me solve this step by step.\n<think>"
)


@pytest.mark.parametrize(
    "template, expected", [("qwen_instruct", TINYZERO_QWEN_INSTRUCT), ("base", TINYZERO_BASE)]
)
def test_countdown_prompts_are_tinyzeros_word_for_word(template: str, expected: str) -> None:
    tok = build_char_tokenizer()  # one token per character: the decoded ids are the rendered text
    task = get_task("countdown")
    for i in range(5):
        problem = task.problem("train", i)
        ids = render_prompt(tok, task.prompt(problem, template), template)  # type: ignore[arg-type]
        text = tok.decode(ids, skip_special_tokens=True)
        assert text == expected.format(numbers=problem["numbers"], target=problem["target"])
        completion = task.prompt(problem, template).assistant_prefix + " ...</think>\n<answer>0</answer>"
        assert task.score(problem, completion).reward == 0.1  # the scorer sees the prefix, as before


# -------------------------------------------------------------------- reasoning-gym curriculum levels


def test_every_curriculum_level_is_checked_when_the_ladder_is_made() -> None:
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'keelrl[envs]')")
    # game_of_life_halting's level 2 has a few boards: no train question for problem 4 (problem 0 was fine)
    with pytest.raises(
        TaskError, match=r"curriculum level L2 cannot produce problems .*train problem 4.*max_level = 1"
    ):
        get_task("reasoning_gym:game_of_life_halting", timeout_s=0).buckets()
    assert get_task("reasoning_gym:game_of_life_halting", timeout_s=0, max_level=1).buckets() == ["L0", "L1"]
    with pytest.raises(TaskError, match=r"level L4 cannot produce problems .*; change its params"):
        get_task("reasoning_gym:spell_backward", timeout_s=0, min_level=4, max_level=4).buckets()


def test_a_generator_that_gives_up_on_a_seed_is_asked_again_with_the_next() -> None:
    """reasoning-gym's countdown at level 1 gives up on some seeds ("Failed to generate valid expression"): its
    problems crashed the adaptive curriculum; now the next attempt's seed is used (shown on chain_sum, fast)."""
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'keelrl[envs]')")
    task = get_task("reasoning_gym:chain_sum", timeout_s=0, max_level=0)
    assert task.buckets() == ["L0"]
    calls: list[int] = []
    real = task._generator

    def flaky(level: int | None, ds_seed: int):  # the first seed of every problem fails, as level 1's do
        calls.append(ds_seed)
        if len(calls) == 1:
            raise ValueError("Failed to generate valid expression after 100 attempts")
        return real(level, ds_seed)

    task._generator = flaky  # type: ignore[method-assign]
    problem = task.problem_in("L0", "train", 2)
    assert len(calls) >= 2 and problem["source"]["seed"] == calls[-1] != calls[0]
    assert task.score(problem, f"<answer>{problem['answer']}</answer>").correct

    def broken(level: int | None, ds_seed: int):
        raise ValueError("Failed to generate valid expression after 100 attempts")

    task._generator = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"train problem 3: each try failed .*Failed to generate"):
        task.problem_in("L0", "train", 3)
