"""From a ladder's run records to its fits and its prediction (pure: records in, JSON-ready dicts out).

RL (`rl_fits`, `rl_prediction`): each grid point's seeds give a mean curve of held-out pass rate against
training compute (compute per eval step averaged over seeds), fitted by ScaleRL's sigmoid with bootstrap
intervals (scaling.py); points are ranked by the ceiling A and its interval, not by early reward. Across model
sizes (the target's peers: grid points that agree with it on every axis it does not override, and differ in
parameter count N) one joint fit ties the sizes (`scaling.fit_size_sigmoid`: A and ln C_mid linear in ln N, B
shared: in ScaleRL model scale moves A, the recipe sets B) and R0 is a line in ln N; every bootstrap draw of the joint
fit gives one predicted curve of the target, so its band carries the fit's uncertainty. A
target that is a longer run of a grid point extrapolates that point's own fit instead.

The interval is for what the validation measures, the mean of the target's seeds' final evals, not for the
mean curve: each fit draw's prediction plus one draw of how far that many seeds land from it (`seed_noise`:
the grid's seed-to-seed variance, largest mid-curve, where seeds that learn at different steps part), and
the fit draws come from a wild bootstrap over whole seeds (a seed's curve moves as one), widened for how
few seeds measured that spread (docs/RESULTS.md, "Honest ladder intervals": coverage measured on repeated
and simulated ladders).

Pretraining (`pretrain_fits`): mean held-out loss per grid point, Chinchilla's law (chinchilla.py) over
(N, D), and its prediction at the target's (N, D) with a prediction interval for the target's measured loss,
on relative (log-loss) residuals by default: a ladder's first points lose several times the target's loss, and
with absolute residuals their misfit set the target's error bar (on a real repeated ladder 1.60 wide, lower ends
below 0; relative: 0.62, docs/RESULTS.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from keelrl.ladder.chinchilla import Residuals, bootstrap_chinchilla
from keelrl.ladder.scaling import (
    FitIntervals,
    SizeFit,
    bootstrap_fit,
    bootstrap_size_fit,
    central_interval,
    fit_sigmoid,
    sigmoid_curve,
)

Record = dict[str, Any]  # one run: name, label, seed, role, point + its kind's record (kinds.py)


class AnalysisError(ValueError):
    """The runs cannot be fitted as asked; the message says what is missing."""


def by_label(records: Sequence[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[r["label"]].append(r)
    return dict(groups)


def mean_curve(runs: Sequence[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean compute per step, accuracy [seeds, steps]) over the eval steps every seed logged."""
    steps = sorted(set.intersection(*(set(r["steps"]) for r in runs)))
    if 0 not in steps:
        raise AnalysisError(
            f"{runs[0]['label']}: no eval at step 0; a ladder needs eval.at_start = true (R0)"
        )
    if len(steps) < 4:
        raise AnalysisError(
            f"{runs[0]['label']}: {len(steps)} eval steps; a sigmoid fit needs step 0 and 3 more"
        )
    compute = np.array([[r["compute"][r["steps"].index(s)] for s in steps] for r in runs]).mean(0)
    acc = np.array([[r["accuracy"][r["steps"].index(s)] for s in steps] for r in runs])
    return np.array(steps), compute, acc


def fit_point(
    runs: Sequence[Record], warmup_fraction: float, resamples: int, level: float, dof: int = 0
) -> tuple[dict[str, Any], FitIntervals]:
    """One grid point's fit and intervals; `dof`: the seed noise's degrees of freedom (see bootstrap_fit)."""
    steps, compute, acc = mean_curve(runs)
    r0 = float(acc[:, 0].mean())
    fi = bootstrap_fit(
        compute[1:], acc[:, 1:], r0, warmup=warmup_fraction * compute[-1],
        eval_problems=int(runs[0]["eval_problems"]), resamples=resamples, level=level, dof=dof,
    )  # fmt: skip
    finals = acc[:, -1]
    out = {
        "label": runs[0]["label"],
        "point": runs[0].get("point", {}),
        "parameters": int(runs[0]["parameters"]),
        "seeds": len(runs),
        "steps": steps.tolist(),
        "compute": compute.tolist(),
        "accuracy": acc.tolist(),
        "r0": r0,
        "a": fi.fit.a, "b": fi.fit.b, "c_mid": fi.fit.c_mid,
        "a_ci": list(fi.a), "b_ci": list(fi.b), "c_mid_ci": list(fi.c_mid),
        "warmup_compute": warmup_fraction * float(compute[-1]),
        "points_fitted": fi.fit.points,
        "final_mean": float(finals.mean()),
        "final_sd": float(finals.std(ddof=1)) if len(finals) > 1 else 0.0,
    }  # fmt: skip
    return out, fi


