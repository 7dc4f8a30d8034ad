"""Policy objectives: the per-micro-batch loss the update minimises. `compute_loss` assembles it; the part
that differs between algorithms, the policy-gradient term, is a registry (`OBJECTIVES`, `get_objective`,
chosen by `algo.objective`).

Contract: an objective takes one micro-batch's `LossInputs` and the run's `AlgoConfig` and returns
`LossOutputs`: the policy-gradient term of every token *before* normalisation ([b, T]; a sequence-level
objective repeats its sequence's term on each of its tokens), the ratio it used, and 0/1 per-token flags
(clip fractions). `compute_loss` then applies, identically for every objective, the importance correction
(`is_weights`: the off-policy correction, algo/offpolicy.py), the normalisation (`loss_weights`, from losses.token_weights with
*global* counts, so summed micro-batches give the mini-batch: micro-batching never changes the loss), the KL
term and the entropy bonus:

    loss = sum_t w_t rho_t pg_t + kl_coef * sum_t w_t KL_t - entropy_coef * sum_t w_t H_t

where KL_t is `algo.kl_estimator`'s term (losses.KL_LOSSES; the default k3_is has the gradient of KL(pi || ref)).

Objectives, per trainable token t of sequence i, with r_t = exp(logprobs_t - old_logprobs_t), A_i the
sequence's advantage (the same on all its tokens) and clip(x) = clamp(x, 1 - low, 1 + high):
- `ppo_clip`: pg_t = max(-A r_t, -A clip(r_t)) [clip_low, clip_high], capped at -c A where A < 0, c = dual_clip.
- `gspo` (GSPO, arXiv 2507.18071): s_i = exp(mean_t log r_t), the length-normalised (geometric-mean) sequence
  ratio; pg_t = max(-A s_i, -A clip(s_i)) [seq_clip_low, seq_clip_high] on every token of i.
- `gspo_token` (GSPO-token): s_i,t = sg(s_i) * pi_t / sg(pi_t): the value of s_i with token t's own
  gradient; pg_t = max(-A s_i,t, -A clip(s_i,t)). With one advantage per sequence its gradient equals gspo's.
- `cispo` (CISPO, MiniMax-M1 arXiv 2506.13585): pg_t = -sg(clamp(r_t, cispo_min, cispo_max)) A log pi_t: the
  weight is clipped and detached, so no token leaves the gradient.
On-policy (r = 1, the first mini-batch of a step) all four have the same gradient; they differ on stale
tokens (minibatches > 1, ppo_epochs > 1, or an engine whose numbers differ from the trainer's).

Metrics are token means (`metric_weights`), whatever `loss_agg` is: `entropy`, `kl/old`, `kl/ref`, each
objective's flags (`clipfrac/low`, `clipfrac/high`, and `clipfrac/dual` for ppo_clip); `loss/policy` and
`loss/total` are the loss values; `ratio/max` the largest ratio over trainable tokens.

Departures, stated:
- The entropy bonus (and the KL term) is normalised like the loss, not as a token mean: `entropy_coef` then
  trades entropy against the policy term per token in the same ratio whatever `loss_agg` is (verl does the
  same; TRL logs and weighs entropy as a token mean).
- The importance correction (is_weights) multiplies the policy-gradient term only; the entropy is a property of the
  current policy. The KL term k3_is weights by pi / pi_old (the proximal policy, as TRL does), not by the
  behaviour correction: with stale samples its expectation is over pi_old's tokens, not the sampler's.
- The KL to the reference is a loss term (the GRPO papers' place) unless `algo.kl_estimator = "k1_reward"` (PPO-RLHF's
  place: a penalty in the reward, update.advantage_phase); `kl/ref` is always k3's value, `kl/old` k3 between the
  old and current policy, for monitoring only.
- GSPO's normalisation is `loss_agg`'s: the paper averages over sequences (seq_mean_token_mean here); under
  token_mean a long sequence weighs more. The sequence ratio is clamped at exp(+-20) like every ratio here.
- CISPO bounds the weight with absolute values [cispo_min, cispo_max] (ScaleRL's eps_max = 5 and TRL's
  reading), not the paper's 1 -+ eps; MiniMax-M1 sets no lower bound, cispo_min = 0 is none.

Adding an objective: write `def name(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs` here, put it in
`OBJECTIVES` and in `algo.objective`'s choices, and give it a worked-number test (tests/unit/test_objectives.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from keelrl.algo.losses import KL_LOSSES, kl_penalty, ppo_clip_loss, sequence_log_ratio

if TYPE_CHECKING:
    from keelrl.algo.config import AlgoConfig


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, as the objective sees it (shapes: b sequences, T completion positions)."""

    logprobs: torch.Tensor  # [b, T] current policy, with grad
    entropy: torch.Tensor  # [b, T] (with grad only when the objective uses it)
    old_logprobs: torch.Tensor  # [b, T] the policy that produced the batch (PPO ratio denominator)
    advantages: torch.Tensor  # [b] one per sequence (broadcast over its tokens), or [b, T] per token (gae)
    mask: torch.Tensor  # [b, T] 1 = trainable target token
    loss_weights: torch.Tensor  # [b, T] losses.token_weights(mask, algo.loss_agg, global counts)
    metric_weights: torch.Tensor  # [b, T] mask / global trainable tokens (token means)
    ref_logprobs: torch.Tensor | None = None  # [b, T] reference policy, when a KL term is on
    is_weights: torch.Tensor | None = (
        None  # [b, T] off-policy correction weights (algo/offpolicy.py), when on
    )


