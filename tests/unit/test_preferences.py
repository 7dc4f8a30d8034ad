"""Win-rate intervals and the Bradley-Terry ranking, with worked numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from keelrl.evals.preferences import (
    bradley_terry,
    bt_intervals,
    judge_agreement,
    pair_win_rates,
    verifier_agreement,
    wilson_interval,
    win_matrix,
)


def test_wilson_interval_worked_numbers():
    lo, hi = wilson_interval(8, 10)  # p = 0.8, z = 1.96: centre 0.7167, half-width 0.2266
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # not [0, 0] as Wald says
    assert wilson_interval(5, 10)[0] == pytest.approx(1 - wilson_interval(5, 10)[1])  # symmetric at 1/2
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(80, 100)[1] - wilson_interval(80, 100)[0] < hi - lo  # more votes, narrower


def test_bradley_terry_two_items_is_the_log_odds():
    votes = [("a", "b", 1.0)] * 3 + [("a", "b", 0.0)]  # a wins 3 of 4: s_a / s_b = 3
    logs = bradley_terry(votes, ["a", "b"], prior=0.0)
    assert logs == pytest.approx([math.log(3) / 2, -math.log(3) / 2], abs=1e-8)
    # the prior's pseudo-ties: 0.25 each side -> (3.25 / 1.25)
    assert bradley_terry(votes, ["a", "b"], prior=0.5)[0] * 2 == pytest.approx(
        math.log(3.25 / 1.25), abs=1e-8
    )


def test_bradley_terry_recovers_exact_ratios_and_ties():
    # s = 9 : 3 : 1 predicts a>b 3:1, b>c 3:1, a>c 9:1; data that match exactly are fitted exactly
    votes = (
        [("a", "b", 1.0)] * 3 + [("b", "a", 1.0)] + [("b", "c", 1.0)] * 3 + [("c", "b", 1.0)]
        + [("a", "c", 1.0)] * 9 + [("a", "c", 0.0)]
    )  # fmt: skip
    logs = bradley_terry(votes, ["a", "b", "c"], prior=0.0)
    assert logs == pytest.approx(np.log([9, 3, 1]) - np.log([9, 3, 1]).mean(), abs=1e-6)
    assert bradley_terry([("a", "b", 0.5)] * 2, ["a", "b"], prior=0.0) == pytest.approx([0.0, 0.0])


def test_a_clean_sweep_stays_finite_with_the_prior():
    votes = [("a", "b", 1.0)] * 5
    logs = bradley_terry(votes, ["a", "b"])
    assert np.isfinite(logs).all() and logs[0] * 2 == pytest.approx(math.log(5.25 / 0.25), abs=1e-6)


def test_bootstrap_intervals_and_ranks():
    rng = np.random.default_rng(0)
    true = {"x": 1.0, "y": 0.0, "z": -1.0}
    votes = []
    for _ in range(300):
        a, b = rng.choice(list(true), 2, replace=False)
        p = 1 / (1 + math.exp(true[b] - true[a]))
        votes.append((str(a), str(b), float(rng.random() < p)))
    out = bt_intervals(votes, ["x", "y", "z"], resamples=200, seed=1)
    assert [out[k]["rank"] for k in ("x", "y", "z")] == [1, 2, 3]
    for k, v in true.items():
        assert out[k]["lo"] <= out[k]["log_strength"] <= out[k]["hi"]
        assert out[k]["lo"] <= v <= out[k]["hi"]  # the true (centred) strengths fall inside
    assert out == bt_intervals(votes, ["x", "y", "z"], resamples=200, seed=1)  # seeded


def test_bad_votes_are_refused():
    with pytest.raises(ValueError, match="outcome"):
        win_matrix([("a", "b", 2.0)], ["a", "b"])
    with pytest.raises(ValueError, match="two different"):
        win_matrix([("a", "a", 1.0)], ["a"])


def test_pair_win_rates_are_oriented_by_name():
    votes = [("m2", "m1", 1.0), ("m1", "m2", 1.0), ("m1", "m2", 0.5), ("m1", "m2", 0.0)]
    rates = pair_win_rates(votes)
    row = rates[("m1", "m2")]  # m1: a loss, a win, a tie, a loss
    assert (row["wins"], row["ties"], row["losses"], row["n"]) == (1, 1, 2, 4)
    assert row["rate"] == pytest.approx(1.5 / 4)
    assert (row["lo"], row["hi"]) == pytest.approx(wilson_interval(1.5, 4))


def test_agreement_between_judges_and_with_the_verifier():
    votes = [
        ("p1", 1.0, "ann"),
        ("p1", 1.0, "bob"),
        ("p1", 0.0, "cy"),
        ("p2", 0.5, "ann"),
        ("p3", 1.0, "ann"),
    ]
    # p1: ann-bob agree, ann-cy and bob-cy do not; p2, p3: one judge each
    assert judge_agreement(votes) == {"agreement": pytest.approx(1 / 3), "judge_pairs": 3.0}
    assert math.isnan(judge_agreement([("p", 1.0, "ann")])["agreement"])
    v = [(1.0, True, False), (0.0, True, False), (0.5, False, True), (1.0, True, True), (1.0, None, False)]
    # decided: the first three; preferred the accepted one: 1 + 0 + 0.5
    assert verifier_agreement(v) == {"agreement": pytest.approx(0.5), "votes": 3.0}
