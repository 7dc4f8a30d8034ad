"""Advantage estimators on worked numbers."""

from __future__ import annotations

import pytest
import torch

from keelrl.algo.advantages import compute_advantages, no_signal_fraction

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])  # two groups of 4; the second has no signal


def test_grpo_worked_numbers() -> None:
    # group 1: mean 0.25, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    adv, m = compute_advantages(R, 4, "grpo", std_eps=0.0)
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    adv, _ = compute_advantages(R, 4, "grpo", std_eps=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards: zero advantage, no NaN
    assert m["groups/no_signal_frac"] == 0.5


def test_dr_grpo_and_rloo_worked_numbers() -> None:
    adv, _ = compute_advantages(R, 4, "dr_grpo")
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    adv, _ = compute_advantages(R, 4, "rloo")
    # r_i - mean of the other three: 1 - 0, 0 - 1/3
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    with pytest.raises(ValueError, match="group_size >= 2"):
        compute_advantages(R, 1, "rloo")


def test_reinforce_pp_worked_numbers() -> None:
    # with group baseline: [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]; batch mean 0,
    # population std sqrt((0.5625 + 3 * 0.0625) / 8) = sqrt(0.09375)
    adv, _ = compute_advantages(R, 4, "reinforce_pp", std_eps=0.0, group_baseline=True)
    s = 0.09375**0.5
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / s, atol=1e-6)
    # without: rewards normalised over the batch: mean 0.375, population std sqrt(0.109375)
    adv, _ = compute_advantages(R, 4, "reinforce_pp", std_eps=0.0, group_baseline=False)
    assert torch.allclose(adv, (R - 0.375) / 0.109375**0.5, atol=1e-6)


def test_no_signal_fraction_and_shape_errors() -> None:
    assert no_signal_fraction(torch.tensor([1.0, 1, 0, 1, 0, 0]), 2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="groups of 3"):
        compute_advantages(torch.zeros(8), 3, "grpo")


# Samples without a reward (status not "ok") are left out: a group's statistics are its valid members' alone.
V = torch.tensor([True, True, True, False, True, False, True, True])
RX = torch.tensor([1.0, 0.0, 0.0, 9.0, 0.0, 9.0, 1.0, 1.0])  # the 9s are left out: they must not matter


def test_grpo_leaves_out_invalid_samples() -> None:
    # group 1's valid members 1, 0, 0: mean 1/3, sample std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    adv, m = compute_advantages(RX, 4, "grpo", std_eps=0.0, valid=V)
    s = (1 / 3) ** 0.5
    expected = [(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, 0.0]
    assert torch.allclose(adv[:4], torch.tensor(expected), atol=1e-6)
    # group 2's valid members 0, 1, 1: mean 2/3, the same std
    assert torch.allclose(adv[4:], torch.tensor([-(2 / 3) / s, 0.0, (1 / 3) / s, (1 / 3) / s]), atol=1e-6)
    assert m["groups/no_signal_frac"] == 0.0
    assert m["advantage/abs_mean"] == pytest.approx(float(adv[V].abs().mean()), rel=1e-6)  # over valid ones
    # the same numbers as the estimator on the valid members alone, as groups of 3
    alone, _ = compute_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1]), 3, "grpo", std_eps=0.0)
    assert torch.allclose(adv[V], alone, atol=1e-6)


def test_dr_grpo_and_rloo_leave_out_invalid_samples() -> None:
    adv, _ = compute_advantages(RX, 4, "dr_grpo", valid=V)
    assert torch.allclose(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, -2 / 3, 0, 1 / 3, 1 / 3]), atol=1e-6)
    adv, _ = compute_advantages(RX, 4, "rloo", valid=V)
    # r_i - mean of the other two valid rewards
    assert torch.allclose(adv[:4], torch.tensor([1.0, -0.5, -0.5, 0.0]), atol=1e-6)
    # a group with one valid member has no baseline: advantage 0, and no signal
    one = torch.tensor([True, False, False, False, True, True, True, True])
    adv, m = compute_advantages(RX, 4, "rloo", valid=one)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert m["groups/no_signal_frac"] == 0.5


def test_reinforce_pp_whitens_over_valid_samples_only() -> None:
    adv, _ = compute_advantages(RX, 4, "reinforce_pp", std_eps=0.0, group_baseline=False, valid=V)
    x = RX[V]  # [1, 0, 0, 0, 1, 1]: mean 0.5, population std 0.5
    assert torch.allclose(adv[V], (x - 0.5) / 0.5, atol=1e-6)
    assert torch.equal(adv[~V], torch.zeros(2))


def test_no_valid_sample_gives_zero_advantages() -> None:
    none = torch.zeros(8, dtype=torch.bool)
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        adv, m = compute_advantages(RX, 4, name, valid=none)
        assert torch.equal(adv, torch.zeros(8)) and m["groups/no_signal_frac"] == 1.0