def rl_fits(
    records: Sequence[Record], warmup_fraction: float, resamples: int, level: float
) -> tuple[list[dict[str, Any]], dict[str, FitIntervals]]:
    """One fit per grid point, ranked by A (highest first); its intervals take the seed noise's spread as known
    only as well as every point's seeds together measure it (their degrees of freedom, pooled)."""
    points = by_label([r for r in records if r["role"] == "grid"])
    dof = sum(len(runs) - 1 for runs in points.values())
    both = {label: fit_point(runs, warmup_fraction, resamples, level, dof) for label, runs in points.items()}
    draws = {label: fi for label, (_, fi) in both.items()}
    fits = sorted((fit for fit, _ in both.values()), key=lambda f: -f["a"])
    for rank, f in enumerate(fits, 1):
        f["rank_by_a"] = rank
    return fits, draws


def _size_inputs(
    sizes: Sequence[dict[str, Any]],
) -> tuple[list[float], list[np.ndarray], list[np.ndarray], list[float], list[float]]:
    """(parameters, compute, seed scores, R0, warm-up cut) per size, step 0 left out (it is R0)."""
    return (
        [float(f["parameters"]) for f in sizes],
        [np.array(f["compute"][1:]) for f in sizes],
        [np.array(f["accuracy"])[:, 1:] for f in sizes],
        [f["r0"] for f in sizes],
        [f["warmup_compute"] for f in sizes],
    )


def size_law(
    sizes: Sequence[dict[str, Any]], eval_problems: int, resamples: int, level: float
) -> tuple[dict[str, Any], list[SizeFit]]:
    """The joint fit over model sizes (scaling.fit_size_sigmoid: A and ln C_mid linear in ln N, B shared),
    R0's line in ln N, and the bootstrap draws behind every interval."""
    full, draws = bootstrap_size_fit(*_size_inputs(sizes), eval_problems=eval_problems, resamples=resamples)

    def band(values: list[float]) -> list[float]:
        return list(central_interval(values, level))

    r0_slope, r0_intercept = np.polyfit(np.log([f["parameters"] for f in sizes]), [f["r0"] for f in sizes], 1)
    out = {
        "sizes": [f["parameters"] for f in sizes],
        "form": "A = a0 + a1 (ln N - x_ref), clipped to [R0, 1]; ln C_mid = c0 + c1 (ln N - x_ref); B shared; "
        "R0 = r0 + r1 ln N",
        "a0": full.a0, "a1": full.a1, "b": full.b, "c0": full.c0, "c1": full.c1, "x_ref": full.x_ref, "rss": full.rss,
        "a1_ci": band([d.a1 for d in draws]), "c1_ci": band([d.c1 for d in draws]), "b_ci": band([d.b for d in draws]),
        "r0_line": (float(r0_intercept), float(r0_slope)),  # least squares of R0 on ln N
    }  # fmt: skip
    return out, draws


def seed_noise(fits: Sequence[dict[str, Any]]) -> dict[str, float]:
    """How far one run's accuracy lands from its point's mean: its variance across seeds at every eval after
    the warm-up cut, fitted as v = kappa (m - L) (H - m) + v0 (least squares, kappa and v0 >= 0) in the mean m,
    where [L, H] holds every grid run's accuracy after the warm-up. Accuracies in [L, H] with mean m vary at
    most (m - L) (H - m) (Bhatia-Davis), as much as when seeds jump from L to H at random steps, as every
    recorded seed did: seeds differ most mid-curve, and at either end only by their eval's noise (v0).
    dof: the seeds' degrees of freedom, sum of (seeds - 1) (0: no point has two seeds, nothing is known)."""
    rows = [(np.array(f["accuracy"]), np.array(f["compute"]) > f["warmup_compute"]) for f in fits]
    rows = [acc[:, keep] for acc, keep in rows if len(acc) > 1]
    if not rows:
        return {"kappa": 0.0, "v0": 0.0, "dof": 0, "low": 0.0, "high": 1.0}
    low, high = min(float(a.min()) for a in rows), max(float(a.max()) for a in rows)
    m = np.concatenate([a.mean(0) for a in rows])
    x, v = (m - low) * (high - m), np.concatenate([a.var(0, ddof=1) for a in rows])
    kappa, v0 = np.linalg.lstsq(np.stack([x, np.ones_like(x)], -1), v, rcond=None)[0]
    if kappa < 0:
        kappa, v0 = 0.0, v.mean()
    elif v0 < 0:
        kappa, v0 = x @ v / max(x @ x, 1e-300), 0.0
    dof = sum(len(a) - 1 for a in rows)
    return {"kappa": float(kappa), "v0": float(v0), "dof": dof, "low": low, "high": high}


