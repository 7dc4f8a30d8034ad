"""Estimators and intervals (pure functions of per-problem records; numpy only).

Every metric is a mean over problems of a per-problem value (`problem_metrics`), so each problem counts
once, and one bootstrap over problems gives every interval:
- `accuracy`: greedy accuracy (a problem's value is 1 if the greedy completion is correct). With no greedy
  pass it is `mean@n` (the report's `settings.accuracy_from` says which).
- `mean@n`: mean correctness of the n samples (= pass@1 estimated from n samples).
- `pass@k`: the unbiased estimator of Chen et al. (2021), see `pass_at_k`.
- `maj@k`: majority vote over k samples' answers, averaged over k-subsets like pass@k (`maj_at_k`). Ties
  go to the answer whose first vote came earliest: samples are i.i.d., so in expectation this equals
  breaking ties uniformly at random, and it is deterministic.
- `reward/mean`, `format_rate`, `truncated_frac` (stopped by the token limit), `length/mean` (completion
  tokens): from the greedy pass when there is one, else from the sampled pass; with both passes the
  sampled pass's are also reported as `sampled/reward/mean`, ...
Intervals (`ci95`) are seeded percentile bootstrap intervals over problems (2000 resamples by default). They
cover problem-sampling noise; the decoding noise of a problem's n samples is inside its value.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from keelrl.core.seeds import stable_hash
from keelrl.evals.run import EPISODE_STATS, SAMPLE_STATS

if TYPE_CHECKING:
    from keelrl.evals.run import ProblemResult

BOOTSTRAP_RESAMPLES = 2000
MAJ_MAX_SUBSETS = 2000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples, c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), the chance a
    random k-subset holds a correct one, computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) (no huge binomials)."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


# ASCII digits only: the checkers read no other digit as a number (tasks/base.py, NON_ASCII_DIGIT)
_SEPARATED_INT_RE = re.compile(r"^[+-]?[0-9]{1,3}(?:[,_][0-9]{3})+$")
_PLAIN_INT_RE = re.compile(r"^[+-]?[0-9]+$")


def normalize_answer(answer: str | None) -> str | None:
    """The key under which answers vote together in maj@k: whitespace removed, case folded, and an integer
    with thousands separators (`1,234`, `1_234`), a sign or leading zeros in canonical form. Empty: None (no
    vote). Textual: `1+2` and `2+1` are different answers."""
    if answer is None:
        return None
    key = "".join(answer.split()).casefold()
    if _SEPARATED_INT_RE.match(key) or _PLAIN_INT_RE.match(key):
        key = str(int(key.replace(",", "").replace("_", "")))
    return key or None


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Is the majority answer among `answers` (after `normalize_answer`; None abstains) correct? A tie goes
    to the answer voted first; no votes is wrong. The winner is correct when its first vote was."""
    keys = [normalize_answer(a) for a in answers]
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return False
    # most_common orders equal counts by first occurrence: the winner is the tied answer voted first
    return bool(correct[keys.index(counts.most_common(1)[0][0])])


@functools.lru_cache(maxsize=64)
def _subsets(n: int, k: int, seed: int) -> np.ndarray:
    """[S, k] ascending sample indices: all k-subsets of range(n), or MAJ_MAX_SUBSETS seeded random ones."""
    if math.comb(n, k) <= MAJ_MAX_SUBSETS:
        out = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
    else:
        rng = np.random.default_rng(seed)
        out = np.sort(np.argsort(rng.random((MAJ_MAX_SUBSETS, n)), axis=1)[:, :k], axis=1)
    out.flags.writeable = False
    return out


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int, seed: int = 0) -> float:
    """maj@k of one problem: the fraction of k-subsets of its n samples (in sample order) whose
    `majority_vote` is correct, over the subsets `_subsets` gives."""
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"{n} answers but {len(correct)} correctness flags")
    if not 1 <= k <= n:
        raise ValueError(f"maj@{k} needs 1 <= k <= n, got n={n}")
    keys = [normalize_answer(a) for a in answers]
    vocab = {key: g for g, key in enumerate(dict.fromkeys(k_ for k_ in keys if k_ is not None))}
    if not vocab:
        return 0.0
    G = len(vocab)
    ids = np.array([vocab[k_] if k_ is not None else -1 for k_ in keys])  # [n]
    ok = np.asarray(correct, dtype=bool)  # [n]
    subsets = _subsets(n, k, seed)  # [S, k]
    S = len(subsets)
    sub_ids = ids[subsets]  # [S, k]
    valid = sub_ids >= 0  # [S, k]
    flat = (np.arange(S)[:, None] * G + sub_ids)[valid]
    counts = np.bincount(flat, minlength=S * G).reshape(S, G)  # [S, G] votes per answer
    votes = np.where(valid, np.take_along_axis(counts, np.maximum(sub_ids, 0), axis=1), 0)  # [S, k]
    best = votes.max(axis=1)  # [S]
    winner_pos = np.argmax(votes == best[:, None], axis=1)  # [S] first position holding a winning answer
    winner = subsets[np.arange(S), winner_pos]  # [S]
    return float((ok[winner] & (best > 0)).mean())


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return sorted({*ks, n}) if n >= 1 else []


