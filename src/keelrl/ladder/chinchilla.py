"""The pretraining law of Hoffmann et al. 2022 (Chinchilla, arXiv 2203.15556, their approach 3):

    L(N, D) = E + A / N^alpha + B / D^beta

L is the held-out loss after D training tokens with N parameters; E the irreducible loss; A, alpha and B, beta
what finite size and finite data cost. With compute C = 6 N D, the loss-optimal split grows as
N_opt ~ C^(beta / (alpha + beta)) and D_opt ~ C^(alpha / (alpha + beta)).

Fit (pure numpy, deterministic): for each (alpha, beta) on a grid the loss is linear in (E, A, B), solved by
non-negative least squares (every subset of the three terms, batched; the best feasible one); the grid then
zooms in around the best point (`scaling.zoom_grid_search`, the search of every ladder fit). What a residual is
(`Residuals`): "absolute", L - fit; or "relative", log L - log fit, as the paper measures error. The relative fit
stays linear in (E, A, B): it minimises the squared error of each point divided by its measured L, which equals
the log error to first order. Relative residuals keep a ladder's first, steep points (losses several times the
target's) from setting the target's error bar in the target's own units. Departures from
the paper, stated: squared error rather than a Huber loss (a ladder here has a dozen points and no outliers to
resist), and a residual bootstrap rather than the paper's initialisations, giving a prediction interval for the
target's measured loss, not only for the law (`bootstrap_chinchilla`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from keelrl.ladder.scaling import central_interval, zoom_grid_search


def chinchilla_loss(
    n: np.ndarray, d: np.ndarray, e: float, a: float, alpha: float, b: float, beta: float
) -> np.ndarray:
    """L(N, D). Worked numbers: E 1, A 10, alpha 0.5, B 100, beta 0.5 -> L(100, 10000) = 1 + 1 + 1 = 3."""
    return e + a * np.asarray(n, np.float64) ** -alpha + b * np.asarray(d, np.float64) ** -beta


Residuals = Literal["absolute", "relative"]


def residuals(y: np.ndarray, fitted: np.ndarray, kind: Residuals) -> np.ndarray:
    """Worked numbers: y [2, 0.5], fit [1, 0.5] -> absolute [1, 0], relative [ln 2, 0]."""
    return np.log(y / fitted) if kind == "relative" else y - fitted


def from_residuals(fitted: np.ndarray, r: np.ndarray, kind: Residuals) -> np.ndarray:
    """The losses whose residuals about `fitted` are `r` (the inverse of `residuals`): fit * e^r if relative."""
    return fitted * np.exp(r) if kind == "relative" else fitted + r


@dataclass(frozen=True)
class ChinchillaFit:
    e: float
    a: float
    alpha: float
    b: float
    beta: float
    rss: float
    points: int

    def predict(self, n: np.ndarray, d: np.ndarray) -> np.ndarray:
        return chinchilla_loss(n, d, self.e, self.a, self.alpha, self.b, self.beta)

    @property
    def params_exponent(self) -> float | None:
        """a in N_opt ~ C^a (the share of extra compute that should go to parameters); None when the fit
        dropped the size or the data term (A or B = 0): then the split is not defined by the fit."""
        if self.a <= 0.0 or self.b <= 0.0:
            return None
        return self.beta / (self.alpha + self.beta)


_SUBSETS = [s for k in (3, 2, 1) for s in itertools.combinations(range(3), k)]


def _nnls_rss(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For design matrices x [G, P, 3] and targets y [P]: non-negative least-squares coefficients [G, 3] and
    residual sums of squares [G], by solving every subset of columns and keeping the best feasible one."""
    g = x.shape[0]
    best_rss = np.full(g, np.inf)
    best_coef = np.zeros((g, 3))
    for cols in _SUBSETS:
        xs = x[:, :, list(cols)]
        gram = np.einsum("gpi,gpj->gij", xs, xs) + 1e-12 * np.eye(len(cols))
        rhs = np.einsum("gpi,p->gi", xs, y)
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
        rss = ((np.einsum("gpi,gi->gp", xs, coef) - y) ** 2).sum(-1)
        ok = (coef >= 0).all(-1) & (rss < best_rss)
        full = np.zeros((g, 3))
        full[:, list(cols)] = coef
        best_rss = np.where(ok, rss, best_rss)
        best_coef = np.where(ok[:, None], full, best_coef)
    return best_coef, best_rss