def seed_var(mean: np.ndarray, noise: dict[str, float]) -> np.ndarray:
    """One run's variance about a mean accuracy, by `seed_noise`'s fit."""
    return noise["kappa"] * np.clip((mean - noise["low"]) * (noise["high"] - mean), 0.0, None) + noise["v0"]


def rl_prediction(
    fits: Sequence[dict[str, Any]],
    draws: dict[str, FitIntervals],
    target_point: dict[str, Any],
    target_keys: set[str],
    target_params: int,
    target_compute: float,
    target_seeds: int,
    eval_problems: int,
    level: float,
    seed: int = 0,
    resamples: int = 0,
) -> dict[str, Any]:
    """The target's predicted curve (median and band on a compute grid up to `target_compute`) and its final
    accuracy with a predictive interval. Its peers are the grid points that agree with `target_point` on every
    axis the target does not override (`target_keys`); a peer of the target's size is the run it lengthens
    (extrapolate its own fit); otherwise the peers are the sizes of the joint size fit."""
    rng = np.random.default_rng(seed)
    peers = [
        f
        for f in fits
        if all(f["point"].get(k) == target_point.get(k) for k in f["point"] if k not in target_keys)
    ]
    grid = np.geomspace(target_compute / 50, target_compute, 40)
    if same := [f for f in peers if f["parameters"] == target_params]:  # a longer run of a grid point
        f = same[0]
        curves = np.stack([sigmoid_curve(grid, f["r0"], a, b, c) for a, b, c in draws[f["label"]].draws])
        method, law, r0 = f"extrapolation of {f['label']}'s own fit", None, f["r0"]
    else:
        sizes = sorted({f["parameters"]: f for f in peers}.values(), key=lambda f: f["parameters"])
        if len(sizes) < 2:
            raise AnalysisError("predicting another model size needs grid points of at least two sizes")
        law, size_draws = size_law(
            sizes, eval_problems, resamples or len(next(iter(draws.values())).draws), level
        )
        r0 = float(np.clip(law["r0_line"][0] + law["r0_line"][1] * np.log(target_params), 0.0, 1.0))
        curves = np.stack([d.curve(target_params, r0, grid) for d in size_draws])
        method = f"joint size fit over {len(sizes)} sizes"

    q = [(1 - level) / 2 * 100, 50, (1 + level) / 2 * 100]
    lo, mid, hi = np.percentile(curves, q, axis=0)
    noise = seed_noise(peers)
    # how far the mean of the target's seeds lands from each fit draw's (20 draws each): the seeds' variance
    # over their count, times sqrt(dof / chi2_dof) for how well the grid measured it (a t draw); no two seeds
    # anywhere: one eval's binomial noise
    mean = np.repeat(curves[:, -1], 20)
    if noise["dof"]:
        spread = noise["dof"] / rng.chisquare(noise["dof"], len(mean))
        var = seed_var(mean, noise) / target_seeds * spread
    else:
        var = np.clip(mean * (1 - mean), 0, None) / max(1, eval_problems * target_seeds)
    measured = mean + rng.standard_normal(len(mean)) * np.sqrt(var)
    plo, pmid, phi = np.percentile(measured, q)
    median_fit = fit_sigmoid(grid, mid, r0)
    return {
        "method": method,
        "size_law": law,
        "parameters": int(target_params),
        "planned_compute": float(target_compute),
        "r0": r0,
        # A, B, C_mid of the median curve, a sigmoid refitted to it: the medians of the draws' parameters
        # need not describe one curve
        "a": median_fit.a, "b": median_fit.b, "c_mid": median_fit.c_mid,
        "curve": {"compute": grid.tolist(), "lo": lo.tolist(), "mid": mid.tolist(), "hi": hi.tolist()},
        "final": float(pmid),
        "final_interval": [float(plo), float(phi)],
        "final_fit_interval": [float(lo[-1]), float(hi[-1])],
        "seed_noise": noise,
        "level": level,
    }  # fmt: skip


