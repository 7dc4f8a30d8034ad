"""`HFSampler`: keelrl's batched KV-cache sampler over a transformers causal LM (any torch device).

Its log-probs are those of the temperature-scaled full distribution, log softmax(logits / T), which is
exactly what the trainer computes; top-p/top-k only restrict which tokens may be drawn. Randomness is per
row: row i draws its uniforms from its own seed, so a completion does not depend on batch size, chunking,
padding or how rows are split across ranks.

Decoding (`decode`): "eager" calls the model once per token and drops finished rows from the batch; "graph"
keeps the batch whole and runs every token through one `torch.compile(mode="reduce-overhead")` step over a
cache that stays at one address (CUDA graphs on a GPU, where an eager step of a small model is kernel
launches and Python; inductor's fused kernels on CPU), compiled once per shape: rows padded to a power of
two, the cache length rounded up to 64; "auto" is graph on CUDA. The prefill stays eager. Compiled kernels
may round differently from eager ones, so the two agree token for token except where a draw lands within
rounding of a token boundary (tests/integration/test_graph_decode.py); log-probs agree to about 1e-6 in fp32.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StaticCache

from keelrl.algo.logprobs import (
    Autocast,
    autocast_context,
    cache_argument,
    select_cache_rows,
    supports_prefix_sharing,
)
from keelrl.models.load import pad_token_id
from keelrl.models.weights import NamedTensors, load_untied, owns
from keelrl.rollout.types import Generation, SamplingSettings, Versioned

Decode = Literal["auto", "eager", "graph"]


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the tokenizer and the generation config (chat models often end turns with another token)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        ids.update(int(i) for i in gen_eos)
    return sorted(ids)


def row_uniforms(seeds: list[int], n: int) -> torch.Tensor:
    """[B, n] uniforms in [0, 1); row i depends only on seeds[i]."""
    out = torch.empty(len(seeds), n, dtype=torch.float64)
    g = torch.Generator()
    for i, s in enumerate(seeds):
        g.manual_seed(int(s) % (2**63))
        out[i] = torch.rand(n, generator=g, dtype=torch.float64)
    return out


def sample_from_logits(
    logits: torch.Tensor, settings: SamplingSettings, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] (float32), uniforms [B] -> (tokens [B], log-probs [B]) by inverse-CDF sampling, the
    log-probs under the full log_softmax(logits / T) (see the module docstring)."""
    if settings.temperature == 0.0:
        tokens = logits.argmax(dim=-1)  # [B]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logp
    logp_full = torch.log_softmax(logits / settings.temperature, dim=-1)  # [B, V]
    probs = logp_full.exp()
    if settings.top_k > 0 or settings.top_p < 1.0:
        probs = _truncate(probs, settings.top_k, settings.top_p)
    cdf = probs.double().cumsum(dim=-1)  # [B, V]
    thresholds = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]  # [B, 1]
    tokens = torch.searchsorted(cdf, thresholds).squeeze(-1).clamp_max(probs.shape[-1] - 1)  # [B]
    # never pick a zero-probability token because of rounding at a boundary
    zero = probs.gather(-1, tokens[:, None]).squeeze(-1) <= 0
    if zero.any():
        tokens[zero] = probs[zero].argmax(dim=-1)
    return tokens, logp_full.gather(-1, tokens[:, None]).squeeze(-1)


def _truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero out tokens outside top-k / the smallest set with mass >= top_p (ties kept)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)  # [B, V]
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
    if top_p < 1.0:
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        keep &= mass_before < top_p
    keep[:, 0] = True
    mask = torch.zeros_like(keep).scatter(-1, order, keep)
    return probs * mask


