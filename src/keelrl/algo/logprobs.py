"""Per-token log-probs and entropies of completion tokens under a causal LM.

Only positions that predict completion tokens go through the output head: for a 49k-vocabulary model the
head dominates the cost, and prompts are usually longer than completions.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [N, V], targets [N] -> log softmax(logits / T)[targets] [N] (T = 0 is read as 1, greedy)."""
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / t, dim=-1)  # [N, V]
    return logp.gather(-1, targets[:, None]).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [N, V] -> entropy of softmax(logits / T) in nats [N]."""
    t = temperature if temperature > 0 else 1.0
    z = logits.float() / t
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _head_is_plain(model: PreTrainedModel) -> bool:
    """True when logits = lm_head(final hidden state), with no soft-capping or scaling after the head."""
    cfg = model.config
    return not getattr(cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) in (
        None,
        1,
        1.0,
    )


def completion_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded input_ids/attention_mask [B, T]; target_mask [B, T] marks positions t whose *next*
    token input_ids[:, t + 1] is a completion token to score. Returns (logprobs [B, T], entropy [B, T] or
    None), zero where target_mask is 0. The entropy carries a gradient only when `entropy_grad`."""
    B, T = input_ids.shape
    pos = target_mask.bool()
    pos[:, -1] = False  # the last position has no next token
    targets = input_ids[:, 1:][pos[:, :-1]]  # [N]
    if _head_is_plain(model):
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = model.get_output_embeddings()(hidden[pos])  # [N, V]
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[pos]
    logp = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    logp[pos] = logprobs_from_logits(logits, targets, temperature)
    ent = None
    if with_entropy:
        ent = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent[pos] = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
    return logp, ent
