"""Advantage estimators over groups of completions of the same prompt.

Each takes a batch's rewards group by group (`[num_groups * group_size]`: prompt g's completions at g*G ..
g*G+G-1) and returns one advantage per completion, which the trainer broadcasts to its trainable tokens
(outcome rewards, gamma = lambda = 1).

Departures from the papers, stated:
- GRPO divides by the group's sample std (Bessel-corrected, as torch.std; the paper does not specify) plus
  `std_eps`; a group whose rewards are all equal gets advantage 0.
- Dr. GRPO (arXiv 2503.20783) drops the std division; its constant loss normaliser is the separate
  `algo.loss_agg = "constant"` (losses.py).
- RLOO's baseline is the mean of the other G-1 rewards, r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean).
- REINFORCE++ normalises over the whole batch (mean and population std); `group_baseline` subtracts the group
  mean first ("REINFORCE++-baseline"). Its KL term is the separate KL loss, not in the reward. Normalisation
  is per sequence (each completion counts once); its authors' code (OpenRLHF) normalises per token, so a
  long completion weighs more there; with outcome rewards and no KL in the reward that is the only difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # [num_groups, G]


def no_signal_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Share of groups whose rewards are all equal (they carry no learning signal under group baselines)."""
    g = _groups(rewards, group_size)
    return float((g.max(dim=1).values == g.min(dim=1).values).float().mean())


def grpo(rewards: torch.Tensor, group_size: int, std_eps: float = 1e-6) -> torch.Tensor:
    g = _groups(rewards, group_size)  # [N, G]
    mean = g.mean(dim=1, keepdim=True)
    std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    return ((g - mean) / (std + std_eps)).flatten()


def dr_grpo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    g = _groups(rewards, group_size)
    return (g - g.mean(dim=1, keepdim=True)).flatten()


def rloo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 2:
        raise ValueError("RLOO needs rollout.group_size >= 2 (the baseline is the mean of the other samples)")
    g = _groups(rewards, group_size)
    others_mean = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    return (g - others_mean).flatten()


def reinforce_pp(
    rewards: torch.Tensor, group_size: int, group_baseline: bool, std_eps: float = 1e-6
) -> torch.Tensor:
    x = dr_grpo(rewards, group_size) if group_baseline else rewards.clone()
    return (x - x.mean()) / (x.std(correction=0) + std_eps)


# name -> (rewards [B], group_size, std_eps, group_baseline) -> advantages [B]; `algo.advantage` picks one
ESTIMATORS: dict[str, Callable[[torch.Tensor, int, float, bool], torch.Tensor]] = {
    "grpo": lambda r, g, eps, _baseline: grpo(r, g, eps),
    "dr_grpo": lambda r, g, _eps, _baseline: dr_grpo(r, g),
    "rloo": lambda r, g, _eps, _baseline: rloo(r, g),
    "reinforce_pp": lambda r, g, eps, baseline: reinforce_pp(r, g, baseline, eps),
}


def compute_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: Estimator,
    std_eps: float = 1e-6,
    group_baseline: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """rewards [B] (global batch, grouped) -> (advantages [B], metrics). The one place a variant is chosen."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    rewards = rewards.double()
    adv = ESTIMATORS[estimator](rewards, group_size, std_eps, group_baseline)
    metrics = {
        "advantage/mean": float(adv.mean()),
        "advantage/abs_mean": float(adv.abs().mean()),
        "groups/no_signal_frac": no_signal_fraction(rewards, group_size),
    }
    return adv.float(), metrics