@dataclass(frozen=True)
class LossOutputs:
    """An objective's policy-gradient term, before normalisation and importance correction."""

    per_token: torch.Tensor  # [b, T] pg_t (zero or anything off the mask: the weights are 0 there)
    ratio: torch.Tensor  # [b, T] the ratio the objective clips or weights with (token or sequence)
    flags: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [b, T] 0/1, logged as token means


Objective = Callable[["LossInputs", "AlgoConfig"], LossOutputs]


def token_advantages(x: LossInputs) -> torch.Tensor:
    """[b, T]: each sequence's advantage on each of its positions, or the per-token advantages as given (gae)."""
    if x.advantages.ndim == 2:
        return x.advantages
    return x.advantages[:, None].expand_as(x.logprobs)


def ppo_clip(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """PPO-clip with asymmetric bounds and optional dual clip."""
    x = inputs
    adv = token_advantages(x)  # [b, T]
    pg, pstats = ppo_clip_loss(x.logprobs, x.old_logprobs, adv, algo.clip_low, algo.clip_high, algo.dual_clip)
    flags = {**_clip_flags(pstats), "clipfrac/dual": pstats["dual_clipped"]}
    return LossOutputs(pg, pstats["ratio"], flags)


def _clip_flags(pstats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`clipfrac/low` and `clipfrac/high` from `ppo_clip_loss`'s stats."""
    return {"clipfrac/low": pstats["clipped_low"], "clipfrac/high": pstats["clipped_high"]}


def gspo(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """GSPO: the clipped sequence ratio s_i on every token of the sequence (gradient through all of them)."""
    x = inputs
    log_s = sequence_log_ratio(x.logprobs, x.old_logprobs, x.mask)[:, None].expand_as(x.logprobs)  # [b, T]
    return _clipped(log_s, x, algo)


def gspo_token(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """GSPO-token: value s_i, gradient of token t through its own log-prob only (sg: detach)."""
    x = inputs
    log_s = sequence_log_ratio(x.logprobs, x.old_logprobs, x.mask).detach()[:, None]  # [b, 1]
    return _clipped(x.logprobs - x.logprobs.detach() + log_s, x, algo)


def _clipped(log_ratio: torch.Tensor, x: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """The PPO-clip term of a ratio given as its log ([b, T]), with GSPO's sequence clip range, no dual clip."""
    adv = token_advantages(x)  # [b, T]
    zero = torch.zeros_like(log_ratio)
    pg, pstats = ppo_clip_loss(log_ratio, zero, adv, algo.seq_clip_low, algo.seq_clip_high)
    return LossOutputs(pg, pstats["ratio"], _clip_flags(pstats))


def cispo(inputs: LossInputs, algo: AlgoConfig) -> LossOutputs:
    """CISPO: -sg(clamp(r, cispo_min, cispo_max)) * A * log pi, per token."""
    x = inputs
    adv = token_advantages(x)  # [b, T]
    ratio = torch.exp((x.logprobs - x.old_logprobs).clamp(-20.0, 20.0)).detach()  # [b, T]
    weight = ratio.clamp(algo.cispo_min, algo.cispo_max)
    flags = {
        "clipfrac/low": (ratio < algo.cispo_min).float(),
        "clipfrac/high": (ratio > algo.cispo_max).float(),
    }
    return LossOutputs(-weight * adv * x.logprobs, ratio, flags)


OBJECTIVES: dict[str, Objective] = {
    "ppo_clip": ppo_clip,
    "gspo": gspo,
    "gspo_token": gspo_token,
    "cispo": cispo,
}


def get_objective(name: str) -> Objective:
    """The policy-gradient term registered as `name` (`algo.objective`)."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; registered: {', '.join(sorted(OBJECTIVES))}") from None


def compute_loss(inputs: LossInputs, algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """`algo.objective`'s term + importance correction + KL-to-reference loss - entropy bonus: (a scalar whose
    `.backward()` gives this micro-batch's share of the mini-batch gradient, metrics as plain floats)."""
    x, w = inputs, inputs.loss_weights
    out = get_objective(algo.objective)(x, algo)
    pg = out.per_token
    if x.is_weights is not None:
        pg = pg * x.is_weights
    policy_loss = (pg * w).sum()
    loss = policy_loss
    kl_term = KL_LOSSES.get(algo.kl_estimator)  # none: the KL is in the reward (k1_reward)
    if x.ref_logprobs is not None and kl_term is not None:
        loss = loss + algo.kl_coef * (kl_term(x.logprobs, x.ref_logprobs, x.old_logprobs) * w).sum()
    if algo.entropy_coef > 0:
        loss = loss - algo.entropy_coef * (x.entropy * w).sum()
    with torch.no_grad():
        m = x.metric_weights
        named = {
            "loss/policy": policy_loss,
            "loss/total": loss,
            "entropy": (x.entropy * m).sum(),
            **{name: (flag * m).sum() for name, flag in out.flags.items()},
            "kl/old": (kl_penalty(x.logprobs, x.old_logprobs, "k3") * m).sum(),
            "ratio/max": torch.where(x.mask.bool(), out.ratio, 0.0).max(),
        }
        if x.ref_logprobs is not None:  # k3's value, whatever the loss uses: one scale for every estimator
            named["kl/ref"] = (kl_penalty(x.logprobs, x.ref_logprobs, "k3") * m).sum()
        values = torch.stack([v.float() for v in named.values()]).tolist()  # one device sync
    return loss, dict(zip(named, values, strict=True))
