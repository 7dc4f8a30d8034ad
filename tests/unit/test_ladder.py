"""Scaling ladders: Chinchilla's law (worked numbers, recovery, bootstrap coverage), the run plan, the compute
estimate, a run's record, and the size-law prediction (it must cover a known truth, and miss a wrong one)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from keelrl.config import ConfigError
from keelrl.config.ladder import LadderConfig
from keelrl.config.load import parse_override
from keelrl.ladder.analysis import (
    AnalysisError,
    fit_point,
    rl_fits,
    rl_prediction,
    rl_validation,
    seed_noise,
    seed_var,
)
from keelrl.ladder.chinchilla import (
    Residuals,
    bootstrap_chinchilla,
    chinchilla_loss,
    fit_chinchilla,
    from_residuals,
    residuals,
)
from keelrl.ladder.kinds import RLKind, rl_flops_per_token_param
from keelrl.ladder.plan import parse_axis, plan_runs
from keelrl.ladder.scaling import sigmoid_curve

# ---- Chinchilla

RESIDUALS: tuple[Residuals, ...] = ("absolute", "relative")


def test_chinchilla_worked_numbers_and_recovery() -> None:
    assert float(chinchilla_loss(100, 10_000, 1.0, 10.0, 0.5, 100.0, 0.5)) == pytest.approx(3.0)
    n = np.repeat([7e4, 2.5e5, 5.5e5, 9.8e5], 3)
    d = np.tile([2e5, 4e5, 8e5], 4)
    y = chinchilla_loss(n, d, 0.4, 30.0, 0.5, 400.0, 0.45)
    for kind in RESIDUALS:
        f = fit_chinchilla(n, d, y, kind=kind)
        assert (f.e, f.a, f.alpha, f.b, f.beta) == pytest.approx((0.4, 30.0, 0.5, 400.0, 0.45), rel=0.02)
        assert f.params_exponent == pytest.approx(0.45 / 0.95, rel=0.02)


def test_residuals_worked_numbers_and_their_inverse() -> None:
    y, fitted = np.array([2.0, 0.5]), np.array([1.0, 0.5])
    assert residuals(y, fitted, "absolute") == pytest.approx([1.0, 0.0])
    assert residuals(y, fitted, "relative") == pytest.approx([np.log(2.0), 0.0])
    for kind in RESIDUALS:
        assert from_residuals(fitted, residuals(y, fitted, kind), kind) == pytest.approx(y)
    with pytest.raises(ValueError, match="positive"):
        fit_chinchilla(
            np.repeat([1e4, 1e5, 1e6], 2), np.tile([1e4, 1e5], 3), [1, 1, 1, 1, 1, 0], kind="relative"
        )


def test_relative_intervals_are_in_the_targets_units() -> None:
    """A ladder's first points have losses several times the target's; with errors a share of the loss (5%
    here), absolute residuals hand the target those points' error bar, relative ones its own: both intervals
    hold a fresh run at the target, the relative one at about half the width."""
    n = np.repeat([2e4, 5e4, 1e5, 2e5], 3)
    d = np.tile([2e4, 1e5, 5e5], 4)  # losses 2.8 down to 0.88; the target's is 0.71
    truth = (0.3, 20.0, 0.4, 300.0, 0.5)
    clean = chinchilla_loss(n, d, *truth)
    at = (4e5, 1e6)
    true = float(chinchilla_loss(np.array(at[0]), np.array(at[1]), *truth))
    inside: dict[Residuals, int] = dict.fromkeys(RESIDUALS, 0)
    widths: dict[Residuals, list[float]] = {kind: [] for kind in RESIDUALS}
    for k in range(10):
        rng = np.random.default_rng(200 + k)
        y, measured = clean * np.exp(rng.normal(0, 0.05, 12)), true * np.exp(rng.normal(0, 0.05))
        for kind in RESIDUALS:
            _, _, (lo, hi), _ = bootstrap_chinchilla(n, d, y, at, resamples=20, kind=kind)
            inside[kind] += lo <= measured <= hi
            widths[kind].append(hi - lo)
    assert inside["relative"] >= 9 and inside["absolute"] >= 9
    assert np.median(widths["relative"]) < 0.7 * np.median(widths["absolute"])


def test_chinchilla_coefficients_stay_non_negative() -> None:
    # loss that *rises* with data: the unconstrained B would be negative; NNLS drops the term instead
    n = np.repeat([1e4, 1e5, 1e6], 3)
    d = np.tile([1e4, 1e5, 1e6], 3)
    y = 1.0 + 5.0 * n**-0.3 - 0.5 * d**-0.2
    f = fit_chinchilla(n, d, y)
    assert min(f.e, f.a, f.b) >= 0.0 and f.b == 0.0 and f.params_exponent is None


def test_chinchilla_bootstrap_covers_a_held_out_point() -> None:
    rng = np.random.default_rng(0)
    n = np.repeat([5e4, 1e5, 2e5, 4e5], 3)
    d = np.tile([1e5, 2e5, 4e5], 4)
    truth = (0.3, 20.0, 0.4, 300.0, 0.5)
    y = chinchilla_loss(n, d, *truth) + rng.normal(0, 0.003, len(n))
    at = (8e5, 8e5)
    _, pred, (lo, hi), _ = bootstrap_chinchilla(n, d, y, at, resamples=60)
    true = float(chinchilla_loss(np.array(at[0]), np.array(at[1]), *truth))
    assert lo <= true <= hi and lo < pred < hi
    assert hi - lo < 0.1  # an interval that says something


def test_chinchilla_prediction_interval_holds_one_runs_noise() -> None:
    """The interval is for one run's measured loss: the residual variance RSS / dof (dof = points minus fitted
    parameters) is the target's own noise, and replicate seeds split it into seed noise and lack of fit."""
    n = np.repeat([5e4, 1e5, 2e5, 4e5], 3)
    d = np.tile([1e5, 2e5, 4e5], 4)
    truth = (0.3, 20.0, 0.4, 300.0, 0.5)
    clean = chinchilla_loss(n, d, *truth)
    at, sd = (3e5, 3e5), 0.004  # inside the grid: the fit is sure there, one run is not
    inside = 0
    for k in range(10):  # 10 ladders of one seed per point, each validated on one run at `at`
        rng = np.random.default_rng(100 + k)
        fit, _, (lo, hi), noise = bootstrap_chinchilla(n, d, clean + rng.normal(0, sd, 12), at, resamples=20)
        assert noise["dof"] == 12 - 5 and noise["residual_var"] == pytest.approx(fit.rss / 7)
        assert noise["target_var"] == noise["residual_var"]  # no replicates: all of it is the target's
        measured = float(chinchilla_loss(np.array(at[0]), np.array(at[1]), *truth)) + rng.normal(0, sd)
        inside += lo <= measured <= hi
    assert inside >= 9
    # replicates (seed variance 0.004^2 from 12 dof, 3 seeds a point): lack of fit = s2 - 0.004^2 / 3
    *_, noise = bootstrap_chinchilla(
        n, d, clean + 0.01 * (-1) ** np.arange(12), at, 10, seed_var=(sd**2, 12, 3.0)
    )
    lack = noise["residual_var"] - sd**2 / 3
    assert lack > 0 and noise["target_var"] == pytest.approx(lack + sd**2)
    *_, noise3 = bootstrap_chinchilla(
        n, d, clean + 0.01 * (-1) ** np.arange(12), at, 10, 0.95, (sd**2, 12, 3.0), 3
    )
    assert noise3["target_var"] == pytest.approx(lack + sd**2 / 3)  # the mean of 3 target runs


