"""Per-token log-probs and entropies of completion tokens under a causal LM.

Two savings over a plain forward of every (prompt + completion) sequence, both exact:
- Only positions that predict completion tokens go through the output head: for a 49k-vocabulary model the
  head dominates the cost, and prompts are usually longer than completions.
- Shared prefixes run once (`share_prefix`): a GRPO batch holds each prompt G times. Each row is split into a
  prefix (before the first scored position) and a suffix; each distinct prefix goes through the decoder
  once, its keys/values are copied to the rows that share it, and the suffixes attend to them. Gradients
  flow back through the copies into the one prefix pass, so the loss and its gradient are those of the
  padded forward (up to float rounding; tested to 1e-5 on log-probs and 1e-6 on gradients).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedModel


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [N, V] -> log softmax(logits / T) [N, V] in float32 (T = 0 is read as 1, greedy)."""
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / t, dim=-1)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [N, V], targets [N] -> log softmax(logits / T)[targets] [N] (T = 0 is read as 1, greedy)."""
    return _log_softmax(logits, temperature).gather(-1, targets[:, None]).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [N, V] -> entropy of softmax(logits / T) in nats [N]."""
    logp = _log_softmax(logits, temperature)
    return -(logp.exp() * logp).sum(dim=-1)


Autocast = Literal["off", "bf16"]


def autocast_context(device: torch.device, mode: Autocast) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast for the model's matmuls when `mode` is "bf16" (train.autocast); a no-op otherwise."""
    if mode == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _head_is_plain(model: PreTrainedModel) -> bool:
    """True when logits = lm_head(final hidden state), with no soft-capping or scaling after the head."""
    cfg = model.config
    scale = getattr(cfg, "logit_scale", None)
    return not getattr(cfg, "final_logit_softcapping", None) and scale in (None, 1, 1.0)


