"""ScaleRL's sigmoid (ladder/scaling.py): worked numbers, recovery of known parameters, the warm-up cut, the
ceiling, and bootstrap intervals that cover the truth on noisy synthetic seeds."""

from __future__ import annotations

import numpy as np
import pytest

from keelrl.ladder.scaling import bootstrap_fit, fit_sigmoid, sigmoid_curve

TRUE = {"r0": 0.2, "a": 0.8, "b": 1.5, "c_mid": 1000.0}
COMPUTE = np.logspace(1.5, 4.5, 16)  # 30 .. 30,000: both sides of C_mid


def test_curve_worked_numbers() -> None:
    assert sigmoid_curve(np.array([100.0, 200.0]), 0.2, 0.8, 2.0, 100.0).tolist() == pytest.approx(
        [0.5, 0.68]
    )
    # no compute spent beyond the ceiling: far right tends to A, far left to R0
    far = sigmoid_curve(np.array([1e-6, 1e12]), 0.2, 0.8, 2.0, 100.0)
    assert far.tolist() == pytest.approx([0.2, 0.8], abs=1e-9)


def test_noiseless_curve_is_recovered() -> None:
    y = sigmoid_curve(COMPUTE, **TRUE)
    f = fit_sigmoid(COMPUTE, y, TRUE["r0"])
    assert (f.a, f.b, f.c_mid) == pytest.approx((0.8, 1.5, 1000.0), rel=1e-3)
    assert f.rss < 1e-8 and f.points == 16
    assert f.predict(np.array([1000.0])).tolist() == pytest.approx([0.5], abs=1e-4)


def test_warmup_cut_and_ceiling() -> None:
    y = sigmoid_curve(COMPUTE, **TRUE)
    y_bad = y.copy()
    y_bad[:4] = 0.0  # a noisy start that the warm-up cut must leave out
    assert fit_sigmoid(COMPUTE, y_bad, 0.2, warmup=COMPUTE[3]).a == pytest.approx(0.8, rel=1e-3)
    assert fit_sigmoid(COMPUTE, y_bad, 0.2).rss > 0.01  # without the cut the fit cannot match
    # a curve still climbing steeply at the last point: the ceiling caps A at 1
    steep = sigmoid_curve(COMPUTE, 0.2, 1.4, 1.0, 1e5)
    assert fit_sigmoid(COMPUTE, steep, 0.2).a <= 1.0
    with pytest.raises(ValueError, match="3 points"):
        fit_sigmoid(COMPUTE[:2], y[:2], 0.2)


def test_bootstrap_intervals_cover_the_truth_on_noisy_seeds() -> None:
    rng = np.random.default_rng(0)
    n = 200  # problems per eval
    clean = sigmoid_curve(COMPUTE, **TRUE)
    seeds = [rng.binomial(n, clean) / n for _ in range(3)]
    out = bootstrap_fit(COMPUTE, seeds, TRUE["r0"], eval_problems=n, resamples=100)
    assert out.a[0] <= 0.8 <= out.a[1] and out.a[1] - out.a[0] < 0.1
    assert out.b[0] <= 1.5 <= out.b[1]
    assert out.c_mid[0] <= 1000.0 <= out.c_mid[1]
    assert out.a[1] > out.a[0] and out.fit.points == 16
    # the same call twice: the same intervals (seeded)
    again = bootstrap_fit(COMPUTE, seeds, TRUE["r0"], eval_problems=n, resamples=100)
    assert (again.a, again.b, again.c_mid) == (out.a, out.b, out.c_mid)
    with pytest.raises(ValueError, match="seeds"):
        bootstrap_fit(COMPUTE, [clean[:-1]], 0.2)