def problem_metrics(
    greedy: Sequence[ProblemResult] | None, sampled: Sequence[ProblemResult] | None, ks: Sequence[int] = ()
) -> dict[str, np.ndarray]:
    """Per-problem value of every metric ([P] arrays, in order) from the `greedy` and/or `sampled` pass."""
    table: dict[str, np.ndarray] = {}

    def means(results: Sequence[ProblemResult], attr: str) -> np.ndarray:
        return np.array(
            [np.mean(getattr(r, attr)) if getattr(r, attr) else 0.0 for r in results], dtype=np.float64
        )

    if sampled:
        n_min = min(len(r.correct) for r in sampled)
        if too_big := [k for k in ks if k > n_min]:
            k = too_big[0]
            raise ValueError(f"pass@{k} needs at least {k} samples per problem; the sampled pass has {n_min}")
        for k in ks:
            table[f"pass@{k}"] = np.array([pass_at_k(len(r.correct), sum(r.correct), k) for r in sampled])
        for k in ks:
            if k >= 2:
                table[f"maj@{k}"] = np.array([maj_at_k(r.answers, r.correct, k, seed=k) for r in sampled])
        table["mean@n"] = means(sampled, "correct")
    main = greedy if greedy else sampled
    if not main:
        return table
    table = {"accuracy": means(main, "correct"), **table}
    stats = {**SAMPLE_STATS, **(EPISODE_STATS if all(r.turns for r in main) else {})}
    table.update({name: means(main, attr) for name, attr in stats.items()})
    if greedy and sampled:
        table.update({f"sampled/{name}": means(sampled, attr) for name, attr in stats.items()})
    return table


def _resample_weights(num: int, resamples: int, seed: int) -> np.ndarray:
    """[R, num] multiplicities of a with-replacement resample of `num` items (rows sum to `num`)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num, size=(resamples, num))  # [R, num]
    offsets = (np.arange(resamples) * num)[:, None]  # [R, 1]
    return (
        np.bincount((idx + offsets).ravel(), minlength=resamples * num)
        .reshape(resamples, num)
        .astype(np.float64)
    )


def bootstrap_means(matrix: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """matrix [M, P] (M metrics over P problems) -> [R, M] means over R bootstrap resamples of the problems
    (the same resamples for every metric). Work is chunked so memory stays bounded for large P."""
    matrix = np.atleast_2d(np.asarray(matrix, dtype=np.float64))  # [M, P]
    num = matrix.shape[1]
    if num == 0:
        raise ValueError("bootstrap over zero problems")
    chunk = max(1, min(resamples, 4_000_000 // num))
    out = np.empty((resamples, matrix.shape[0]))
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        w = _resample_weights(num, rows, stable_hash("bootstrap", seed, start))  # [r, P]
        out[start : start + rows] = w @ matrix.T / num  # [r, M]
    return out


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """draws [R, ...] -> (lo, hi) percentile interval at `level` along the first axis."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be between 0 and 1, got {level}")
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(draws, [alpha, 1.0 - alpha], axis=0)
    return lo, hi


def metric_intervals(
    table: Mapping[str, np.ndarray], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """{metric: {"value": mean, "ci95": [lo, hi]}} for a per-problem table, one shared bootstrap."""
    names = list(table)
    if not names:
        return {}
    matrix = np.stack([table[n] for n in names])  # [M, P]
    lo, hi = percentile_interval(bootstrap_means(matrix, resamples, seed), level)
    values = matrix.mean(axis=1)
    # Clamp: a percentile of resampled means can differ from the mean by rounding when all values agree.
    return {
        n: {"value": float(v), "ci95": [float(min(a, v)), float(max(b, v))]}
        for n, v, a, b in zip(names, values, lo, hi)
    }
