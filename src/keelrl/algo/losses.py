"""Policy-gradient losses, KL and entropy terms, and loss normalisation.

Per-token functions take and return `[B, T]` tensors aligned with the completion tokens; positions outside
the mask are ignored by the weights. The loss is `sum(per_token_loss * weights)`, where `token_weights`
normalises with *global* counts (the whole mini-batch across micro-batches and ranks), so summed
micro-batch losses are exactly the full-batch loss: micro-batching and data parallelism do not change it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean", "constant"]
KLEstimator = Literal["k1", "k2", "k3"]  # a value estimator (kl_penalty)


def token_weights(
    mask: torch.Tensor, mode: LossAgg, global_tokens: float, global_seqs: float, max_new_tokens: int
) -> torch.Tensor:
    """mask [B, T] (1 = trainable completion token) -> weights [B, T] such that sum(loss * weights) is:
    token_mean: the mean over all trainable tokens of the global mini-batch (DAPO);
    seq_mean_token_mean: the mean over sequences of each sequence's token mean (GRPO);
    constant: the token sum divided by global_seqs * max_new_tokens (Dr. GRPO)."""
    mask = mask.to(torch.float32)
    if mode == "token_mean":
        return mask / max(global_tokens, 1.0)
    if mode == "seq_mean_token_mean":
        per_seq = mask.sum(dim=1, keepdim=True).clamp_min(1.0)  # [B, 1]
        return mask / per_seq / max(global_seqs, 1.0)
    if mode == "constant":
        return mask / (max(global_seqs, 1.0) * max_new_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip with separate lower/upper ranges (DAPO's clip-higher) and optional dual clip. logprobs,
    old_logprobs [B, T]; advantages [B, T] (or broadcastable). Returns (loss [B, T], stats) where stats hold
    per-token float indicators `clipped_low` (ratio < 1 - clip_low with A < 0: gradient cut), `clipped_high`
    (ratio > 1 + clip_high with A > 0), `dual_clipped`, `ratio`. Dual clip (Ye et al. 2020): for A < 0 the
    loss is capped at -c * A."""
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip > 0.0:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    with torch.no_grad():
        stats = {
            "ratio": ratio.detach(),
            "clipped_low": ((ratio < 1.0 - clip_low) & (advantages < 0)).float(),
            "clipped_high": ((ratio > 1.0 + clip_high) & (advantages > 0)).float(),
            "dual_clipped": dual.float(),
        }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi, with log r = ref_logprobs - logprobs
    (Schulman 2020): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r (unbiased, never negative).
    Their values; what each does as a loss is `KL_LOSSES`'."""
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}")


# algo.kl_estimator -> the KL term per token in the loss, from (logprobs, ref_logprobs, old_logprobs) [B, T]. The
# tokens are samples of pi_old; the gradient each gives in expectation (tests/unit/test_kl_gradients.py):
#   k3_is  ratio * k3, ratio = pi / pi_old with its gradient: grad KL(pi || ref), exactly, also off-policy; its
#          value is an unbiased estimate of KL(pi || ref) (DeepSeek-V3.2; TRL's use_bias_correction_kl)
#   k2     (log pi - log ref)^2 / 2: grad KL(pi || ref) when pi_old = pi (on-policy)
#   k3     k3 alone, the GRPO papers' convention (DeepSeekMath): grad KL(ref || pi), the reverse direction
#   k1     log pi - log ref: zero; it regularises nothing
# "k1_reward" has no loss term: the penalty is in the reward (`kl_reward_penalty`).
KL_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k3_is": lambda lp, ref, old: torch.exp((lp - old).clamp(-20.0, 20.0)) * kl_penalty(lp, ref, "k3"),
    "k2": lambda lp, ref, old: kl_penalty(lp, ref, "k2"),
    "k3": lambda lp, ref, old: kl_penalty(lp, ref, "k3"),
    "k1": lambda lp, ref, old: kl_penalty(lp, ref, "k1"),
}


def kl_reward_penalty(
    sampler_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """[B, T] k1 = log pi_sampler - log ref per trainable token, 0 elsewhere, no gradient: `algo.kl_estimator =
    "k1_reward"` subtracts kl_coef times it from the reward before the advantages (PPO-RLHF; docs in
    algo/config.py). Its expectation over a sequence is the sequence's KL(pi || ref), so the policy gradient of
    the penalised reward is that of E[R] - kl_coef * KL(pi || ref)."""
    return (sampler_logprobs - ref_logprobs).detach().clamp(-20.0, 20.0) * mask


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """[B]: the mean over each sequence's trainable tokens of log(pi / pi_old), the log of its geometric-mean
    ratio (GSPO's length-normalised ratio); 0 for a sequence without trainable tokens. Differentiable."""
    n = mask.sum(dim=1).clamp_min(1.0)  # [B]
    return ((logprobs - old_logprobs) * mask).sum(dim=1) / n
