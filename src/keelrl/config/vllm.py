"""`[vllm]`: the vLLM rollout engine's settings (`rollout.engine = "vllm"`). Pydantic only: `keelrl.config`
imports this without importing vLLM or torch; the checks across sections are in `keelrl.config.checks`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from keelrl.config.base import Section

# The weight-sync check's tolerance on the mean |trainer - engine| log-prob gap of the probe, by engine dtype
# (docs/ARCHITECTURE.md, "Weight sync"). Measured on this CPU: fp32 engine vs fp32 trainer agree to < 1e-4
# (5e-5 max on SmolLM2-135M); a bf16 engine's mean gap is ~0.03; stale weights or a stale prefix cache gave
# means >= 0.2 (../shared/REFERENCE.md).
SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


class VLLMConfig(Section):
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description=(
            "Engine weights and activations. float32 matches the trainer's log-probs to ~1e-5; bfloat16 is "
            "faster but needs algo.old_logprobs = 'recompute' (its log-probs differ by ~0.03 nats)."
        ),
    )
    threads: int = Field(
        1, ge=1, description="CPU only: OMP threads of the engine process (its own process)."
    )
    kv_cache_gb: int = Field(
        1,
        ge=1,
        description="CPU only: KV cache size in whole GB (VLLM_CPU_KVCACHE_SPACE takes integers only).",
    )
    max_model_len: int = Field(
        0, ge=0, description="Longest prompt + completion the engine accepts; 0 = the model's own limit."
    )
    block_size: int = Field(
        32,
        ge=0,
        description="KV cache block (tokens; a multiple of 32 on CPU; 0 = vLLM's default). Prefix caching works "
        "in whole blocks.",
    )
    enforce_eager: bool = Field(
        True, description="No CUDA graphs / torch.compile in the engine (faster start)."
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="GPU only: share of the GPU's memory the engine may take."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPU only: GPUs one engine is sharded over.")
    sleep_between_steps: bool = Field(
        False,
        description="GPU only, engine beside the trainer: offload the engine's weights while the trainer updates.",
    )
    start_timeout_s: float = Field(600.0, gt=0.0, description="Seconds the engine may take to start.")
    max_restarts: int = Field(
        2, ge=0, description="Times a dead engine process is restarted within one call before the step fails."
    )
    sync_check_prompts: int = Field(
        4,
        ge=0,
        description="Prompts of the weight-sync check after every weight push (held-out problems; 0 = no check).",
    )
    sync_check_tokens: int = Field(8, ge=1, description="Tokens sampled per prompt of the weight-sync check.")
    sync_tolerance: float | None = Field(
        None,
        gt=0.0,
        description=(
            "Largest mean |trainer - engine| log-prob gap on the check's tokens; above it the sync is redone once, "
            "then the step fails. Default by dtype: 1e-3 for float32, 0.1 for bfloat16/float16."
        ),
    )

    @property
    def tolerance(self) -> float:
        return self.sync_tolerance if self.sync_tolerance is not None else SYNC_TOLERANCE[self.dtype]
