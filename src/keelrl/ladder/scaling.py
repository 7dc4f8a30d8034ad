"""ScaleRL's compute-performance curve (arXiv 2510.13786) and its fit: what an RL ladder (`keelrl ladder`,
ladder/runner.py) fits to each grid point's held-out pass rate.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R is the held-out pass rate after training compute C, R0 its value before training, A the ceiling the curve
saturates at, B the efficiency (how steep), C_mid the compute at which half of the gain A - R0 is made.

Fit (pure numpy, deterministic): points with C <= `warmup` are cut (ScaleRL leaves out the early noisy regime).
R0 is given (the measured start), not fitted. For fixed (B, C_mid) the least-squares A has a closed form, clipped
to [R0, 1] (a pass rate cannot exceed 1); (log B, log C_mid) are searched on a grid, then on finer grids
around the best point (`zoom_grid_search`). Departure from the paper, stated: ScaleRL does not say how it
optimises; a grid is slower than a gradient method but cannot wander off on the flat directions of a sigmoid
seen only on its rising part.

Intervals: `bootstrap_fit` resamples the seeds (with replacement; `resampled_mean`), refits the mean curve each
time and reports percentile intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def _best_a(s: np.ndarray, y: np.ndarray, r0: float) -> tuple[np.ndarray, np.ndarray]:
    """For shapes s [..., N] (the factor 1 / (1 + (C_mid/C)^B)) and targets y [N]: the least-squares A of each
    shape, clipped to [r0, 1], and its residual sum of squares."""
    gain = (s * (y - r0)).sum(-1) / np.maximum((s * s).sum(-1), 1e-300)
    a = np.clip(r0 + gain, r0, 1.0)
    rss = ((r0 + (a - r0)[..., None] * s - y) ** 2).sum(-1)
    return a, rss


def zoom_grid_search(
    evaluate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    lo: Sequence[float],
    hi: Sequence[float],
    points: int,
    rounds: int,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Minimise over a box: a grid of `points` per dimension, then `rounds - 1` grids of 9 points per dimension
    spanning 2 steps either side of the best point so far (each halves the step). `evaluate(coords [G, D]) ->
    (loss [G], payload [G, ...])` (the payload: what the caller solved in closed form at each point). Returns
    (loss, coords [D], payload) of the best point; ties go to the first in grid order. The one search behind
    every fit of the ladder."""
    lo_, hi_ = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    best: tuple[float, np.ndarray, np.ndarray] = (np.inf, lo_, np.empty(0))
    for r in range(rounds):
        n = points if r == 0 else 9
        axes = [np.linspace(lo_[k], hi_[k], n) for k in range(len(lo_))]
        coords = np.stack([m.ravel() for m in np.meshgrid(*axes, indexing="ij")], -1)  # [G, D]
        loss, payload = evaluate(coords)
        k = int(np.argmin(loss))
        if loss[k] < best[0]:
            best = (float(loss[k]), coords[k], payload[k])
        step = (hi_ - lo_) / (n - 1)
        lo_, hi_ = best[1] - 2 * step, best[1] + 2 * step
    return best


