"""Which examples a step trains on, how they are packed into rows, and the loss weight of every token.

- Order: step s takes examples s*B .. s*B + B - 1 of the endless sequence epoch 0, epoch 1, ..., each epoch a
  permutation drawn from (train.seed, epoch). The data position is a function of the step, so a resumed run
  trains on exactly the examples the uninterrupted run would have; rank r of W takes every W-th of them.
- Weights: the loss is `sum(-logprob * weight)` over trained tokens, the weights from `algo.loss_agg`
  through the same `token_weights` as RL, with *global* counts (all of the step's examples on all ranks).
  So the loss, and its gradient, do not depend on micro-batching, packing or the number of ranks.
- Packing (data.packing): examples are laid into rows of max_length tokens first-fit in order; each keeps its
  own positions (from 0) and a document index, from which the forward builds block-diagonal attention.
  Without packing each row is one example. Either way the rows hold the same tokens with the same weights.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from keelrl.algo.losses import LossAgg, token_weights
from keelrl.core.seeds import stable_hash
from keelrl.stages.sft.data import Example


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    order = list(range(n))
    if shuffle:
        random.Random(stable_hash("sft-order", seed, epoch)).shuffle(order)
    return order


def step_indices(step: int, n: int, batch_size: int, seed: int, shuffle: bool) -> list[int]:
    """Indices (into the training examples) of step `step`'s batch; a batch may span two epochs."""
    if n <= 0:
        raise ValueError("no training examples")
    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        out.extend(epoch_order(n, epoch, seed, shuffle)[offset : offset + batch_size - len(out)])
    return out


def epoch_of(step: int, n: int, batch_size: int) -> float:
    """Epochs completed after `step` steps (fractional)."""
    return step * batch_size / max(n, 1)


def pack(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """First-fit in order: example i goes into the first row with room for it (a new row when none has).
    Returns rows as lists of example positions. Every length must be <= max_length."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        if n > max_length:
            raise ValueError(f"example {i} has {n} tokens, over max_length {max_length}")
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(max_length - n)
    return rows


@dataclass
class SFTBatch:
    """Rows of tokens [R, T]: `documents` the example of each position within its row (-1: padding),
    `positions` its position within that example, `target_mask` 1 where the next token is trained, and
    `weights` that token's loss weight."""

    input_ids: torch.Tensor
    documents: torch.Tensor
    positions: torch.Tensor
    target_mask: torch.Tensor
    weights: torch.Tensor

    def rows(self, idx: Sequence[int]) -> SFTBatch:
        i = torch.as_tensor(list(idx), dtype=torch.long)
        t = int((self.documents[i] >= 0).sum(dim=1).max()) if len(idx) else 0  # trim the common padding
        return SFTBatch(*(x[i, :t] for x in vars(self).values()))

    def chunks(self, size: int) -> list[SFTBatch]:
        """Consecutive micro-batches of at most `size` rows."""
        R = self.input_ids.shape[0]
        return [self.rows(range(i, min(i + size, R))) for i in range(0, R, size)]

    def to(self, device: torch.device) -> SFTBatch:
        return SFTBatch(*(x.to(device) for x in vars(self).values()))  # every field, in order


def example_weights(
    examples: Sequence[Example], mode: LossAgg, global_tokens: float, global_examples: float, max_length: int
) -> list[torch.Tensor]:
    """Per example, the weight [L] of each position's next-token loss (0 where the next token is not
    trained): `token_weights` applied to the examples as one padded batch."""
    if not examples:
        return []
    L = max(len(e.ids) for e in examples)
    mask = torch.zeros(len(examples), L)  # [E, L] position t scores token t + 1
    for i, e in enumerate(examples):
        mask[i, : len(e.ids) - 1] = torch.tensor(e.labels[1:], dtype=torch.float32)
    w = token_weights(mask, mode, global_tokens, global_examples, max_length)  # [E, L]
    return [w[i, : len(e.ids)] for i, e in enumerate(examples)]


def collate(
    examples: Sequence[Example], weights: Sequence[torch.Tensor], rows: Sequence[Sequence[int]], pad_id: int
) -> SFTBatch:
    """Lay `examples` into `rows` (lists of example positions; see `pack`), right-padded to the longest row."""
    T = max(sum(len(examples[i].ids) for i in row) for row in rows)
    R = len(rows)
    ids = torch.full((R, T), pad_id, dtype=torch.long)
    docs = torch.full((R, T), -1, dtype=torch.long)
    pos = torch.zeros((R, T), dtype=torch.long)
    target = torch.zeros((R, T))
    w = torch.zeros((R, T))
    for r, row in enumerate(rows):
        at = 0
        for d, i in enumerate(row):
            e, n = examples[i], len(examples[i].ids)
            ids[r, at : at + n] = torch.tensor(e.ids)
            docs[r, at : at + n] = d
            pos[r, at : at + n] = torch.arange(n)
            target[r, at : at + n - 1] = torch.tensor(e.labels[1:], dtype=torch.float32)
            w[r, at : at + n] = weights[i]
            at += n
    return SFTBatch(ids, docs, pos, target, w)


def build_batch(
    examples: Sequence[Example],
    mode: LossAgg,
    global_tokens: float,
    global_examples: float,
    max_length: int,
    packing: bool,
    pad_id: int,
) -> SFTBatch:
    """This rank's examples of a step as rows (packed or one per row), with their global-count weights."""
    weights = example_weights(examples, mode, global_tokens, global_examples, max_length)
    lengths = [len(e.ids) for e in examples]
    if packing:
        rows = pack(lengths, max_length)
    else:  # one example per row, similar lengths next to each other (less padding per micro-batch)
        rows = [[i] for i in sorted(range(len(examples)), key=lengths.__getitem__)]
    return collate(examples, weights, rows, pad_id)
