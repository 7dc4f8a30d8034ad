"""ScaleRL's compute-performance curve (arXiv 2510.13786) and its fit, the first piece of scaling ladders
(issue 28: the ladder runner, the size fits and the HTML page are not built yet).

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R is the held-out pass rate after training compute C, R0 its value before training, A the ceiling the curve
saturates at, B the efficiency (how steep), C_mid the compute at which half of the gain A - R0 is made.

Fit (pure numpy, deterministic): points with C <= `warmup` are cut (ScaleRL leaves out the early noisy regime).
R0 is given (the measured start), not fitted. For fixed (B, C_mid) the least-squares A has a closed form, clipped
to [R0, ceiling] (a pass rate cannot exceed 1); (log B, log C_mid) are searched on a grid, then on finer grids
around the best point. Departure from the paper, stated: ScaleRL does not say how it optimises; a grid is slower
than a gradient method but cannot wander off on the flat directions of a sigmoid seen only on its rising part.

Intervals: `bootstrap_fit` resamples the seeds (with replacement) and, optionally, every eval point as a
binomial draw of its `eval_problems` problems, refits the mean curve each time and reports percentile intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def sigmoid_curve(compute: np.ndarray, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """R(C) for compute values C > 0.

    Worked numbers: R0 0.2, A 0.8, B 2, C_mid 100 -> R(100) = 0.5 (half the gain), R(200) = 0.68."""
    c = np.asarray(compute, dtype=np.float64)
    return r0 + (a - r0) / (1.0 + (c_mid / c) ** b)


@dataclass(frozen=True)
class SigmoidFit:
    r0: float
    a: float
    b: float
    c_mid: float
    rss: float  # residual sum of squares over the points fitted
    points: int

    def predict(self, compute: np.ndarray) -> np.ndarray:
        return sigmoid_curve(compute, self.r0, self.a, self.b, self.c_mid)


def _best_a(s: np.ndarray, y: np.ndarray, r0: float, ceiling: float) -> tuple[np.ndarray, np.ndarray]:
    """For shapes s [..., N] (the factor 1 / (1 + (C_mid/C)^B)) and targets y [N]: the least-squares A of each
    shape, clipped to [r0, ceiling], and its residual sum of squares."""
    gain = (s * (y - r0)).sum(-1) / np.maximum((s * s).sum(-1), 1e-300)
    a = np.clip(r0 + gain, r0, ceiling)
    rss = ((r0 + (a - r0)[..., None] * s - y) ** 2).sum(-1)
    return a, rss


def fit_sigmoid(
    compute: Sequence[float],
    score: Sequence[float],
    r0: float,
    warmup: float = 0.0,
    ceiling: float = 1.0,
    rounds: int = 4,
) -> SigmoidFit:
    """Least-squares fit of A, B, C_mid to (compute, score) points with compute > `warmup` (R0 given)."""
    c = np.asarray(compute, dtype=np.float64)
    y = np.asarray(score, dtype=np.float64)
    keep = c > warmup
    c, y = c[keep], y[keep]
    if len(c) < 3:
        raise ValueError(
            f"a sigmoid fit needs 3 points after the warm-up cut (compute > {warmup}), got {len(c)}"
        )
    if (c <= 0).any():
        raise ValueError("compute must be positive")
    log_c = np.log(c)
    # C_mid from 100x below the first point to 1000x beyond the last; B from 0.1 to 10
    lo = np.array([np.log(0.1), log_c.min() - np.log(100.0)])
    hi = np.array([np.log(10.0), log_c.max() + np.log(1000.0)])
    best = (np.inf, 0.0, 0.0, 0.0)
    for _ in range(rounds):
        log_b = np.linspace(lo[0], hi[0], 81)
        log_m = np.linspace(lo[1], hi[1], 81)
        lb, lm = np.meshgrid(log_b, log_m, indexing="ij")  # [81, 81]
        s = 1.0 / (1.0 + np.exp(np.exp(lb)[..., None] * (lm[..., None] - log_c)))  # [81, 81, N]
        a, rss = _best_a(s, y, r0, ceiling)
        i, j = np.unravel_index(int(np.argmin(rss)), rss.shape)
        if rss[i, j] < best[0]:
            best = (float(rss[i, j]), float(a[i, j]), float(lb[i, j]), float(lm[i, j]))
        step = (hi - lo) / 80
        lo = np.array([best[2], best[3]]) - 4 * step
        hi = np.array([best[2], best[3]]) + 4 * step
    rss_best, a_best, lb_best, lm_best = best
    return SigmoidFit(r0, a_best, float(np.exp(lb_best)), float(np.exp(lm_best)), rss_best, len(c))


@dataclass(frozen=True)
class FitIntervals:
    fit: SigmoidFit  # the fit of the mean curve over all seeds
    a: tuple[float, float]
    b: tuple[float, float]
    c_mid: tuple[float, float]
    resamples: int


def bootstrap_fit(
    compute: Sequence[float],
    seed_scores: Sequence[Sequence[float]],
    r0: float,
    warmup: float = 0.0,
    eval_problems: int = 0,
    resamples: int = 200,
    level: float = 0.95,
    seed: int = 0,
    ceiling: float = 1.0,
) -> FitIntervals:
    """Fit the mean over seeds of the scores [S, N] (one row per seed, at the shared `compute` points), with
    percentile intervals of A, B and C_mid: each resample draws S seeds with replacement and, when
    `eval_problems` > 0, replaces every score p by a binomial draw k / n with n = eval_problems."""
    scores = np.asarray(seed_scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(compute):
        raise ValueError(f"seed_scores must be [seeds, {len(compute)}], got {scores.shape}")
    full = fit_sigmoid(compute, scores.mean(0), r0, warmup, ceiling)
    rng = np.random.default_rng(seed)
    params = []
    for _ in range(resamples):
        rows = scores[rng.integers(0, len(scores), len(scores))]
        if eval_problems > 0:
            rows = rng.binomial(eval_problems, np.clip(rows, 0.0, 1.0)) / eval_problems
        f = fit_sigmoid(compute, rows.mean(0), r0, warmup, ceiling)
        params.append((f.a, f.b, f.c_mid))
    p = np.array(params)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]

    def band(k: int) -> tuple[float, float]:
        lo, hi = np.percentile(p[:, k], q)
        return float(lo), float(hi)

    return FitIntervals(full, band(0), band(1), band(2), resamples)
