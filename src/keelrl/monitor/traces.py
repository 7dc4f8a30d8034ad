"""Statistics of sampled text shared by the trainer's metrics, the guards and the doctor."""

from __future__ import annotations

from collections.abc import Sequence

REPETITION_N = 4
REPETITION_THRESHOLD = 0.5


def repetition_rate(tokens: Sequence[int], n: int = REPETITION_N) -> float:
    """Share of the completion's n-grams that repeat an earlier n-gram (0 = none repeat). Sequences with
    fewer than 2n tokens count as 0: too short to call repetitive."""
    if len(tokens) < 2 * n:
        return 0.0
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def is_repetitive(
    tokens: Sequence[int], n: int = REPETITION_N, threshold: float = REPETITION_THRESHOLD
) -> bool:
    """More than `threshold` of the n-grams are repeats: e.g. a 4-token loop repeated 3 times or more."""
    return repetition_rate(tokens, n) > threshold