def padded_row_count(n: int) -> int:
    """n rounded up to a multiple of 2 ** (bit_length(n) - 5): 16 sizes per power of two, padding < n/16."""
    step = 1 << max(0, n.bit_length() - 5)
    return -(-n // step) * step


def scored_logits(model: PreTrainedModel, hidden: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """The output head on the scored positions only: hidden [B, S, H], scored [B, S] bool -> logits [N, V]
    (row-major). For a bf16 matmul on CPU, oneDNN builds a kernel for every new shape, and the number of
    scored tokens differs in nearly every micro-batch: a 98-token head took 3.0 ms forward and 13.7 ms
    backward at a new row count against 0.6 and 1.6 ms at a repeated one (benchmarks/cpu_overheads.py), so
    there the rows are padded to `padded_row_count` (row 0 repeated, its extra logits dropped)."""
    head = model.get_output_embeddings()
    index = scored.flatten().nonzero().squeeze(1)  # [N]
    n = int(index.numel())
    low_precision = torch.is_autocast_enabled("cpu") or head.weight.dtype in (torch.bfloat16, torch.float16)
    rows = padded_row_count(n) if hidden.device.type == "cpu" and low_precision else n
    if rows > n:
        index = torch.cat([index, index.new_zeros(rows - n)])
    return head(hidden.flatten(0, 1).index_select(0, index))[:n]


def cache_argument(module: torch.nn.Module) -> str:
    """The name of `module.forward`'s KV-cache argument: transformers 5 renames `past_key_values` -> `cache`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def supports_prefix_sharing(model: PreTrainedModel) -> bool:
    """Needs full-past attention in every layer (no sliding window, linear, recurrent) and a KV cache."""
    cfg = model.config
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return False
    return bool(getattr(cfg, "use_cache", True)) and not getattr(cfg, "is_encoder_decoder", False)


def select_cache_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep (or repeat) batch rows `rows` [b'] of every layer of a transformers KV cache, in that order,
    differentiably. `index_select` rather than the cache's own `batch_select_indices` (advanced indexing):
    on CPU it copies the same rows about 7x faster (0.26 against 1.8 ms for one [32, 4, 31, 64] bf16 layer
    repeated to 256 rows; benchmarks/cpu_overheads.py)."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers < 4.56
        cache.batch_select_indices(rows)
        return
    for layer in layers:
        if getattr(layer, "is_initialized", False):
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
            if hasattr(layer, "batch_size"):
                layer.batch_size = int(rows.numel())


@dataclass
class PrefixPlan:
    """How a batch splits into distinct shared prefixes and per-row suffixes."""

    prefix_ids: torch.Tensor  # [U, K] right-padded distinct prefixes
    prefix_mask: torch.Tensor  # [U, K]
    rows: torch.Tensor  # [B] distinct prefix of each row
    suffix_ids: torch.Tensor  # [B, S] right-padded: tokens from the first scored position on
    suffix_mask: torch.Tensor  # [B, S]
    suffix_positions: torch.Tensor  # [B, S] position ids (prefix length + offset)
    suffix_scored: torch.Tensor  # [B, S] bool: suffix positions whose next token is scored


def plan_prefix_sharing(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor
) -> PrefixPlan | None:
    """Right-padded input_ids/attention_mask [B, T], scored [B, T]. Row i's prefix is everything before its
    first scored position (or last token). None when no two rows share a prefix, or one is empty."""
    B, T = input_ids.shape
    lengths = attention_mask.sum(dim=1)  # [B]
    any_scored = scored.any(dim=1)  # [B]
    first = torch.where(any_scored, scored.float().argmax(dim=1), lengths - 1)  # [B] prefix length K_i
    if bool((first < 1).any()):
        return None
    ks, ids = first.tolist(), input_ids.tolist()
    index: dict[tuple[int, ...], int] = {}
    rows_list = [index.setdefault(tuple(ids[i][: ks[i]]), len(index)) for i in range(B)]
    U = len(index)
    if U == B:
        return None
    device = input_ids.device
    prefix_ids = pad_sequence([torch.tensor(p, dtype=input_ids.dtype) for p in index], batch_first=True)
    prefix_mask = pad_sequence(
        [torch.ones(len(p), dtype=attention_mask.dtype) for p in index], batch_first=True
    )
    S = int((lengths - first).max())
    offsets = torch.arange(S, device=device)  # [S]
    src = first[:, None] + offsets[None, :]  # [B, S] position in the full row
    valid = src < lengths[:, None]  # [B, S]
    src = src.clamp_max(T - 1)
    return PrefixPlan(
        prefix_ids=prefix_ids.to(device),
        prefix_mask=prefix_mask.to(device),
        rows=torch.tensor(rows_list, dtype=torch.long, device=device),
        suffix_ids=torch.where(valid, input_ids.gather(1, src), 0),
        suffix_mask=valid.to(attention_mask.dtype),
        suffix_positions=src.masked_fill(~valid, 0),
        suffix_scored=scored.gather(1, src) & valid,
    )


def _shared_prefix_forward(model: PreTrainedModel, plan: PrefixPlan, plain_head: bool) -> torch.Tensor:
    """Logits [N, V] at the plan's scored suffix positions (row-major), with each prefix run once."""
    body = model.get_decoder() if plain_head else model
    out = body(input_ids=plan.prefix_ids, attention_mask=plan.prefix_mask, use_cache=True)
    cache = out.past_key_values
    select_cache_rows(cache, plan.rows)  # each row gets (a differentiable copy of) its prefix's keys/values
    attn = torch.cat([plan.prefix_mask[plan.rows], plan.suffix_mask], dim=1)  # [B, K + S]
    out = body(
        input_ids=plan.suffix_ids,
        attention_mask=attn,
        position_ids=plan.suffix_positions,
        use_cache=True,
        **{cache_argument(body): cache},
    )
    if plain_head:
        return scored_logits(model, out.last_hidden_state, plan.suffix_scored)  # [N, V]
    return out.logits[plan.suffix_scored]


def block_causal_mask(documents: torch.Tensor) -> torch.Tensor:
    """documents [B, T] -> attention mask [B, 1, T, T] (True = may attend): causal within each document;
    a padding position (-1) attends to itself only, so no softmax row is empty."""
    T = documents.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=documents.device).tril()  # [T, T]
    same = documents[:, :, None] == documents[:, None, :]  # [B, T, T]
    own = torch.eye(T, dtype=torch.bool, device=documents.device)[None]  # [1, T, T]
    valid = (documents >= 0)[:, :, None]  # [B, T, 1]
    return ((same & causal & valid) | own)[:, None]


def completion_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    share_prefix: bool = True,
    documents: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded input_ids/attention_mask [B, T]; target_mask [B, T] marks positions t whose *next*
    token input_ids[:, t + 1] is a completion token to score. Returns (logprobs [B, T], entropy [B, T] or
    None), zero where target_mask is 0. The entropy carries a gradient only when `entropy_grad`.
    `share_prefix` runs rows' common prefixes once (see the module docstring); the result is the same.
    Packed rows (SFT): `documents` [B, T] (the sequence each position belongs to, -1 padding) and `positions`
    [B, T] (its position in that sequence); each position then attends only to its own sequence."""
    B, T = input_ids.shape
    pos = target_mask.bool()
    pos[:, -1] = False  # the last position has no next token
    targets = input_ids[:, 1:][pos[:, :-1]]  # [N]
    plain = _head_is_plain(model)
    plan = None
    kwargs: dict[str, torch.Tensor] = {"attention_mask": attention_mask}
    if documents is not None:  # a 4D mask reaches the attention as is: SDPA reads booleans, eager *adds* the
        # mask (True = +1), so both get it additive (0 / dtype min); a bool one let eager attend to the future
        allowed = block_causal_mask(documents)  # [B, 1, T, T]
        additive = torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device)
        additive = additive.masked_fill(~allowed, torch.finfo(model.dtype).min)  # [B, 1, T, T]
        kwargs = {"attention_mask": additive, "position_ids": positions}
    elif share_prefix and supports_prefix_sharing(model):
        plan = plan_prefix_sharing(input_ids, attention_mask, pos)
    if plan is not None:
        logits = _shared_prefix_forward(model, plan, plain)  # [N, V]
    elif plain:
        hidden = model.get_decoder()(input_ids=input_ids, **kwargs).last_hidden_state
        logits = scored_logits(model, hidden, pos)  # [N, V]
    else:
        logits = model(input_ids=input_ids, **kwargs).logits[pos]
    logp = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    logp[pos] = logprobs_from_logits(logits, targets, temperature)
    ent = None
    if with_entropy:
        ent = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent[pos] = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
    return logp, ent


class LogprobModule(torch.nn.Module):
    """`completion_logprobs` of `model` as a module: one forward call covers the decoder and head calls, so
    the hooks of DistributedDataParallel and FSDP2 (which wrap this) see one forward per micro-batch."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`completion_logprobs(self.model, *args, **kwargs)`."""
        return completion_logprobs(self.model, *args, **kwargs)
