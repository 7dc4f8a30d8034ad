"""The update's batch: rollouts collated into right-padded tensors (`TrainBatch`: masks from lengths, never from
pad ids) and cut into micro-batches of similar lengths. Used by the update (step/update.py) and the critic
(step/critic.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from keelrl.algo.logprobs import Autocast, autocast_context
from keelrl.rollout import Rollout


@dataclass
class TrainBatch:
    """Right-padded sequences (prompt + completion). target_mask[i, t] = 1 where position t predicts a
    trainable completion token (from lengths, never from pad ids; none for a rollout without a reward, whose
    status is not "ok": it is in the batch but not trained on); per-token tensors align with it."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    target_mask: torch.Tensor  # [B, T]
    sampler_logprobs: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B] (one per sequence), or [B, T] (per token: gae)
    lengths: torch.Tensor  # [B]
    old_logprobs: torch.Tensor | None = None  # [B, T] pi_old for the PPO ratio
    ref_logprobs: torch.Tensor | None = None  # [B, T] reference policy, when KL is on
    is_weights: torch.Tensor | None = None  # [B, T] the off-policy correction's weights (algo/offpolicy.py)
    returns: torch.Tensor | None = None  # [B, T] the critic's targets (gae)
    old_values: torch.Tensor | None = None  # [B, T] the critic's values when the batch was scored (gae)

    def per_token_no_grad(
        self, micro_batch_size: int, autocast: Autocast, fn: Callable[[TrainBatch], torch.Tensor]
    ) -> torch.Tensor:
        """[B, T]: `fn(micro_batch)` (a [b, t] per-position tensor) over the batch in row order, micro-batch by
        micro-batch, without gradient (log-probs of a model, values of the critic)."""
        out = torch.zeros_like(self.sampler_logprobs)
        B = self.input_ids.shape[0]
        for start in range(0, B, micro_batch_size):
            idx = torch.arange(start, min(start + micro_batch_size, B), device=self.input_ids.device)
            mb = self.select(idx)
            with torch.no_grad(), autocast_context(mb.input_ids.device, autocast):
                values = fn(mb)
            out[idx, : values.shape[1]] = values
        return out

    def select(self, idx: torch.Tensor) -> TrainBatch:
        """Rows `idx`, cut to the longest of them."""
        T = int(self.lengths[idx].max())
        rows = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(
            **{k: t if t is None else t[idx] if t.ndim == 1 else t[idx, :T] for k, t in rows.items()}
        )


def collate(rollouts: list[Rollout], pad_id: int, device: torch.device) -> TrainBatch:
    B = len(rollouts)
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
    T = max(lengths)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    target = torch.zeros((B, T), dtype=torch.float32)
    slp = torch.zeros((B, T), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        P, C = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : P + C] = torch.tensor(r.prompt_ids + r.completion_ids, dtype=torch.long)
        attn[i, : P + C] = 1
        if C and r.status == "ok":
            target[i, P - 1 : P - 1 + C] = torch.tensor(r.trainable, dtype=torch.float32)
            slp[i, P - 1 : P - 1 + C] = torch.tensor(r.sample_logprobs, dtype=torch.float32)
    adv = torch.tensor([r.advantage for r in rollouts], dtype=torch.float32)
    tensors = (input_ids, attn, target, slp, adv, torch.tensor(lengths))
    return TrainBatch(*(t.to(device) for t in tensors))


def micro_batches(
    batch: TrainBatch, idx: torch.Tensor, size: int, group_prompts: bool = False
) -> list[TrainBatch]:
    """Split the mini-batch `idx` into micro-batches of similar lengths (less padding). With `group_prompts`
    (prefix sharing) rows are ordered by (prompt length, prompt, length), so a micro-batch holds few distinct
    prompts and runs each once. The loss does not depend on the split (weights use global counts)."""
    if not group_prompts:
        order = idx[torch.argsort(batch.lengths[idx], stable=True)]
    else:
        mask = batch.target_mask[idx].bool()  # [b, T]
        first = torch.where(mask.any(dim=1), mask.float().argmax(dim=1), batch.lengths[idx] - 1).tolist()
        ids, lengths = batch.input_ids[idx].tolist(), batch.lengths[idx].tolist()
        keys = [(first[i], ids[i][: first[i]], lengths[i]) for i in range(len(first))]
        order = idx[
            torch.tensor(sorted(range(len(keys)), key=keys.__getitem__), dtype=torch.long, device=idx.device)
        ]
    return [batch.select(order[i : i + size]) for i in range(0, len(order), size)]
