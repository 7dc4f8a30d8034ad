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