def fit_chinchilla(
    params: Sequence[float], tokens: Sequence[float], loss: Sequence[float], kind: Residuals = "absolute"
) -> ChinchillaFit:
    """Least-squares fit of E, A, alpha, B, beta (all >= 0) to (N, D, L) points, exponents in [0.01, 3], on
    `kind` residuals (`rss`: the sum of squares the fit minimised, in the loss's units or as shares of it)."""
    n = np.asarray(params, np.float64)
    d = np.asarray(tokens, np.float64)
    y = np.asarray(loss, np.float64)
    if len(y) < 5:
        raise ValueError(f"a Chinchilla fit has 5 parameters and needs at least 5 points, got {len(y)}")
    if len(set(n)) < 2 or len(set(d)) < 2:
        raise ValueError("a Chinchilla fit needs at least two model sizes and two token counts")
    if kind == "relative" and (y <= 0).any():
        raise ValueError("relative residuals need positive losses")
    scale = 1.0 / y if kind == "relative" else np.ones_like(y)

    def evaluate(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # (ln alpha, ln beta) [G, 2]
        alpha, beta = np.exp(coords[:, 0]), np.exp(coords[:, 1])
        x = np.stack(
            [np.ones((len(alpha), len(y))), n[None, :] ** -alpha[:, None], d[None, :] ** -beta[:, None]], -1
        )  # [G, P, 3]
        coef, rss = _nnls_rss(x * scale[None, :, None], y * scale)
        return rss, coef

    lo, hi = np.log([0.01, 0.01]), np.log([3.0, 3.0])
    rss, (la_best, lb_best), (e, a, b) = zoom_grid_search(evaluate, lo, hi, 41, 7)
    return ChinchillaFit(
        float(e), float(a), float(np.exp(la_best)), float(b), float(np.exp(lb_best)), rss, len(y)
    )


def bootstrap_chinchilla(
    params: Sequence[float],
    tokens: Sequence[float],
    loss: Sequence[float],
    at: tuple[float, float],
    resamples: int = 200,
    level: float = 0.95,
    seed_var: tuple[float, int, float] | None = None,
    target_seeds: int = 1,
    kind: Residuals = "absolute",
) -> tuple[ChinchillaFit, float, tuple[float, float], dict[str, float]]:
    """The fit on all points (each a mean over its seeds), its prediction at `at` = (N, D), and a prediction
    interval for the mean loss of `target_seeds` runs there: the spread of refits to the fitted values plus the
    residuals drawn with replacement (scaled by sqrt(P / dof): the design, every size and token count, is kept),
    each plus one draw of the target's own departure from the law, normal times sqrt(dof / chi2_dof) (a t draw).
    That departure's variance: the residual variance s2 = RSS / dof (dof = P minus the fitted parameters), which
    holds seed noise and what the law's form misses; with `seed_var` = (variance of one run, its dof, harmonic
    mean seeds per point) from replicate seeds, s2 splits into seed noise / seeds per point and a lack of fit,
    and the target's is lack of fit + seed noise / target_seeds. With `kind` "relative" every variance (seed_var's
    too) is of log losses and a draw r becomes the loss prediction * e^r."""
    n, d, y = (np.asarray(v, np.float64) for v in (params, tokens, loss))
    full = fit_chinchilla(n, d, y, kind=kind)
    fitted = full.predict(n, d)
    dof = max(1, len(y) - 1 - 2 * (full.a > 0) - 2 * (full.b > 0))
    resid = residuals(y, fitted, kind)
    s2 = float((resid**2).sum()) / dof  # RSS / dof for absolute residuals
    var = s2
    if seed_var is not None and seed_var[1] > 0:
        lack = max(0.0, s2 - seed_var[0] / seed_var[2])
        var = lack + seed_var[0] / target_seeds
    rng = np.random.default_rng(0)
    resid = resid * np.sqrt(len(y) / dof)
    preds = np.array([
        float(fit_chinchilla(n, d, from_residuals(fitted, rng.choice(resid, len(y)), kind), kind=kind).predict(
            np.array(at[0]), np.array(at[1])))
        for _ in range(resamples)
    ])  # fmt: skip
    departure = rng.standard_normal(20 * resamples) * np.sqrt(var * dof / rng.chisquare(dof, 20 * resamples))
    draws = from_residuals(np.repeat(preds, 20), departure, kind)
    pred = float(full.predict(np.array(at[0]), np.array(at[1])))
    return full, pred, central_interval(draws, level), {"residual_var": s2, "target_var": var, "dof": dof}
