"""Policy objectives: the whole per-micro-batch loss the update minimises, as a registry (`OBJECTIVES`, looked
up by `algo.objective`).

Contract: an objective takes one micro-batch's `LossInputs` and the run's `AlgoConfig` and returns `(loss,
metrics)`: a scalar whose `.backward()` gives this micro-batch's share of the mini-batch gradient, and plain
floats. Both weight tensors carry *global* counts, so summing micro-batches gives the mini-batch (losses.py).

`ppo_clip`, per trainable token t, with r = exp(logprobs - old_logprobs), A the sequence's advantage,
w = loss_weights, rho = the truncated importance weight (1 when off), c = dual_clip:

    pg_t = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high)), capped at -c A where A < 0 and c > 0
    loss = sum_t w_t rho_t pg_t + kl_coef * sum_t w_t KL_t(pi || ref) - entropy_coef * sum_t w_t H_t

`loss_weights` follow `algo.loss_agg` (token_mean, DAPO; seq_mean_token_mean, GRPO; constant, Dr. GRPO) and
weight all three terms. The metrics do not: `entropy`, `clipfrac/low|high|dual`, `kl/old` and `kl/ref` are
token means (`metric_weights`), so a curve means the same under any `loss_agg` (under `constant` a
loss-weighted entropy would read len/max_new_tokens of the true mean); `loss/policy` and `loss/total` are the
loss values; `ratio/max` is the largest ratio over trainable tokens.

Departures, stated:
- The entropy bonus (and the KL term) is normalised like the loss, not as a token mean. TRL's GRPO logs
  entropy as a token mean and verl aggregates its bonus with the loss's mode; we do the latter so that
  `entropy_coef` trades entropy against the policy term per token in the same ratio whatever `loss_agg` is,
  and micro-batch invariance needs no second normaliser in the loss.
- The truncated importance weight multiplies the policy-gradient term only; KL and entropy are properties
  of the current policy, not of how the sample was drawn.
- The KL to the reference is a loss term (GRPO), not a reward penalty; `kl/old` is k3 between the old and
  current policy, for monitoring only.

Adding an objective: write `def name(inputs: LossInputs, algo: AlgoConfig) -> tuple[Tensor, dict]` here (or
in a module of algo/), put it in `OBJECTIVES`, and give it a worked-number test (tests/unit/test_objectives.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from keelrl.algo.losses import kl_penalty, ppo_clip_loss

if TYPE_CHECKING:
    from keelrl.config import AlgoConfig


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, as the objective sees it (shapes: b sequences, T completion positions)."""

    logprobs: torch.Tensor  # [b, T] current policy, with grad
    entropy: torch.Tensor  # [b, T] (with grad only when the objective uses it)
    old_logprobs: torch.Tensor  # [b, T] the policy that produced the batch (PPO ratio denominator)
    advantages: torch.Tensor  # [b] one per sequence; the objective broadcasts it over the tokens
    mask: torch.Tensor  # [b, T] 1 = trainable target token
    loss_weights: torch.Tensor  # [b, T] losses.token_weights(mask, algo.loss_agg, global counts)
    metric_weights: torch.Tensor  # [b, T] mask / global trainable tokens (token means)
    ref_logprobs: torch.Tensor | None = None  # [b, T] reference policy, when a KL term is on
    is_weights: torch.Tensor | None = None  # [b, T] truncated importance weights, when on


class Objective(Protocol):
    def __call__(self, inputs: LossInputs, algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]: ...


def ppo_clip(inputs: LossInputs, algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip (asymmetric bounds, optional dual clip) + KL-to-reference loss - entropy bonus."""
    x, w = inputs, inputs.loss_weights
    adv = x.advantages[:, None].expand_as(x.logprobs)  # [b, T]
    pg, pstats = ppo_clip_loss(x.logprobs, x.old_logprobs, adv, algo.clip_low, algo.clip_high, algo.dual_clip)
    if x.is_weights is not None:
        pg = pg * x.is_weights
    policy_loss = (pg * w).sum()
    loss = policy_loss
    kl = None
    if x.ref_logprobs is not None:
        kl = kl_penalty(x.logprobs, x.ref_logprobs, algo.kl_estimator)  # [b, T]
        loss = loss + algo.kl_coef * (kl * w).sum()
    if algo.entropy_coef > 0:
        loss = loss - algo.entropy_coef * (x.entropy * w).sum()
    with torch.no_grad():
        m = x.metric_weights
        named = {
            "loss/policy": policy_loss,
            "loss/total": loss,
            "entropy": (x.entropy * m).sum(),
            "clipfrac/low": (pstats["clipped_low"] * m).sum(),
            "clipfrac/high": (pstats["clipped_high"] * m).sum(),
            "clipfrac/dual": (pstats["dual_clipped"] * m).sum(),
            "kl/old": (kl_penalty(x.logprobs, x.old_logprobs, "k3") * m).sum(),
            "ratio/max": torch.where(x.mask.bool(), pstats["ratio"], 0.0).max(),
        }
        if kl is not None:
            named["kl/ref"] = (kl * m).sum()
        values = torch.stack([v.float() for v in named.values()]).tolist()  # one device sync
    return loss, dict(zip(named, values, strict=True))


OBJECTIVES: dict[str, Objective] = {"ppo_clip": ppo_clip}