def generation_chunks(prompts: list[list[int]], chunk_size: int) -> list[list[int]]:
    """The batches `HFSampler` generates `prompts` in (row indices): sorted by (length, prompt), so lengths
    go together and a group shares its prefill, cut every `chunk_size` rows (0: one batch). A row's floats
    depend on its batch, so a sampler that must match this one bit for bit generates these same batches."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i]))
    size = chunk_size or max(1, len(order))
    return [order[start : start + size] for start in range(0, len(order), size)]


class HFSampler(Versioned):
    """Batched sampling with a KV cache. The per-token loop (the CPU time) does little but the model call:
    - Each distinct prompt is prefilled once (`share_prefix`): a group's G completions of one prompt copy
      its keys/values instead of recomputing them, which removes (G - 1) / G of the prefill.
    - Prompts are left-padded with explicit position ids; the keys/values live in a preallocated cache
      (`StaticCache`, written in place) rather than one that is re-concatenated every token.
    - Sampled tokens and log-probs are written into preallocated [B, N] tensors; nothing is converted to
      Python lists until the chunk is done.
    - Finished rows are dropped from the batch (cache rows included) once they are a quarter of it, so
      copying the cache is amortised over several finished rows instead of paid at every EOS."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        chunk_size: int = 0,
        share_prefix: bool = True,
        autocast: Autocast = "off",
        on_progress: Callable[[], None] | None = None,
        decode: Decode = "auto",
    ) -> None:
        """`on_progress` is called once per decode step (the trainer's heartbeat sees sampling progress)."""
        self.model = model
        self.decode = decode
        self._graphs: dict[tuple[int, int], tuple[Any, Callable[..., torch.Tensor]]] = {}
        self.pad_id = pad_token_id(tokenizer)
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.chunk_size = chunk_size
        self.share_prefix = share_prefix
        self.autocast: Autocast = autocast
        self.on_progress = on_progress if on_progress is not None else lambda: None
        self._version = 0

    def update_weights(self, weights: NamedTensors, version: int) -> None:
        """Sample with `weights` from now on, tagged `version`. The model's own tensors (the in-process sampler
        of the policy being trained) are used as they are, with no copy; others are loaded into the model."""
        named = dict(weights)
        if not owns(self.model, named):
            load_untied(self.model, named)  # WeightsMismatch names what does not fit
        self._version = version

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if not prompts:
            return []
        uniforms = row_uniforms(seeds, settings.max_new_tokens)  # [B, N]
        results: list[Generation | None] = [None] * len(prompts)
        device = next(self.model.parameters()).device
        graph = self.decode == "graph" or (self.decode == "auto" and device.type == "cuda")
        graph = graph and supports_prefix_sharing(self.model)  # it needs a static cache
        for idx in generation_chunks(prompts, self.chunk_size):
            # graph: rows padded to a power of two (>= 8) with copies of the first, so few shapes are compiled
            rows = idx + idx[:1] * (max(8, 1 << (len(idx) - 1).bit_length()) - len(idx)) if graph else idx
            with autocast_context(device, self.autocast):
                outs = self._generate_chunk([prompts[i] for i in rows], settings, uniforms[rows], graph)
            for i, out in zip(idx, outs):  # the padding rows' outputs are dropped
                results[i] = out
        return results  # type: ignore[return-value]

    def _generate_chunk(
        self, prompts: list[list[int]], settings: SamplingSettings, uniforms: torch.Tensor, graph: bool
    ) -> list[Generation]:
        model = self.model
        device = next(model.parameters()).device
        B, N = len(prompts), settings.max_new_tokens
        # the distinct prompts, and for each row the distinct prompt it continues
        if self.share_prefix:
            index: dict[tuple[int, ...], int] = {}
            src = [index.setdefault(tuple(p), len(index)) for p in prompts]
            unique = [list(k) for k in index]
        else:
            src, unique = list(range(B)), prompts
        U, P = len(unique), max(len(p) for p in unique)
        input_ids = torch.full((U, P), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((U, P), dtype=torch.long)
        for i, p in enumerate(unique):
            input_ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            prompt_mask[i, P - len(p) :] = 1
        input_ids, prompt_mask = input_ids.to(device), prompt_mask.to(device)
        positions = (prompt_mask.cumsum(-1) - 1).clamp_min(0)  # [U, P]
        L = -(-(P + N) // 64) * 64 if graph else P + N  # graph: the cache length rounded up (few shapes)
        # The mask covers the whole cache: completion slots are 1; causality hides those not yet written.
        attn = torch.cat([prompt_mask, prompt_mask.new_ones((U, L - P))], dim=1)  # [U, L]
        # under bf16 autocast the attention reads the cached keys/values as bf16 anyway: store them so
        cache = _new_cache(model, L, torch.bfloat16 if self.autocast == "bf16" else None)
        static, graph = cache is not None, graph and cache is not None
        cache_arg = cache_argument(model)
        out = model(
            input_ids=input_ids,
            attention_mask=attn[:, :P],
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_arg: cache},
        )
        cache = out[cache_arg]
        logits = out.logits[:, -1, :].float()  # [U, V]
        next_pos = positions[:, -1] + 1  # [U]
        rows = torch.tensor(src, dtype=torch.long, device=device)  # [B] distinct prompt of each row
        if U != B or src != list(range(B)):
            logits, next_pos, attn = logits[rows], next_pos[rows], attn[rows]
            select_cache_rows(cache, rows)

        def eager_step(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            nonlocal cache
            out = model(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: cache}
            )
            cache = out[cache_arg]
            return out.logits[:, -1, :].float()  # [b, V]

        step = self._graph_step(cache, cache_arg) if graph else eager_step
        stop = torch.tensor(self.stop_ids, dtype=torch.long, device=device)
        tokens = torch.full((B, N), self.pad_id, dtype=torch.long, device=device)  # [B, N]
        logps = torch.zeros((B, N), dtype=torch.float32, device=device)  # [B, N]
        length = torch.full((B,), N, dtype=torch.long, device=device)  # [B] tokens generated per row
        eos = torch.zeros(B, dtype=torch.bool, device=device)  # [B] row ended with a stop token
        u = uniforms.to(device)  # [B, N]
        alive = torch.arange(B, device=device)  # [b] original row of each batch row
        done = torch.zeros(B, dtype=torch.bool, device=device)  # [b] batch row already finished
        for t in range(N):  # no host sync per token but the all-done check (and, eager, the row drop)
            self.on_progress()
            tok, logp = sample_from_logits(logits, settings, u[alive, t])  # [b], [b]
            live = ~done  # [b]
            tokens[alive, t] = torch.where(live, tok, self.pad_id)
            logps[alive, t] = torch.where(live, logp, 0.0)
            ended = live & torch.isin(tok, stop)  # [b]
            length[alive] = torch.where(ended, t + 1, length[alive])
            eos[alive] |= ended
            done = done | ended
            if t == N - 1 or bool(done.all()):
                break
            n_done = 0 if graph else int(done.sum())
            if n_done and n_done * 4 >= done.numel():
                keep = (~done).nonzero().flatten()  # [b']
                alive, tok, next_pos, attn, done = (x[keep] for x in (alive, tok, next_pos, attn, done))
                select_cache_rows(cache, keep)
            logits = step(tok[:, None], next_pos[:, None], attn if static else attn[:, : P + t + 1])
            next_pos = next_pos + 1
        tok_rows, lp_rows, lengths, eos_rows = tokens.tolist(), logps.tolist(), length.tolist(), eos.tolist()
        return [
            Generation(
                tok_rows[i][: lengths[i]], lp_rows[i][: lengths[i]], "eos" if eos_rows[i] else "length"
            )
            for i in range(B)
        ]

    def _graph_step(self, cache: Any, cache_arg: str) -> Callable[..., torch.Tensor]:
        """The compiled decode step for `cache`'s shape (rows, length): its own cache, which holds `cache`'s
        keys and values copied in place (the compiled step reads one address), compiled on first use."""
        layers = cache.layers
        key = (int(layers[0].keys.shape[0]), int(layers[0].keys.shape[2]))
        if key not in self._graphs:
            own = copy.copy(cache)  # the same kind of cache (kv dtype), with layers of its own
            own.layers = [copy.copy(layer) for layer in layers]
            for layer in own.layers:
                layer.is_initialized = False
                layer.cumulative_length = torch.tensor(0, dtype=torch.long)
                layer.lazy_initialization(layer.keys, layer.values)  # fresh zeros at fixed addresses
            model = self.model

            def step(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                out = model(
                    input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: own}
                )
                return out.logits[:, -1, :].float()  # [B, V]

            self._graphs[key] = (own, torch.compile(step, mode="reduce-overhead", dynamic=False))
        own, compiled = self._graphs[key]
        for mine, theirs in zip(own.layers, layers, strict=True):
            for name in ("keys", "values", "cumulative_length"):
                getattr(mine, name).copy_(getattr(theirs, name))

        def step_once(*args: torch.Tensor) -> torch.Tensor:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are dead (no-op off CUDA)
            return compiled(*args)

        return step_once


class CastingStaticCache(StaticCache):
    """A `StaticCache` that stores keys and values in `kv_dtype`. Under bf16 autocast the attention's matmuls
    (and SDPA) read the cached keys and values as bf16 anyway, so storing them in bf16 changes no result
    (eager: the same tokens and log-probs, tested) while decode steps read half the bytes; without it the keys
    are fp32 (the rotary embedding multiplies bf16 projections by fp32 cos/sin). One layer's decode attention
    at the sampler's shape: 1.0 ms with bf16 keys, 1.7 ms with fp32 (docs/decode_attention.json)."""

    def __init__(self, *args: Any, kv_dtype: torch.dtype, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kv_dtype = kv_dtype

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().update(
            key_states.to(self.kv_dtype), value_states.to(self.kv_dtype), layer_idx, *args, **kwargs
        )


def _new_cache(model: PreTrainedModel, max_len: int, kv_dtype: torch.dtype | None = None) -> Any:
    """A preallocated KV cache of `max_len` positions, or None (the model grows its own) for models whose
    cache is not plain full attention. `kv_dtype`: store keys/values in it (only under autocast to it)."""
    if not supports_prefix_sharing(model):
        return None
    try:
        if kv_dtype is None:
            return StaticCache(config=model.config, max_cache_len=max_len)
        return CastingStaticCache(config=model.config, max_cache_len=max_len, kv_dtype=kv_dtype)
    except TypeError:  # transformers < 4.56 wants the batch size up front: let the model grow its own cache
        return None
