"""Pairwise preferences: win rates with Wilson intervals, a Bradley-Terry ranking with bootstrap intervals.

The math behind comparing checkpoints by people's (or a judge's) blind votes, pure functions over votes:
- A vote is `(a, b, outcome)` with outcome 1.0 (a preferred), 0.0 (b preferred) or 0.5 (a tie).
- `wilson_interval(wins, n)`: the Wilson score interval of a win rate (Wilson 1927), which stays inside
  [0, 1] and is sane at 0 or n wins, unlike the normal approximation. A tie counts as half a win.
- `bradley_terry(votes, items)`: strengths s_i with P(i beats j) = s_i / (s_i + s_j), fitted by Hunter's
  (2004) minorise-maximise iteration, reported as log-strengths centred at 0 (only differences are
  identified). Departure, stated: a tie is half a win for each side (no Davidson tie parameter), and a
  pseudo-vote of `prior` ties against every other item keeps the fit finite when one item wins every
  vote (a maximum-likelihood strength would be infinite); prior = 0 is the plain MLE.
- `bt_intervals`: percentile bootstrap over votes (resampled with replacement, seeded) for each item's
  log-strength, and the ranking by the point estimate.
- `pair_win_rates` (per model pair, with Wilson intervals), `judge_agreement` (how often two people who judged
  the same pair agree), `verifier_agreement` (how often people prefer the completion the checker accepted,
  where it accepted exactly one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

Vote = tuple[str, str, float]  # (a, b, outcome): 1.0 a preferred, 0.0 b preferred, 0.5 tie


def wilson_interval(wins: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the win rate wins / n (ties as half wins); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def win_matrix(votes: Sequence[Vote], items: Sequence[str]) -> np.ndarray:
    """W [K, K]: W[i, j] = wins of item i over item j (a tie adds 0.5 to both)."""
    index = {name: k for k, name in enumerate(items)}
    W = np.zeros((len(items), len(items)))
    for a, b, outcome in votes:
        if outcome not in (0.0, 0.5, 1.0):
            raise ValueError(
                f"a vote's outcome is 1 (a preferred), 0 (b preferred) or 0.5 (tie), got {outcome}"
            )
        if a == b:
            raise ValueError(f"a vote compares two different items, got {a!r} twice")
        W[index[a], index[b]] += outcome
        W[index[b], index[a]] += 1.0 - outcome
    return W


def bradley_terry(
    votes: Sequence[Vote], items: Sequence[str], prior: float = 0.5, iters: int = 10_000, tol: float = 1e-10
) -> np.ndarray:
    """Log-strengths [K] (mean 0) maximising the Bradley-Terry likelihood of `votes` plus `prior` pseudo-ties
    between every pair of items (Hunter's MM update: s_i <- wins_i / sum_j n_ij / (s_i + s_j))."""
    W = win_matrix(votes, items) + prior / 2 * (1 - np.eye(len(items)))  # [K, K]
    N = W + W.T  # [K, K] comparisons between i and j
    wins = W.sum(axis=1)  # [K]
    s = np.ones(len(items))
    for _ in range(iters):
        denom = (N / (s[:, None] + s[None, :])).sum(axis=1)  # [K]
        new = np.where(denom > 0, wins / np.where(denom > 0, denom, 1.0), s)
        new = new / math.exp(np.log(np.maximum(new, 1e-300)).mean())  # geometric mean 1
        if np.max(np.abs(np.log(np.maximum(new, 1e-300)) - np.log(s))) < tol:
            s = new
            break
        s = new
    logs = np.log(np.maximum(s, 1e-300))
    return logs - logs.mean()


def bt_intervals(
    votes: Sequence[Vote],
    items: Sequence[str],
    prior: float = 0.5,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, dict[str, float]]:
    """Per item: its log-strength, a percentile bootstrap interval over resampled votes, and its rank (1 =
    strongest by the point estimate)."""
    point = bradley_terry(votes, items, prior)
    rng = np.random.default_rng(seed)
    draws = np.empty((resamples, len(items)))
    for r in range(resamples):
        pick = rng.integers(0, len(votes), len(votes)) if votes else np.array([], dtype=int)
        draws[r] = bradley_terry([votes[i] for i in pick], items, prior)
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], axis=0)
    order = np.argsort(-point, kind="stable")
    rank = {items[k]: r + 1 for r, k in enumerate(order)}
    return {
        name: {"log_strength": float(point[k]), "lo": float(lo[k]), "hi": float(hi[k]), "rank": rank[name]}
        for k, name in enumerate(items)
    }


def pair_win_rates(votes: Sequence[Vote], level: float = 0.95) -> dict[tuple[str, str], dict[str, float]]:
    """Per unordered model pair (names sorted): the first model's wins, ties and losses, its win rate (a tie
    half a win) and the rate's Wilson interval."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for a, b, outcome in votes:
        key, value = ((a, b), outcome) if a < b else ((b, a), 1.0 - outcome)
        row = out.setdefault(key, {"wins": 0.0, "ties": 0.0, "losses": 0.0, "n": 0.0})
        row["wins" if value == 1.0 else "losses" if value == 0.0 else "ties"] += 1
        row["n"] += 1
    for row in out.values():
        score = row["wins"] + row["ties"] / 2
        row["rate"] = score / row["n"]
        row["lo"], row["hi"] = wilson_interval(score, int(row["n"]), level)
    return out


def judge_agreement(votes: Sequence[tuple[str, float, str]]) -> dict[str, float]:
    """votes: (item id, outcome, judge). Over every two judges who voted on the same item: the share that
    agree (same outcome), and how many such judge pairs there were."""
    by_item: dict[str, list[tuple[str, float]]] = {}
    for item, outcome, judge in votes:
        by_item.setdefault(item, []).append((judge, outcome))
    agree = total = 0
    for rows in by_item.values():
        for (judge_a, a), (judge_b, b) in itertools.combinations(rows, 2):
            if judge_a != judge_b:
                total += 1
                agree += a == b
    return {"agreement": agree / total if total else float("nan"), "judge_pairs": float(total)}


def verifier_agreement(votes: Sequence[tuple[float, bool | None, bool | None]]) -> dict[str, float]:
    """votes: (outcome for A, A correct, B correct). Over votes where the checker accepted exactly one of the
    two completions: the share that preferred the accepted one (a tie counts half)."""
    decided = [(o, ca) for o, ca, cb in votes if ca is not None and cb is not None and ca != cb]
    if not decided:
        return {"agreement": float("nan"), "votes": 0.0}
    score = sum(o if ca else 1.0 - o for o, ca in decided)
    return {"agreement": score / len(decided), "votes": float(len(decided))}
