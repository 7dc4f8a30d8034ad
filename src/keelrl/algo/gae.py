"""PPO with a learned critic: generalised advantage estimation and the clipped value loss, per token.

A completion is an episode whose states are its trainable positions: position t (the input up to and
including token t) predicts completion token t + 1, and `values[:, t]` is the critic's estimate of the return
from there. The outcome reward is given on the last trainable position (`terminal_rewards`); with
`algo.kl_estimator = "k1_reward"` every trainable position also gets -kl_coef * k1 (step/critic.py).

    delta_t = r_t + gamma * V_next(t) - V_t          V_next: the value at the next trainable position, 0 after the last
    A_t     = delta_t + gamma * lam * A_next(t)      returns_t = A_t + V_t (the critic's regression target)

Worked numbers (tests/unit/test_gae.py): values [0.5, 0.6, 0.7], reward 1 at the end, gamma 1, lam 0.5:
delta = [0.1, 0.1, 0.3]; A_2 = 0.3, A_1 = 0.1 + 0.5 * 0.3 = 0.25, A_0 = 0.1 + 0.5 * 0.25 = 0.225.
With gamma = lam = 1 (TinyZero's PPO), A_t = R - V_t: the Monte-Carlo return minus the baseline.

Departures, stated:
- Positions an environment inserted (trainable 0) are not states: GAE runs over the trainable positions only,
  as if they were consecutive (a multi-turn episode's inserted context carries no reward and no value).
- Advantages are whitened over the global batch's trainable tokens (`whiten`; veRL and OpenRLHF do the same);
  the returns are not.
- The value loss is 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2) per token, PPO's clipped form
  (c = algo.value_clip), normalised as a token mean over the global mini-batch like every metric.
"""

from __future__ import annotations

import torch


def terminal_rewards(mask: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """[B, T]: each row's outcome reward on its last trainable position, 0 elsewhere (and 0 for a row with no
    trainable position)."""
    out = torch.zeros_like(mask, dtype=torch.float32)
    T = mask.shape[1]
    has = mask.bool().any(dim=1)  # [B]
    last = T - 1 - mask.bool().flip(1).float().argmax(dim=1)  # [B] index of the last 1
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    out[rows, last[has]] = rewards[has].to(torch.float32)
    return out


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards, values, mask [B, T] -> (advantages, returns) [B, T], 0 off the mask (see the module docstring)."""
    B, T = mask.shape
    values = values.detach().to(torch.float32) * mask
    adv = torch.zeros(B, T, dtype=torch.float32, device=mask.device)
    next_value = torch.zeros(B, dtype=torch.float32, device=mask.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(T - 1, -1, -1):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(on, a_t, 0.0)
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, a_t, next_adv)
    return adv, (adv + values) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, total: float, total_sq: float, count: float) -> torch.Tensor:
    """(x - mean) / std over the masked entries, from global sums (`total`, `total_sq` of the masked values and
    their `count`, summed over ranks by the caller); 0 off the mask."""
    mean = total / max(count, 1.0)
    var = max(total_sq / max(count, 1.0) - mean * mean, 0.0)
    return (x - mean) / (var**0.5 + 1e-8) * mask


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss [B, T] and the 0/1 flag of tokens where the clipped term was the larger."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    plain_sq = (values - returns).square()
    clipped_sq = (clipped - returns).square()
    return 0.5 * torch.maximum(plain_sq, clipped_sq), (clipped_sq > plain_sq).float()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (1: perfect; 0: no better than the mean)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if r.numel() < 2 or float(r.var()) == 0.0:
        return 0.0
    return float(1.0 - (r - v).var() / r.var())
