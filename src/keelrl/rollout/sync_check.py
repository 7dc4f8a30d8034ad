"""Checking a weight push: the engine samples a few tokens of fixed probe prompts, the trainer scores the same
tokens, and the gap between the two log-probs says whether the engine samples from the trainer's weights.

Why sampled tokens and not `prompt_logprobs`: a probe must go through the path the rollouts take. vLLM's
prompt log-probs skip the prefix cache, so they would not see a cache that still holds keys and values of the
old weights; sampling the probe does (the probe prompts are the same every time, so they are in the cache).

Worked numbers (test_sync_check.py): trainer [[-1.0, -2.0], [-0.5]], engine [[-1.1, -2.0], [-0.2]] ->
per-token |gap| 0.1, 0.0, 0.3 -> max 0.3, mean 0.4 / 3 = 0.1333 (a token mean: long probes weigh more).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedModel

from keelrl.algo.logprobs import logprobs_from_logits


@dataclass(frozen=True)
class SyncGap:
    max: float  # largest |trainer - engine| log-prob over the probe's tokens (nats)
    mean: float  # token mean of the same
    tokens: int


def logprob_gap(trainer: list[list[float]], engine: list[list[float]]) -> SyncGap:
    """Per-token |trainer - engine| over rows of possibly different lengths (the same lengths row by row)."""
    gaps = [abs(a - b) for tr, en in zip(trainer, engine, strict=True) for a, b in zip(tr, en, strict=True)]
    if not gaps:
        return SyncGap(0.0, 0.0, 0)
    return SyncGap(max(gaps), sum(gaps) / len(gaps), len(gaps))


def trainer_logprobs(
    model: PreTrainedModel, prompts: list[list[int]], completions: list[list[int]], temperature: float
) -> list[list[float]]:
    """The trainer's log-probs of each completion after its prompt: log softmax(logits / T), float32 (T = 0:
    greedy, scored at T = 1 as the samplers report it). One forward over right-padded rows: with a causal
    model, padding after a row's tokens changes none of its logits."""
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    if not any(completions):
        return [[] for _ in rows]
    device = next(model.parameters()).device
    ids = pad_sequence([torch.tensor(r) for r in rows], batch_first=True)  # [B, L], zeros after each row
    mask = pad_sequence([torch.ones(len(r), dtype=torch.long) for r in rows], batch_first=True)
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()  # [B, L, V]
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        scored = logits[i, len(p) - 1 : len(p) - 1 + len(c)]  # [N, V]: position t predicts token t + 1
        out.append(logprobs_from_logits(scored, torch.tensor(c, device=device), temperature).tolist())
    return out