# ---- plan


def test_plan_is_the_product_of_axes_times_seeds_and_names_are_stable() -> None:
    lad = LadderConfig(axes={"model.path": ["/b/base32", "/b/base64"], "algo.lr": [1e-4, 3e-4]}, seeds=2)
    grid, target = plan_runs(lad)
    assert len(grid) == 8 and target == []
    assert {r.label for r in grid} == {
        "path=base32,lr=0.0001", "path=base32,lr=0.0003", "path=base64,lr=0.0001", "path=base64,lr=0.0003"
    }  # fmt: skip
    assert len({r.name for r in grid}) == 8 and grid[0].name == "path=base32_lr=0.0001__seed0"
    # the --set items put the point back in a config exactly
    assert [parse_override(o) for o in grid[0].overrides()] == [
        (["model", "path"], "/b/base32"),
        (["algo", "lr"], 1e-4),
    ]


def test_target_and_axis_errors() -> None:
    lad = LadderConfig(axes={"model.path": ["a", "b"]}, seeds=3, target={"model.path": "c"}, target_seeds=2)
    _grid, target = plan_runs(lad)
    assert [(r.role, r.seed, r.label) for r in target] == [
        ("target", 0, "target:path=c"),
        ("target", 1, "target:path=c"),
    ]
    # paths are shown by the trailing parts that tell them apart (run directories all end in final/)
    lad = LadderConfig(
        axes={"model.path": ["r/b96/final", "r/b128/final"]}, seeds=1, target={"model.path": "r/b224/final"}
    )
    grid, target = plan_runs(lad)
    assert [r.label for r in grid + target] == ["path=b96/final", "path=b128/final", "target:path=b224/final"]
    assert [r.name for r in grid] == ["path=b96_final__seed0", "path=b128_final__seed0"]
    with pytest.raises(ConfigError, match="a point of the grid"):
        plan_runs(LadderConfig(axes={"model.path": ["a", "b"]}, target={"model.path": "b"}))
    with pytest.raises(ConfigError, match="repeats"):
        plan_runs(LadderConfig(axes={"algo.lr": [1e-4, 1e-4]}))
    assert parse_axis("algo.lr=1e-4, 3e-4") == ("algo.lr", [1e-4, 3e-4])
    assert parse_axis("model.path=runs/a,runs/b") == ("model.path", ["runs/a", "runs/b"])
    with pytest.raises(ConfigError, match="KEY=V1,V2"):
        parse_axis("algo.lr")