def fit_sigmoid(
    compute: Sequence[float], score: Sequence[float], r0: float, warmup: float = 0.0
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

    def evaluate(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # (ln B, ln C_mid) [G, 2]
        s = 1.0 / (1.0 + np.exp(np.exp(coords[:, :1]) * (coords[:, 1:] - log_c)))  # [G, N]
        a, rss = _best_a(s, y, r0)
        return rss, a

    # C_mid from 100x below the first point to 1000x beyond the last; B from 0.1 to 10
    lo = [np.log(0.1), log_c.min() - np.log(100.0)]
    hi = [np.log(10.0), log_c.max() + np.log(1000.0)]
    rss_best, (lb_best, lm_best), a_best = zoom_grid_search(evaluate, lo, hi, 81, 7)
    return SigmoidFit(r0, float(a_best), float(np.exp(lb_best)), float(np.exp(lm_best)), rss_best, len(c))


def resampled_mean(
    scores: np.ndarray, rng: np.random.Generator, eval_problems: int, scale: float = 1.0
) -> np.ndarray:
    """One bootstrap draw of the mean curve of `scores` [seeds, points]. S >= 2 seeds: the mean plus each seed's
    departure from it times a standard normal draw (a wild bootstrap: a seed's curve moves as one, and S = 3
    seeds give a continuous spread, not 10 resamples), over S and times sqrt(S / (S - 1)), so the draw varies
    as a fresh mean of S seeds would; `scale` widens it further (a t draw's sqrt(dof / chi2)). One seed: every
    score redrawn as a binomial pass rate over `eval_problems` problems (> 0), the only noise known without a
    second seed."""
    s = len(scores)
    if s == 1:
        p = np.clip(scores[0], 0.0, 1.0)
        return rng.binomial(eval_problems, p) / eval_problems if eval_problems > 0 else p
    mean = scores.mean(0)
    return mean + rng.standard_normal(s) @ (scores - mean) / s * np.sqrt(s / (s - 1)) * scale


def central_interval(values: np.ndarray | Sequence[float], level: float) -> tuple[float, float]:
    """The percentile interval holding the central `level` share of `values`."""
    lo, hi = np.percentile(values, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


@dataclass(frozen=True)
class FitIntervals:
    fit: SigmoidFit  # the fit of the mean curve over all seeds
    a: tuple[float, float]
    b: tuple[float, float]
    c_mid: tuple[float, float]
    resamples: int
    draws: np.ndarray  # [resamples, 3]: (A, B, C_mid) of each resample, for predictions that combine fits


def bootstrap_fit(
    compute: Sequence[float],
    seed_scores: Sequence[Sequence[float]],
    r0: float,
    warmup: float = 0.0,
    eval_problems: int = 0,
    resamples: int = 200,
    level: float = 0.95,
    dof: int = 0,
) -> FitIntervals:
    """Fit the mean over seeds of the scores [S, N] (one row per seed, at the shared `compute` points), with
    percentile intervals of A, B and C_mid over refits to `resampled_mean` draws, each widened by
    sqrt(dof / chi2_dof) when `dof` (the seed noise's degrees of freedom, e.g. pooled over a ladder's points)."""
    scores = np.asarray(seed_scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(compute):
        raise ValueError(f"seed_scores must be [seeds, {len(compute)}], got {scores.shape}")
    full = fit_sigmoid(compute, scores.mean(0), r0, warmup)
    rng = np.random.default_rng(0)
    params = []
    for _ in range(resamples):
        scale = np.sqrt(dof / rng.chisquare(dof)) if dof else 1.0
        f = fit_sigmoid(compute, resampled_mean(scores, rng, eval_problems, scale), r0, warmup)
        params.append((f.a, f.b, f.c_mid))
    p = np.array(params)
    a, b, c_mid = (central_interval(p[:, k], level) for k in range(3))
    return FitIntervals(full, a, b, c_mid, resamples, p)


@dataclass(frozen=True)
class SizeFit:
    """One sigmoid per model size with shared efficiency B and sizes tied by two laws, x = ln N - x_ref:
    A(N) = a0 + a1 x (clipped to [R0, 1]) and ln C_mid(N) = c0 + c1 x."""

    a0: float
    a1: float
    b: float
    c0: float
    c1: float
    x_ref: float
    rss: float

    def curve(self, params: float, r0: float, compute: np.ndarray) -> np.ndarray:
        x = np.log(params) - self.x_ref
        a = float(np.clip(self.a0 + self.a1 * x, r0, 1.0))
        return sigmoid_curve(compute, r0, a, self.b, float(np.exp(self.c0 + self.c1 * x)))


def fit_size_sigmoid(
    params: Sequence[float],
    compute: Sequence[np.ndarray],
    score: Sequence[np.ndarray],
    r0: Sequence[float],
    warmup: Sequence[float],
) -> SizeFit:
    """Least-squares fit of (a0, a1, B, c0, c1) to every size's (compute, score) points after its warm-up cut,
    R0 given per size. For each (B, c0, c1) on a grid, (a0, a1) are linear least squares (then A is clipped to
    [R0, 1] and the residual recomputed); the grid zooms in as in `fit_sigmoid`. Sharing B and tying A
    and C_mid across sizes leaves 5 parameters for all sizes' points, where separate fits have 3 per size and
    wander along the A-C_mid ridge of a curve seen only up to its middle."""
    x = np.log(np.asarray(params, np.float64))
    x_ref = float(x.mean())
    cs = [np.asarray(c, np.float64) for c in compute]
    keeps = [c > w for c, w in zip(cs, warmup)]
    counts = [int(k.sum()) for k in keeps]  # points each size keeps after its warm-up cut
    xv, rv = np.repeat(x - x_ref, counts), np.repeat(np.asarray(r0, np.float64), counts)
    yv = np.concatenate([np.asarray(y, np.float64)[k] for y, k in zip(score, keeps)])
    lc = np.log(np.concatenate([c[k] for c, k in zip(cs, keeps)]))
    if len(set(x)) < 2 or len(yv) < 6:
        raise ValueError("a size fit needs at least two model sizes and 6 points after the warm-up cuts")

    def evaluate(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # (ln B, c0, c1) [G, 3]
        lb, c0, c1 = coords[:, 0], coords[:, 1], coords[:, 2]
        lcm = c0[:, None] + c1[:, None] * xv[None, :]  # ln C_mid of each point's size, [G, P]
        s = 1.0 / (1.0 + np.exp(np.clip(np.exp(lb)[:, None] * (lcm - lc[None, :]), -500, 500)))
        t = yv[None, :] - rv[None, :] * (1.0 - s)  # = a0 s + a1 x s
        u, v = s, s * xv[None, :]
        uu, uv, vv = (u * u).sum(1), (u * v).sum(1), (v * v).sum(1)
        tu, tv = (t * u).sum(1), (t * v).sum(1)
        det = np.maximum(uu * vv - uv * uv, 1e-300)
        a0 = (tu * vv - tv * uv) / det
        a1 = (tv * uu - tu * uv) / det
        a = np.clip(a0[:, None] + a1[:, None] * xv[None, :], rv[None, :], 1.0)
        rss = ((rv[None, :] + (a - rv[None, :]) * s - yv[None, :]) ** 2).sum(1)
        return rss, np.stack([a0, a1], -1)

    lo = [np.log(0.1), lc.min() - np.log(100.0), -1.0]
    hi = [np.log(10.0), lc.max() + np.log(1000.0), 3.0]
    rss, (lb_, c0_, c1_), (a0_, a1_) = zoom_grid_search(evaluate, lo, hi, 25, 9)
    return SizeFit(float(a0_), float(a1_), float(np.exp(lb_)), float(c0_), float(c1_), x_ref, rss)


def bootstrap_size_fit(
    params: Sequence[float],
    compute: Sequence[np.ndarray],
    seed_scores: Sequence[np.ndarray],
    r0: Sequence[float],
    warmup: Sequence[float],
    eval_problems: int = 0,
    resamples: int = 200,
) -> tuple[SizeFit, list[SizeFit]]:
    """The joint fit of every size's mean curve, and `resamples` refits to each size's `resampled_mean`, all
    sizes' draws widened by one sqrt(dof / chi2_dof) per refit (dof: the seeds' degrees of freedom over every
    size), so that the spread of a few seeds' means is not taken as known."""
    means = [np.asarray(s, np.float64).mean(0) for s in seed_scores]
    full = fit_size_sigmoid(params, compute, means, r0, warmup)
    rng = np.random.default_rng(0)
    dof = sum(len(s) - 1 for s in seed_scores)  # of the seed noise, pooled over sizes
    draws = []
    for _ in range(resamples):
        scale = np.sqrt(dof / rng.chisquare(dof)) if dof else 1.0
        rows = [resampled_mean(np.asarray(s, np.float64), rng, eval_problems, scale) for s in seed_scores]
        draws.append(fit_size_sigmoid(params, compute, rows, r0, warmup))
    return full, draws
