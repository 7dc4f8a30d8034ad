"""Advantage estimators over groups of completions of the same prompt.

Each takes a batch's rewards group by group (`[num_groups * group_size]`: prompt g's completions at g*G ..
g*G+G-1) and returns one advantage per completion, which the trainer broadcasts to its trainable tokens
(outcome rewards, gamma = lambda = 1). An estimator is its part within a group (`Estimator.group`, on
`[groups, n]`) and, for batch-level ones, a whitening over the whole batch (`Estimator.whiten`).

Samples that could not be scored (an episode whose status is not "ok": a verifier that crashed, timed out or
wrote no reward) are left out, not scored 0: `valid` marks the rest, each group's statistics are those of its
valid members alone (a group of n valid members is the estimator's group of size n), a whitened batch is
whitened over valid samples, and a left-out sample's advantage is 0 (the trainer also masks its tokens out of
the loss). A group with fewer valid members than the estimator needs (RLOO: 2) has advantage 0.

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
from dataclasses import dataclass
from typing import Literal

import torch

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # [num_groups, G]


def _valid_groups(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None) -> torch.Tensor:
    """[num_groups, G] bool: which samples count (all, without `valid`)."""
    g = _groups(rewards, group_size)
    if valid is None:
        return torch.ones_like(g, dtype=torch.bool)
    return _groups(valid.to(device=rewards.device, dtype=torch.bool), group_size)


def no_signal_fraction(rewards: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> float:
    """Share of groups whose valid rewards are all equal, or that have fewer than two valid samples: they carry
    no learning signal under group baselines."""
    g, keep = _groups(rewards, group_size), _valid_groups(rewards, group_size, valid)
    inf = torch.full_like(g, float("inf"))
    hi = torch.where(keep, g, -inf).max(dim=1).values
    lo = torch.where(keep, g, inf).min(dim=1).values
    return float(((hi == lo) | (keep.sum(dim=1) < 2)).float().mean())


def grpo(g: torch.Tensor, std_eps: float = 1e-6) -> torch.Tensor:
    """[N, n] -> [N, n]: (r - group mean) / (group sample std + std_eps)."""
    mean = g.mean(dim=1, keepdim=True)
    std = g.std(dim=1, keepdim=True) if g.shape[1] > 1 else torch.zeros_like(mean)
    return (g - mean) / (std + std_eps)


def dr_grpo(g: torch.Tensor) -> torch.Tensor:
    """[N, n] -> [N, n]: r - group mean."""
    return g - g.mean(dim=1, keepdim=True)


def rloo(g: torch.Tensor) -> torch.Tensor:
    """[N, n] -> [N, n]: r - the mean of the group's other n - 1 rewards (n >= 2)."""
    n = g.shape[1]
    return g - (g.sum(dim=1, keepdim=True) - g) / (n - 1)


@dataclass(frozen=True)
class EstimatorSpec:
    """group: (rewards [N, n], std_eps, group_baseline) -> advantages [N, n], within groups of equal size n;
    whiten: then normalise over the whole batch (mean 0, population std 1); min_group: the fewest samples a
    group needs to carry signal."""

    group: Callable[[torch.Tensor, float, bool], torch.Tensor]
    whiten: bool = False
    min_group: int = 1


# `algo.advantage` picks one
ESTIMATORS: dict[str, EstimatorSpec] = {
    "grpo": EstimatorSpec(lambda g, eps, _baseline: grpo(g, eps)),
    "dr_grpo": EstimatorSpec(lambda g, _eps, _baseline: dr_grpo(g)),
    "rloo": EstimatorSpec(lambda g, _eps, _baseline: rloo(g), min_group=2),
    "reinforce_pp": EstimatorSpec(
        lambda g, _eps, baseline: dr_grpo(g) if baseline else g.clone(), whiten=True
    ),
}


def compute_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: Estimator,
    std_eps: float = 1e-6,
    group_baseline: bool = True,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """rewards [B] (global batch, grouped), valid [B] (optional; False: leave the sample out, see the module
    docstring) -> (advantages [B], metrics). The one place a variant is chosen."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    spec = ESTIMATORS[estimator]
    if group_size < spec.min_group:
        raise ValueError(
            f"{estimator} needs rollout.group_size >= {spec.min_group} (the baseline is the mean of the other samples)"
        )
    rewards = rewards.double()
    g, keep = _groups(rewards, group_size), _valid_groups(rewards, group_size, valid)  # [N, G]
    counts = keep.sum(dim=1)  # [N] valid members per group
    adv = torch.zeros_like(g)
    for n in counts.unique().tolist():  # groups with the same number of valid members go together
        rows = counts == n
        if n >= spec.min_group:
            part = torch.zeros_like(g[rows])  # [k, G]
            part[keep[rows]] = spec.group(g[rows][keep[rows]].view(-1, n), std_eps, group_baseline).flatten()
            adv[rows] = part
    adv, kept = adv.flatten(), keep.flatten()  # [B]
    if spec.whiten and kept.any():
        x = adv[kept]
        adv[kept] = (x - x.mean()) / (x.std(correction=0) + std_eps)
    shown = adv[kept] if kept.any() else adv
    metrics = {
        "advantage/mean": float(shown.mean()),
        "advantage/abs_mean": float(shown.abs().mean()),
        "groups/no_signal_frac": no_signal_fraction(rewards, group_size, valid),
    }
    return adv.float(), metrics