def rl_validation(prediction: dict[str, Any], target_runs: Sequence[Record]) -> dict[str, Any]:
    """The target's measurement against its prediction: the mean over seeds of the last eval, and the
    predicted curve at the compute it actually used."""
    steps, compute, acc = mean_curve(target_runs)
    p = prediction
    at_measured = float(sigmoid_curve(np.array(compute[-1]), p["r0"], p["a"], p["b"], p["c_mid"]))
    final = float(acc[:, -1].mean())
    lo, hi = p["final_interval"]
    return {
        "label": target_runs[0]["label"],
        "steps": steps.tolist(),
        "compute": compute.tolist(),
        "accuracy": acc.tolist(),
        "final_mean": final,
        "final_per_seed": acc[:, -1].tolist(),
        "final_compute": float(compute[-1]),
        "predicted_at_final_compute": at_measured,
        **_against(final, lo, hi),
    }


def pretrain_fits(
    records: Sequence[Record],
    at: tuple[float, float] | None,
    resamples: int,
    level: float,
    target_seeds: int = 1,
    kind: Residuals = "relative",
) -> dict[str, Any]:
    """Chinchilla's law over the grid's mean held-out losses, and its prediction at `at` = (N, D) (default:
    the grid's largest N and D) with a prediction interval for the mean loss of `target_seeds` runs
    (`bootstrap_chinchilla` on `kind` residuals; replicate seeds, where a point has them, measure one run's
    noise, of log losses when relative)."""
    points, sq, dof = [], 0.0, 0
    for label, runs in by_label([r for r in records if r["role"] == "grid"]).items():
        losses = np.array([r["loss"] for r in runs])
        spread = np.log(losses) if kind == "relative" else losses
        sq, dof = sq + float(((spread - spread.mean()) ** 2).sum()), dof + len(runs) - 1
        points.append({
            "label": label,
            "parameters": int(runs[0]["parameters"]),
            "tokens": float(np.mean([r["tokens"] for r in runs])),
            "loss": float(losses.mean()),
            "seeds": len(runs),
        })  # fmt: skip
    n, d, y = ([p[k] for p in points] for k in ("parameters", "tokens", "loss"))
    at = at or (max(n), max(d))
    seeds = len(points) / sum(1 / p["seeds"] for p in points)
    seed_var = (sq / dof, dof, seeds) if dof else None
    fit, pred, interval, noise = bootstrap_chinchilla(
        n, d, y, at, resamples, level, seed_var, target_seeds, kind
    )
    return {
        "points": points,
        "fit": {"e": fit.e, "a": fit.a, "alpha": fit.alpha, "b": fit.b, "beta": fit.beta, "rss": fit.rss},
        "params_exponent": fit.params_exponent,
        "form": "L(N, D) = E + A / N^alpha + B / D^beta",
        "prediction": {
            "parameters": at[0],
            "tokens": at[1],
            "loss": pred,
            "interval": list(interval),
            "level": level,
            "target_seeds": target_seeds,
            "residuals": kind,
            "noise": noise,
        },
    }


def pretrain_validation(prediction: dict[str, Any], target_runs: Sequence[Record]) -> dict[str, Any]:
    """The target's mean held-out loss against the predicted interval."""
    lo, hi = prediction["interval"]
    loss = float(np.mean([r["loss"] for r in target_runs]))
    return {
        "label": target_runs[0]["label"],
        "loss": loss,
        "per_seed": [r["loss"] for r in target_runs],
        "tokens": float(np.mean([r["tokens"] for r in target_runs])),
        **_against(loss, lo, hi),
    }


def _against(value: float, lo: float, hi: float) -> dict[str, Any]:
    """Whether a measured value landed inside its predicted interval, and by how much it missed (signed)."""
    return {"inside_interval": bool(lo <= value <= hi), "miss": float(value - np.clip(value, lo, hi))}