# ---- compute and records


def _cfg_dict(**algo: object) -> dict:
    base = {
        "ppo_epochs": 1,
        "kl_coef": 0.0,
        "old_logprobs": "sampler",
        "advantage": "grpo",
        "critic": "separate",
    }
    return {
        "algo": {**base, **algo},
        "rollout": {"max_staleness": 0},
        "eval": {"problems": 200, "samples": 1},
    }


def test_flops_per_token_param() -> None:
    assert rl_flops_per_token_param(_cfg_dict()) == 8.0  # sampling forward 2 + update 6
    assert rl_flops_per_token_param(_cfg_dict(kl_coef=0.1)) == 10.0  # + the reference forward
    assert rl_flops_per_token_param(_cfg_dict(ppo_epochs=2, old_logprobs="recompute")) == 16.0
    assert rl_flops_per_token_param(_cfg_dict(advantage="gae")) == 16.0  # + a separate critic


def test_rl_record_accumulates_compute_to_each_eval(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_cfg_dict()))
    (tmp_path / "summary.json").write_text(
        json.dumps({"state": "finished", "steps": 3, "wall_seconds": 5.0, "model": {"parameters": 1000}})
    )
    rows = [
        {"step": 0, "eval/accuracy": 0.2},
        {"step": 1, "tokens/trained": 100.0},
        {"step": 2, "tokens/trained": 50.0},
        {"step": 2, "eval/accuracy": 0.4},  # the eval line of step 2
        {"step": 3, "tokens/trained": 10.0, "eval/accuracy": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = RLKind().record(tmp_path)
    assert RLKind().finished(tmp_path)
    assert rec["steps"] == [0, 2, 3] and rec["accuracy"] == [0.2, 0.4, 0.5]
    assert rec["compute"] == [0.0, 8 * 1000 * 150.0, 8 * 1000 * 160.0]
    assert rec["eval_problems"] == 200 and rec["train_steps"] == 3 and rec["gpu_seconds"] == 0.0
    summary = json.loads((tmp_path / "summary.json").read_text())
    summary["model"]["device"] = "cuda"
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert RLKind().record(tmp_path)["gpu_seconds"] == 5.0


# ---- RL fits and the size-law prediction

STEPS = list(range(0, 101, 10))


def _law(n: float) -> tuple[float, float, float, float]:
    """A made-up truth: (R0, A, B, C_mid) of a model with n parameters."""
    return 0.3, 0.45 + 0.08 * np.log(n / 1e5), 1.6, 4e10 * (n / 1e5) ** 1.1


def _records(
    n: float, seeds: int, noise: float, rng: np.random.Generator, role: str = "grid", label: str = ""
) -> list[dict]:
    r0, a, b, c_mid = _law(n)
    per_step = 8 * n * 3000.0  # FLOPs per step
    compute = [s * per_step for s in STEPS]
    out = []
    for seed in range(seeds):
        clean = [r0, *sigmoid_curve(np.array(compute[1:]), r0, a, b, c_mid).tolist()]
        acc = [r0] + [float(np.clip(v + rng.normal(0, noise), 0, 1)) for v in clean[1:]]
        out.append({
            "label": label or f"n={n:g}", "point": {"model.path": label or f"n={n:g}"}, "role": role, "seed": seed, "parameters": int(n), "eval_problems": 400,
            "steps": STEPS, "compute": compute, "accuracy": acc, "tokens_trained": 3000.0 * 100, "train_steps": 100,
        })  # fmt: skip
    return out


def test_size_law_prediction_covers_the_truth_and_a_wrong_target_misses() -> None:
    rng = np.random.default_rng(1)
    records = [r for n in (1e5, 2e5, 4e5) for r in _records(n, 3, 0.01, rng)]
    fits, draws = rl_fits(records, 0.1, 40, 0.95)
    assert [f["rank_by_a"] for f in fits] == [1, 2, 3] and fits[0]["parameters"] == 400000  # ranked by A
    for f in fits:
        assert f["a_ci"][0] <= _law(f["parameters"])[1] <= f["a_ci"][1]
    nt = 8e5
    p = rl_prediction(
        fits, draws, {"model.path": "big"}, {"model.path"}, int(nt), 8 * nt * 3000.0 * 100, 3, 400, 0.95
    )
    law = p["size_law"]  # the joint fit's slopes and shared B cover the made-up truth
    assert p["method"].startswith("joint size fit") and law["sizes"] == [100000, 200000, 400000]
    assert law["a1_ci"][0] <= 0.08 <= law["a1_ci"][1] and law["c1_ci"][0] <= 1.1 <= law["c1_ci"][1]
    assert law["b_ci"][0] <= 1.6 <= law["b_ci"][1]
    r0, a, b, c_mid = _law(nt)
    truth = float(sigmoid_curve(np.array(8 * nt * 3000.0 * 100), r0, a, b, c_mid))
    lo, hi = p["final_interval"]
    assert lo <= truth <= hi and hi - lo < 0.15
    assert p["final_fit_interval"][0] >= lo - 1e-9  # measurement noise only widens the interval
    target = _records(nt, 3, 0.01, rng, "target", "target:n=8e5")
    v = rl_validation(p, target)
    assert v["inside_interval"] and v["miss"] == 0.0
    # a target that did much worse than any law says: reported as a miss, by how much
    bad = [{**r, "accuracy": [x * 0.5 for x in r["accuracy"]]} for r in target]
    v_bad = rl_validation(p, bad)
    assert not v_bad["inside_interval"] and v_bad["miss"] == pytest.approx(v_bad["final_mean"] - lo)


def test_longer_run_extrapolates_its_own_fit_and_step0_is_required() -> None:
    rng = np.random.default_rng(2)
    records = _records(1e5, 3, 0.005, rng)
    # a second recipe at the same size, with half the gain: the target lengthens the first recipe only
    other = [
        {**r, "label": "lr=b", "point": {"model.path": "n=100000", "algo.lr": "b"},
         "accuracy": [r["accuracy"][0]] + [0.3 + (x - 0.3) / 2 for x in r["accuracy"][1:]]}
        for r in _records(1e5, 3, 0.005, rng)
    ]  # fmt: skip
    for r in records:
        r["point"] = {"model.path": "n=100000", "algo.lr": "a"}
    fits, draws = rl_fits(records + other, 0.1, 60, 0.95)
    target = {"model.path": "n=100000", "algo.lr": "a", "train.steps": 300}
    p = rl_prediction(fits, draws, target, {"train.steps"}, 100000, 8 * 1e5 * 3000.0 * 300, 3, 400, 0.95)
    assert p["method"] == "extrapolation of n=100000's own fit" and p["size_law"] is None
    assert p["a"] == pytest.approx(_law(1e5)[1], abs=0.05)
    q = rl_prediction(
        fits, draws, {**target, "algo.lr": "b"}, {"train.steps"}, 100000, 8e5 * 3000.0 * 300, 3, 400, 0.95
    )
    assert q["method"] == "extrapolation of lr=b's own fit" and q["a"] < p["a"] - 0.05
    no_start = [
        {**r, "steps": r["steps"][1:], "compute": r["compute"][1:], "accuracy": r["accuracy"][1:]}
        for r in records
    ]
    with pytest.raises(AnalysisError, match="at_start"):
        fit_point(no_start, 0.1, 20, 0.95)
    with pytest.raises(AnalysisError, match="two sizes"):
        rl_prediction(fits, draws, {"model.path": "x"}, {"model.path"}, 400000, 1e15, 3, 400, 0.95)


# ---- honest intervals: the seed-noise model and coverage on simulated ladders


def test_seed_noise_worked_numbers() -> None:
    """Four seeds that jump from 0.4 to 0.8: at each eval the seeds' sample variance is 4/3 of
    (m - L)(H - m) (ddof 1 on a two-point sample), 0 where all agree; so kappa = 4/3 and v0 = 0."""
    acc = [
        [0.4, 0.4, 0.4, 0.4, 0.8],
        [0.4, 0.4, 0.4, 0.8, 0.8],
        [0.4, 0.4, 0.8, 0.8, 0.8],
        [0.4, 0.4, 0.8, 0.8, 0.8],
    ]
    fit = {"accuracy": acc, "compute": [0.0, 1.0, 2.0, 3.0, 4.0], "warmup_compute": 0.5, "seeds": 4}
    noise = seed_noise([fit])
    assert noise["kappa"] == pytest.approx(4 / 3) and noise["v0"] == pytest.approx(0.0, abs=1e-12)
    assert (noise["dof"], noise["low"], noise["high"]) == (3, 0.4, 0.8)
    # the variance at a mean of 0.6: 4/3 x 0.2 x 0.2; at the ends only v0
    assert seed_var(np.array([0.6, 0.4]), noise).tolist() == pytest.approx([4 / 3 * 0.04, 0.0])
    assert seed_noise([{**fit, "accuracy": acc[:1], "seeds": 1}])["dof"] == 0  # one seed: nothing known


def _jumping_runs(rng: np.random.Generator, n: float, seeds: int, role: str, label: str) -> list[dict]:
    """Seeds that rise to a plateau of 0.42, then jump to 0.745 at a seed's own step (log-normal about
    65 (n / 1e6)^0.3), as the recorded RL ladder's seeds did (benchmarks/ladder_coverage.py)."""
    r0, steps = 0.35 + 0.02 * rng.standard_normal(), np.arange(0, 101, 10)
    out = []
    for seed in range(seeds):
        jump = 65 * (n / 1e6) ** 0.3 * np.exp(0.25 * rng.standard_normal())
        pre = r0 + (0.42 - r0) * (1 - np.exp(-steps / 4))
        acc = pre + (0.745 - pre) / (1 + np.exp(-(steps - jump) / 4)) + rng.normal(0, 0.012, len(steps))
        acc[0] = r0
        out.append({
            "label": label, "point": {"model.path": label}, "role": role, "seed": seed, "parameters": int(n),
            "eval_problems": 200, "steps": steps.tolist(), "compute": (35400.0 * n * steps).tolist(),
            "accuracy": acc.tolist(), "tokens_trained": 442500.0, "train_steps": 100,
        })  # fmt: skip
    return out


def test_rl_interval_covers_one_seeds_validation_on_simulated_ladders() -> None:
    """Ten ladders (3 sizes x 3 seeds) each validated on one seed of a 2x larger target that is mid-jump: the
    95% interval holds it at least 9 times; the fit's band alone (no seed noise) would hold it far less."""
    inside, fit_only = 0, 0
    for k in range(10):
        rng = np.random.default_rng(1000 + k)
        grid = [r for n in (6e5, 1.06e6, 1.66e6) for r in _jumping_runs(rng, n, 3, "grid", f"n{n:g}")]
        target = _jumping_runs(rng, 3.24e6, 1, "target", "t")
        fits, draws = rl_fits(grid, 0.1, 3, 0.95)
        p = rl_prediction(fits, draws, {"model.path": "t"}, {"model.path"}, int(3.24e6), 35400.0 * 3.24e6 * 100,
                          1, 200, 0.95, resamples=20)  # fmt: skip
        measured = rl_validation(p, target)
        inside += measured["inside_interval"]
        fit_only += p["final_fit_interval"][0] <= measured["final_mean"] <= p["final_fit_interval"][1]
        assert p["seed_noise"]["dof"] == 6 and p["seed_noise"]["kappa"] > 0.2
    assert inside >= 9 and fit_only <= 8
