"""Reward-model math: the Bradley-Terry pair loss that fits a reward model to preferences, and the way a learned
reward enters RL (normalised, weighted, added to a verifier's reward). Pure functions on tensors.

- Bradley-Terry: P(chosen preferred over rejected) = sigmoid(r_chosen - r_rejected). The loss of a pair is its
  negative log-likelihood, -log sigmoid(r_c - r_r) = softplus(r_r - r_c); a step's loss is the sum over its
  pairs divided by the step's *global* pair count (so micro-batching and ranks do not change it).
- Only the difference of two scores is identified: adding a constant to every score leaves the loss alone, so
  a reward model's scores have an arbitrary offset and scale. RL therefore uses the normalised score
  z = (r - mean) / std with `mean`, `std` measured once on the reward model's own data (stages/rm/model.py's
  card) and fixed for the whole RL run. Departure from running (per-batch) normalisation as in OpenRLHF:
  a per-batch z-score hides the learned reward's growth (every batch would have mean 0), and that growth is
  what the reward-hacking rule watches (`reward/model`, the raw score).
- RL's reward is `verifier_weight * verifier + model_weight * z` (reward.verifier_weight, reward.model_weight).
"""

from __future__ import annotations

import torch


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per-pair negative log-likelihood [P] of the Bradley-Terry model: -log sigmoid(chosen - rejected).

    Worked numbers: scores (1, 0) -> log(1 + e^-1) = 0.3133; (0, 0) -> log 2 = 0.6931; (0, 2) -> 2.1269."""
    return torch.nn.functional.softplus(rejected - chosen)


def pair_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """Share of pairs the scores order as the people did; a tie counts half (it says nothing)."""
    if chosen.numel() == 0:
        return float("nan")
    diff = chosen - rejected
    return float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())


def normalise_scores(scores: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """(scores - mean) / std with the reward model's fixed statistics (see the module docstring)."""
    if not std > 0:
        raise ValueError(f"the reward model's score std must be positive, got {std}")
    return (scores - mean) / std


def combine_rewards(
    verifier: torch.Tensor, normalised: torch.Tensor, verifier_weight: float, model_weight: float
) -> torch.Tensor:
    """The reward RL trains on: verifier_weight * verifier + model_weight * normalised learned score.

    Worked numbers: verifier (1, 0), z (0.5, 2), weights 1 and 0.5 -> (1.25, 1.0)."""
    return verifier_weight * verifier + model_weight * normalised
