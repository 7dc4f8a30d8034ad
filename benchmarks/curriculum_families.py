"""The task families of benchmarks/curriculum.py: each one's task and parameters over every difficulty bucket,
its hardest bucket alone (the fixed_hard arm), the base model's pretraining text, and its answer budget.
Buckets are easiest first; the last is the hardest. Every family uses the compact template and answers only,
so a ~1M-parameter character model runs every arm on a CPU (what each base learns: docs/curriculum.md).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keelrl.core.seeds import stable_hash
from keelrl.recipes.demo import corpus_text, target_blind_example
from keelrl.tasks import get_task
from keelrl.tasks.cipher import ALPHABET, make_key

COUNTDOWN_PARAMS: dict[str, Any] = {  # keelrl demo's task (numbers 1..50), over 2, 3 and 4 numbers
    "min_numbers": 2,
    "max_numbers": 4,
    "min_number": 1,
    "max_number": 50,
    "max_target": 2500,
    "test_fraction": 0.3,
}
MULTIPLY_PARAMS: dict[str, Any] = {"digits_a": 3, "digits_b": 1, "min_digits": 1, "test_fraction": 0.1}


def multiply_corpus(task: Any, index: int, seed: int) -> str:
    """One pretraining line of the multiply family: a training problem of each rung in turn, with its product
    (the compact template's `a*b` line, then the answer). 800 steps leave the tiny model imperfect at every
    rung: greedy 0.49 / 0.18 / 0.05 on 1x1 / 2x1 / 3x1 (a base that knows some arithmetic, as a pretrained
    model does)."""
    buckets = task.buckets()
    problem = task.problem_in(buckets[index % len(buckets)], "train", index // len(buckets))
    return f"{problem['a']}*{problem['b']}\n<answer>{problem['a'] * problem['b']}</answer>"


# keelrl demo's two-number Countdown, 1 to 4 problems per prompt (tasks/countdown_set.py)
COUNTDOWN_SET_PARAMS: dict[str, Any] = {
    **COUNTDOWN_PARAMS,
    "min_numbers": 2,
    "max_numbers": 2,
    "min_problems": 1,
    "max_problems": 4,
}


def countdown_set_corpus(task: Any, index: int, seed: int) -> str:
    """One pretraining line of the countdown_set family: a training set of each size in turn, every problem
    with a random target and a target-blind answer (keelrl.recipes.demo's corpus, per problem): the format, not the
    skill, so the base solves a problem at about chance (1/3) and a set of k at about chance^k."""
    pairs = set_examples(task, index, seed)
    lines, answers = zip(*pairs, strict=True)
    return "\n".join(lines) + f"\n<answer>{';'.join(answers)}</answer>"


def set_examples(task: Any, index: int, seed: int) -> list[tuple[str, str]]:
    """The makings of corpus line `index`: a training set of each size in turn, as (prompt line, target-blind
    equation) per problem."""
    buckets = task.buckets()
    problem = task.problem_in(buckets[index % len(buckets)], "train", index // len(buckets))
    rng = random.Random(stable_hash("countdown_set_corpus", seed, index))
    return [target_blind_example(task.items, item["numbers"], rng) for item in problem["items"]]


def countdown_set_restated_corpus(task: Any, index: int, seed: int) -> str:
    """`countdown_set_corpus` with a scratchpad: before the answer block, each problem's line again with its
    equation (`8 7 -> 15 = 8-7`), so the equation is chosen right after its own target on every rung, as on x1.
    The task still scores only the answer block; the lines are the base model's habit, not a rule."""
    pairs = set_examples(task, index, seed)
    lines, answers = zip(*pairs, strict=True)
    worked = "".join(f"{line} = {answer}\n" for line, answer in pairs)
    return "\n".join(lines) + f"\n{worked}<answer>{';'.join(answers)}</answer>"


# a secret substitution key, words of 1 to 4 letters (tasks/cipher.py)
CIPHER_PARAMS: dict[str, Any] = {"min_length": 1, "max_length": 4}
CIPHER_CANDIDATES = 5  # letters the base considers for each letter's substitute, the right one among them


def cipher_corpus(task: Any, index: int, seed: int) -> str:
    """One pretraining line of the cipher family: a training word of each length in turn, every letter
    replaced by one of CIPHER_CANDIDATES letters drawn at random (`key_candidates`; the key's image is one of
    them). The base learns the format and where each letter's substitute goes, and narrows each substitute
    to five letters without knowing which: about 1/5 per letter, (1/5)^k per word of k letters."""
    buckets = task.buckets()
    word = task.problem_in(buckets[index % len(buckets)], "train", index // len(buckets))["word"]
    candidates = key_candidates(task.params.key_seed, seed)
    rng = random.Random(stable_hash("cipher_corpus", seed, index))
    return f"{word} ->\n<answer>{''.join(rng.choice(candidates[c]) for c in word)}</answer>"


@functools.cache
def key_candidates(key_seed: int, seed: int) -> dict[str, tuple[str, ...]]:
    """Per letter, the key's image and CIPHER_CANDIDATES - 1 other letters (drawn once per key and seed,
    not per corpus line)."""
    out = {}
    for letter, image in make_key(key_seed).items():
        others = [c for c in ALPHABET if c != image]
        rng = random.Random(stable_hash("cipher_candidates", seed, letter))
        out[letter] = (image, *rng.sample(others, CIPHER_CANDIDATES - 1))
    return out


# reasoning-gym's spell_backward, L0-L2: words of 3, 5 and 7 letters
SPELL_PARAMS: dict[str, Any] = {"max_level": 2}


def question_answer_corpus(task: Any, index: int, seed: int) -> str:
    """One pretraining line of a reasoning-gym family: a training problem of each level in turn, its question
    and its reference answer, as the compact template shows them (question, then `<answer>answer</answer>`)."""
    buckets = task.buckets()
    problem = task.problem_in(buckets[index % len(buckets)], "train", index // len(buckets))
    return f"{problem['question']}\n<answer>{problem['answer']}</answer>"


@dataclass(frozen=True)
class Family:
    """A task family with difficulty buckets (easiest first; the last is the hardest): the task over every
    bucket, its hardest bucket alone (the fixed_hard arm), the pretraining text of line i, the answer budget."""

    task: str
    params: dict[str, Any]
    hard_params: dict[str, Any]
    corpus: Callable[[Any, int, int], str]
    max_new_tokens: int
    max_positions: int = 128  # the base model's context (prompt and answer)
    # the base's pretraining: (steps, peak lr) per stage, each a fresh cosine schedule on new corpus lines;
    # keelrl demo's one stage unless the family's base needs longer to learn its format
    pretrain_stages: tuple[tuple[int, float], ...] = ((800, 3e-3),)


FAMILIES: dict[str, Family] = {
    "countdown": Family(
        "countdown",
        COUNTDOWN_PARAMS,
        {**COUNTDOWN_PARAMS, "min_numbers": 4, "max_numbers": 4},
        corpus_text,  # type: ignore[arg-type]
        32,
    ),
    "multiply": Family(
        "multiply", MULTIPLY_PARAMS, {**MULTIPLY_PARAMS, "min_digits": 3}, multiply_corpus, 24
    ),
    "countdown_set": Family(
        "countdown_set",
        COUNTDOWN_SET_PARAMS,
        {**COUNTDOWN_SET_PARAMS, "min_problems": 4},
        countdown_set_corpus,
        48,
    ),
    "countdown_set_restated": Family(
        "countdown_set",
        COUNTDOWN_SET_PARAMS,
        {**COUNTDOWN_SET_PARAMS, "min_problems": 4},
        countdown_set_restated_corpus,
        128,
        max_positions=256,
    ),
    "cipher": Family(
        "cipher",
        CIPHER_PARAMS,
        {**CIPHER_PARAMS, "min_length": 4},
        cipher_corpus,
        24,
        # one stage of 2000 steps left 40% of its sampled len4 letters outside their candidates
        pretrain_stages=((2000, 3e-3), (2000, 1e-3)),
    ),
    "spell_backward": Family(
        "reasoning_gym:spell_backward",
        SPELL_PARAMS,
        {**SPELL_PARAMS, "min_level": 2},
        question_answer_corpus,
        20,
    ),
}


def buckets_of(family: Family) -> list[str]:
    return get_task(family.task, **family.params).buckets()  # type: ignore[attr-defined]
