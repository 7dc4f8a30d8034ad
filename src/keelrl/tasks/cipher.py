"""Cipher: encode a word with a secret substitution key that the policy is never shown, learnt from reward.

A difficulty ladder built from many small skills that compose: the key is 26 separate facts (which letter
each letter becomes), a word of length k is right only when all k letters are, so a policy that knows each
letter's substitute with probability q encodes a word of k letters with probability about q^k. What is learnt
on short words (one letter's substitute) is exactly what long words need, and unlike Countdown sets the answer
for letter j is written by the same copy-and-substitute step at every length. One of the curriculum
benchmark's families: does choosing the rung speed learning (docs/curriculum.md)?

Problem: `{"word": "qev"}` (letters a-z, repeats allowed). The key is a permutation of a-z drawn from
`key_seed`; the answer is the word with every letter replaced by its image (`reference_answer`). Buckets
`len{min_length}` .. `len{max_length}` (letters per word). Words of two or more letters are split into train
and test by the word itself, so a test word never appears in training. One-letter words are the 26 facts
themselves and belong to both splits: holding one out would hold out a letter's substitute from its only
rung where it is taught alone.
Reward: 1.0 for the exact encoding in the last `<answer>` block, else 0.0 (no format credit: on a rung whose
groups have no signal, a format bonus is what a policy learns to game, docs/curriculum.md). `info` counts
the letters right by position (`letters_correct`).
"""

from __future__ import annotations

import random
import string
from typing import Any

from pydantic import Field

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import (
    Prompt,
    Score,
    Split,
    TaskParams,
    Template,
    check_bucket,
    in_test_split,
    instruct_prompt,
    last_answer,
)

ALPHABET = string.ascii_lowercase
USER_TEXT = (
    "Encode the word '{word}' with the secret substitution cipher: every letter becomes one fixed other letter, "
    "the same for every word (you are not told the key; learn it). Write only the encoded word in <answer> "
    "</answer> tags."
)


class CipherParams(TaskParams):
    ranges = ("length",)
    min_length: int = Field(1, ge=1, le=12, description="Shortest word (the easiest bucket).")
    max_length: int = Field(4, ge=1, le=12, description="Longest word (the hardest bucket).")
    key_seed: int = Field(0, description="Seed of the secret key (a permutation of a-z).")
    test_fraction: float = Field(
        0.3, gt=0.0, lt=1.0, description="Share of words held out for the test split."
    )


def make_key(key_seed: int) -> dict[str, str]:
    """The secret substitution: letter -> letter, a permutation of a-z drawn from `key_seed`."""
    images = list(ALPHABET)
    random.Random(stable_hash("cipher_key", key_seed)).shuffle(images)
    return dict(zip(ALPHABET, images, strict=True))


class Cipher:
    """Substitution cipher with a hidden key, all-or-nothing reward (see the module docstring)."""

    name = "cipher"

    def __init__(self, seed: int = 0, **params: Any) -> None:
        self.seed, self.params = seed, CipherParams(**params)
        self.key = make_key(self.params.key_seed)

    def encode(self, word: str) -> str:
        return "".join(self.key[c] for c in word)

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        rng = random.Random(stable_hash("cipher_length", self.seed, split, index))
        return self._word(split, index, rng.randint(self.params.min_length, self.params.max_length))

    def buckets(self) -> list[str]:
        """Difficulty buckets, easiest first: len{min_length} .. len{max_length} (letters per word)."""
        return [f"len{k}" for k in range(self.params.min_length, self.params.max_length + 1)]

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        check_bucket(self, bucket)
        return self._word(split, index, int(bucket.removeprefix("len")), bucket)

    def _word(self, split: Split, index: int, length: int, bucket: str | None = None) -> dict[str, Any]:
        """Seeded draws of a word of `length` letters until one is in `split` (each length its own stream)."""
        for attempt in range(10_000):
            rng = random.Random(stable_hash("cipher", self.seed, split, length, index, attempt))
            word = "".join(rng.choice(ALPHABET) for _ in range(length))
            if length == 1 or in_test_split(word, self.seed, self.params.test_fraction) == (split == "test"):
                return {"word": word}
        where = "" if bucket is None else f" in bucket {bucket}"
        raise RuntimeError(f"cipher: no {split} word{where} for index {index}")

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        word = problem["word"]
        if template == "compact":
            return Prompt("", f"{word} ->", "")
        return instruct_prompt(template, USER_TEXT.format(word=word))

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        answer = last_answer(completion)
        if answer is None:
            return Score(0.0, False, {"formatted": False, "reason": "no_answer", "letters_correct": 0})
        expected, got = self.encode(problem["word"]), answer.strip().lower()
        if not answer.isascii():  # lower() maps some other letters onto ASCII (the Kelvin sign to 'k')
            return Score(0.0, False, {"formatted": True, "reason": "not_ascii", "letters_correct": 0})
        letters = sum(a == b for a, b in zip(expected, got))
        info = {"formatted": True, "letters_correct": letters, "answer": answer[:40]}
        if got == expected:
            return Score(1.0, True, {**info, "reason": "correct"})
        reason = "wrong_length" if len(got) != len(expected) else "wrong_letters"
        return Score(0.0, False, {**info, "reason": reason})

    def difficulty(self, problem: dict[str, Any]) -> str:
        return f"len{len(problem['word'])}"

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        return self.encode(problem["word"])
