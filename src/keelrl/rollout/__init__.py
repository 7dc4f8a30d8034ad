"""Sampling: the `Sampler` protocol (types.py) and its engines (hf.py: `HFSampler`, in process; vllm.py:
`VLLMSampler`, a vLLM engine process; ray.py: `SamplerPool` and the reward `ScorerPool`), prompts.py
(`render_prompt`), weights.py (a policy's weights as named tensors), sync_check.py (is the engine sampling
the trainer's weights?), and `make_sampler`, how everything outside this package gets a sampler.

`SAMPLERS` maps a sampler kind (`sampler_kind`: "ray" when `distributed.sampler = "ray"`, else
`rollout.engine`) to a factory `(cfg, model, tokenizer, on_progress) -> Sampler`. A factory imports its
engine when called, and this module does not import hf.py: a Ray scoring actor imports `keelrl.rollout.ray`
and must not pay for torch and transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from keelrl.rollout.prompts import render_prompt, resolve_template
from keelrl.rollout.types import FinishReason, Generation, Rollout, Sampler, SamplingSettings

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers import PreTrainedTokenizerBase as Tokenizer

    from keelrl.config import Config

__all__ = [
    "ASYNC_SAMPLERS", "SAMPLERS", "FinishReason", "Generation", "Rollout", "Sampler", "SamplingSettings",
    "make_async_sampler", "make_sampler", "render_prompt", "resolve_template", "sampler_kind",
]  # fmt: skip

Progress = Callable[[], None] | None


def _local(
    cfg: Config | None, model: PreTrainedModel, tokenizer: Tokenizer, on_progress: Progress
) -> Sampler:
    """In process, over `model` itself (no copy of the weights). `cfg` None: HFSampler's defaults."""
    from keelrl.rollout.hf import HFSampler

    if cfg is None:
        return HFSampler(model, tokenizer, on_progress=on_progress)
    t, r = cfg.train, cfg.rollout
    return HFSampler(model, tokenizer, r.chunk_size, t.share_prefix, t.autocast, on_progress, r.decode)


def _ray(cfg: Config, model: PreTrainedModel, tokenizer: Tokenizer, on_progress: Progress) -> Sampler:
    """Ray actors that build the policy from `cfg.model` (`model` and `tokenizer` stay here); with
    `rollout.engine = "vllm"` each drives a vLLM engine."""
    from keelrl.rollout.ray import SamplerPool, ray_cpus

    d, t = cfg.distributed, cfg.train
    return SamplerPool(
        cfg.model,
        d.ray_sampler_workers,
        chunk_size=cfg.rollout.chunk_size,
        share_prefix=t.share_prefix,
        autocast=t.autocast,
        compile=t.compile,
        max_retries=d.ray_max_retries,
        address=d.ray_address,
        ray_cpus=ray_cpus(cfg),
        vllm=cfg.vllm if cfg.rollout.engine == "vllm" else None,
        on_progress=on_progress,
    )


def _vllm(cfg: Config, model: PreTrainedModel, tokenizer: Tokenizer, on_progress: Progress) -> Sampler:
    """A vLLM engine process on `model`'s architecture (`[vllm]`); weights arrive by `update_weights`."""
    from keelrl.rollout.vllm import VLLMSampler

    return VLLMSampler(model, tokenizer, cfg.vllm, on_progress)


SAMPLERS: dict[str, Callable[..., Sampler]] = {"hf": _local, "vllm": _vllm, "ray": _ray}


def _process(cfg: Config, model: PreTrainedModel, tokenizer: Tokenizer, on_progress: Progress) -> Sampler:
    """A transformers sampler in a child process of its own (`rollout.sampler_threads` threads)."""
    from keelrl.rollout.process import ProcessSampler

    return ProcessSampler(cfg, cfg.rollout.sampler_threads, on_progress)


# rollout.max_staleness >= 1: the pipeline's sampler, out of the training process (keelrl/rollout/pipeline.py)
ASYNC_SAMPLERS: dict[str, Callable[..., Sampler]] = {"hf": _process, "ray": _ray}


def make_async_sampler(
    cfg: Config, model: PreTrainedModel, tokenizer: Tokenizer, on_progress: Progress = None
) -> Sampler:
    """The asynchronous pipeline's sampler for `cfg`'s kind (a child process, or Ray actors); no weights yet.
    `on_progress`: called as it makes progress (decode steps, finished chunks)."""
    kind = sampler_kind(cfg)
    if kind not in ASYNC_SAMPLERS:
        raise ValueError(
            f"rollout.max_staleness >= 1 has no sampler for {kind!r}; it has {sorted(ASYNC_SAMPLERS)}"
        )
    return ASYNC_SAMPLERS[kind](cfg, model, tokenizer, on_progress)


def sampler_kind(cfg: Config | None) -> str:
    """Which `SAMPLERS` entry `cfg` asks for (`cfg` None: the in-process sampler)."""
    if cfg is None:
        return "hf"
    return "ray" if cfg.distributed.sampler == "ray" else cfg.rollout.engine


def make_sampler(
    cfg: Config | None, model: PreTrainedModel, tokenizer: Tokenizer, on_progress: Progress = None
) -> Sampler:
    """The sampler `cfg` names (`sampler_kind`; `cfg` None: in-process, defaults). It has no weights until
    `update_weights`, except the in-process one, which samples `model`. `on_progress`: a heartbeat."""
    return SAMPLERS[sampler_kind(cfg)](cfg, model, tokenizer, on_progress)
