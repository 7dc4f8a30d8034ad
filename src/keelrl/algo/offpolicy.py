"""Off-policy correction: how the loss accounts for the gap between the policy that sampled a batch (the
behaviour policy, whose log-probs the sampler returned) and the policy the update starts from (the proximal
policy, whose log-probs the trainer recomputes). The gap comes from staleness (`rollout.max_staleness` k >= 1:
the batch of step t was sampled by policy version t - k) and from an engine whose numerics differ from the
trainer's (vLLM, bf16).

Every choice is decoupled PPO's structure (AReaL, arXiv 2505.24298): the objective (`algo.objective`) clips its
ratio pi_theta / pi_prox against the proximal policy, so one update's trust region does not depend on how stale
the data is, and the behaviour ratio rho = pi_prox / pi_behaviour multiplies each token's policy-gradient term
(`compute_loss`'s `is_weights`). What differs is how rho is bounded (`algo.correction`, `CORRECTIONS`):

    off        w = 1                        the gap is ignored: stale samples trained as if on-policy (biased)
    decoupled  w = rho                      AReaL's objective as published: unbiased, unbounded variance
    tis        w = min(rho, C)              truncated IS, C = algo.is_cap (~2, the TIS post's value)
    mis        w = rho * [lo <= rho <= hi]  masked IS: a unit whose ratio leaves the band is dropped
                                            (IcePop at token level), band algo.is_mask_low / is_mask_high

At `algo.correction_level = "token"` rho is per token; at "sequence" it is each sequence's geometric-mean ratio
exp(mean_t log rho_t), the same on all its tokens.

`algo.behaviour_clip` (on by default, with every correction but off) adds PPO's clip against the behaviour
policy (`behaviour_trust_region`): a token whose probability already moved past [1 - clip_low, 1 + clip_high]
of the sampler's, in the direction its advantage pushes, is dropped. Stale feedback is late: without this, the
update keeps pushing tokens the policy has already moved (and tis/decoupled weight those by rho > 1, more), and
the updates overshoot; the demo's RL stage at k = 2 collapsed that way (docs/RESULTS.md). The proximal clip
bounds one update's move, this one bounds the move since sampling.

Default: tis at token level, C = 2. At k = 0 with the in-process sampler nothing is recomputed (the sampler's
log-probs are the proximal policy's, rho = 1) and the loop is exactly the synchronous one. At k >= 1 truncation
bounds each token's weight, so no stale sample dominates an update (the heavy-tailed ratios VCPO, arXiv
2602.17616, found behind collapses) while every token still contributes; `decoupled` keeps the unbiased but
unbounded weight; `mis` drops instead of capping, losing those tokens' signal. The effective sample size of rho
(`behaviour/ess`, (sum rho)^2 / (n sum rho^2) over the level's units) tells how far the data is from on-policy
whatever the correction; the `off_policy_ess` guard warns on it.

Departures, stated:
- The sequence level bounds the geometric mean (veRL's "geometric" level), not the product of the token ratios
  (veRL's and TRL's sequence level), so one band and one cap fit every length.
- Dropped units (mis) stay in the loss's denominators (TRL multiplies by 0 the same way; veRL removes them from
  the mask, which rescales the kept ones).
- KL and entropy terms are not weighted: they are properties of the current policy (objectives.py).
- The proximal log-probs are the trainer's own: a forward pass before the update when it makes several optimizer
  steps per batch, else the update's forward itself (with one step, the policy it starts from is the proximal
  policy; the same values without a second pass). Never interpolated between versions (AReaL's "loglinear").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import torch

from keelrl.algo.losses import sequence_log_ratio

if TYPE_CHECKING:
    from keelrl.algo.config import AlgoConfig

Level = Literal["token", "sequence"]


def behaviour_log_ratio(
    proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, level: Level
) -> torch.Tensor:
    """[B, T] log(pi_prox / pi_behaviour) without gradient, 0 off the mask: per token, or each sequence's mean
    over its trainable tokens (the log of its geometric-mean ratio) on all of its tokens. Clamped at +-20."""
    prox, behav = proximal.detach(), behaviour.detach()
    if level == "token":
        log_rho = prox - behav
    elif level == "sequence":
        log_rho = sequence_log_ratio(prox, behav, mask)[:, None].expand_as(prox)
    else:
        raise ValueError(f"unknown correction level {level!r}")
    return log_rho.clamp(-20.0, 20.0) * mask


def behaviour_trust_region(
    log_rho: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """[B, T] 1 = kept, 0 = dropped, without gradient: PPO's clip against the behaviour (sampling) policy, taken
    at the proximal policy. A token is dropped when its probability already moved past the clip range since it
    was sampled, in the direction its advantage pushes: A > 0 and rho > 1 + clip_high, or A < 0 and
    rho < 1 - clip_low. Stale feedback then cannot push a token further than one trust region from where it
    was sampled, while tokens that moved against their advantage keep their corrective gradient. `advantages`:
    [B] (one per sequence) or [B, T]."""
    adv = advantages[:, None].expand_as(log_rho) if advantages.ndim == 1 else advantages
    rho = torch.exp(log_rho.detach())
    past = ((adv > 0) & (rho > 1.0 + clip_high)) | ((adv < 0) & (rho < 1.0 - clip_low))
    return (~past).to(log_rho.dtype)


def decoupled(log_rho: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """w = rho (AReaL's behaviour importance weight, uncapped)."""
    return torch.exp(log_rho)


def truncated(log_rho: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """w = min(rho, algo.is_cap) (truncated importance sampling)."""
    return torch.exp(log_rho).clamp_max(algo.is_cap)


def masked(log_rho: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """w = rho where is_mask_low <= rho <= is_mask_high, else 0 (masked importance sampling)."""
    rho = torch.exp(log_rho)
    low, high = algo.is_mask_band
    return rho * ((rho >= low) & (rho <= high)).to(rho.dtype)


def uncorrected(log_rho: torch.Tensor, algo: AlgoConfig) -> torch.Tensor:
    """w = 1: the behaviour ratio is ignored."""
    return torch.ones_like(log_rho)


Correction = Callable[[torch.Tensor, "AlgoConfig"], torch.Tensor]
CORRECTIONS: dict[str, Correction] = {
    "off": uncorrected,
    "decoupled": decoupled,
    "tis": truncated,
    "mis": masked,
}


def correction_weights(
    proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, algo: AlgoConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """(weights [B, T] of `algo.correction` at `algo.correction_level`, zero off the mask; this batch's
    `behaviour_sums`). The proximal log-probs come from a recompute or from the update's own forward."""
    log_rho = behaviour_log_ratio(proximal, behaviour, mask, algo.correction_level)
    weights = CORRECTIONS[algo.correction](log_rho, algo).detach() * mask
    return weights, behaviour_sums(proximal, behaviour, log_rho, weights, mask, algo.correction_level)


def behaviour_sums(
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    log_rho: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    level: Level,
) -> dict[str, float]:
    """Partial sums over some rows, to be added over micro-batches and ranks (keys ending in "/max": the
    largest), for `behaviour_metrics`: over the level's units (trainable tokens, or sequences with at least one)
    n, sum rho, sum rho^2, the units whose weight the correction lowered (w < rho: truncated or dropped), the
    largest rho; over trainable tokens, the k3 estimate of KL(behaviour || proximal) and the largest |log gap|."""
    rho, w = torch.exp(log_rho.double()), weights.double()
    if level == "sequence":
        has = mask.sum(dim=1) > 0
        first = mask.argmax(dim=1)  # the ratio is the same on every token of a sequence: take its first
        rows = torch.arange(mask.shape[0], device=mask.device)
        rho, w = rho[rows, first][has], w[rows, first][has]
    else:
        keep = mask.bool()
        rho, w = rho[keep], w[keep]
    gap = ((proximal.detach() - behaviour.detach()).double().clamp(-20.0, 20.0) * mask)[mask.bool()]
    return {
        "n": float(rho.numel()),
        "sum": float(rho.sum()),
        "sum_sq": float(rho.square().sum()),
        "cut": float((w < rho * (1 - 1e-6)).sum()),  # float32 weights: a relative margin
        "ratio/max": float(rho.max()) if rho.numel() else 1.0,
        "tokens": float(gap.numel()),
        "kl": float((torch.exp(gap) - 1.0 - gap).sum()),
        "gap/max": float(gap.abs().max()) if gap.numel() else 0.0,
    }


def add_sums(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """`behaviour_sums` of two parts of a batch combined (sums added, "/max" keys the larger)."""
    return {
        k: max(total.get(k, v), v) if k.endswith("/max") else total.get(k, 0.0) + v for k, v in part.items()
    }


def behaviour_metrics(sums: dict[str, float]) -> dict[str, float]:
    """From the whole batch's `behaviour_sums`: behaviour/ratio_mean, behaviour/ratio_max, behaviour/cut_frac
    (the fraction of units whose weight the correction lowered), behaviour/ess = (sum rho)^2 / (n sum rho^2) in
    (0, 1] (1 when every ratio is equal, as on-policy; 1/n when one unit carries all the weight), and
    mismatch/kl (the token mean of k3) and mismatch/max_abs (the largest |log pi_prox - log pi_sampler|)."""
    n = max(sums["n"], 1.0)
    return {
        "behaviour/ratio_mean": sums["sum"] / n,
        "behaviour/ratio_max": sums["ratio/max"],
        "behaviour/cut_frac": sums["cut"] / n,
        "behaviour/ess": sums["sum"] ** 2 / (n * sums["sum_sq"]) if sums["sum_sq"] > 0 else 1.0,
        "mismatch/kl": sums["kl"] / max(sums["tokens"], 1.0),
        "mismatch/max_abs": sums["gap/max"],
    }
