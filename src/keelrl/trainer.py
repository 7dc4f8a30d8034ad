"""The RL loop. One step reads top to bottom in the order the algorithm runs:

    sample -> score -> advantages -> update -> metrics -> eval -> checkpoint

`train()` sets up a `Run` (what does not change during a run: config, task, tokenizer, sampler, sinks)
and a `TrainState` (everything that does, and everything a restart needs), then calls one short function
per phase. The update sees only per-token (log-prob, old log-prob, advantage, mask); group logic stays
in the advantage phase.

Where this departs from the usual GRPO trainer, and why:
- Old-policy log-probs come from the sampler by default (`algo.old_logprobs = "sampler"`): the in-process
  sampler computes exactly what the trainer would, so the extra forward pass is skipped. A test checks the
  gap is below 1e-4; set "recompute" for a sampler whose numerics differ.
- Dropout stays off during RL (the model stays in eval mode): updates are then deterministic on CPU,
  which is what makes resume bit-exact.
"""

from __future__ import annotations

import copy
import math
import os
import queue
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch.distributed.checkpoint import CheckpointException
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl import checkpoint as ckpt
from keelrl.algo.advantages import compute_advantages
from keelrl.algo.logprobs import Autocast, LogprobModule, autocast_context
from keelrl.algo.losses import kl_penalty, ppo_clip_loss, token_weights, truncated_is_weights
from keelrl.config import (
    AlgoConfig,
    Config,
    FaultsConfig,
    GuardsConfig,
    check_batch_arithmetic,
    config_to_dict,
)
from keelrl.curriculum import (
    GroupOutcome,
    ProblemSource,
    fill_batch,
    has_signal,
    make_source,
    refill_budget_prompts,
    task_metrics,
)
from keelrl.distributed import (
    World,
    agree_on_norm,
    all_gather_list,
    all_reduce_stats,
    all_reduce_sum,
    broadcast_object,
    close_world,
    full_state_dict,
    grad_sync,
    init_world,
    is_sharded,
    loss_scale,
    save_sharded,
    wrap_for_training,
)
from keelrl.evaluate import run_eval, score_errors, summarize
from keelrl.faults import FaultInjector
from keelrl.guards import Finding, Guardian, check_update
from keelrl.models import compile_decoder, load_policy, model_summary, save_hf_dir
from keelrl.monitor.run_dir import RunDir
from keelrl.monitor.sinks import ConsoleSink, Sink, TensorBoardSink, WandbSink, tensorboard_available
from keelrl.monitor.traces import is_repetitive
from keelrl.ray_pool import SamplerPool, ScorerPool, import_ray, task_factory
from keelrl.rollout import HFSampler, Rollout, Sampler, SamplingSettings, render_prompt, resolve_template
from keelrl.state import TrainState
from keelrl.supervisor import ENV_SUPERVISED, Heartbeat, install_heartbeat, pulse
from keelrl.tasks import Task, Template, get_task
from keelrl.tasks.base import score_safely, stable_hash

ResumeMode = Literal["auto", "never"]

# Config keys that may differ between a checkpoint and the config it is resumed with: they do not change
# what the resumed steps compute (only how long the run is, what is logged, how often things are saved).
SAFE_TO_CHANGE = (
    "train.steps",
    "train.threads",
    "eval.every_steps",
    "eval.problems",
    "eval.batch_size",
    "eval.at_start",
    "checkpoint.",
    "log.",
)

TIMING_KEYS = ("time", "time/", "throughput/")


class GuardStop(RuntimeError):
    """A guard decided the run must stop; the worker exits with EXIT_GUARD_STOP and is not restarted."""


class ResumeError(RuntimeError):
    """The run directory cannot be resumed as asked; the message lists what is wrong."""


@dataclass
class Run:
    """What stays fixed during a run."""

    cfg: Config
    world: World
    run_dir: RunDir
    tokenizer: PreTrainedTokenizerBase
    task: Task
    template: Template
    sampler: Sampler
    source: ProblemSource
    settings: SamplingSettings
    eval_settings: SamplingSettings
    console: ConsoleSink | None = None
    sinks: list[Sink] = field(default_factory=list)
    prompt_cache: dict[int, tuple[list[int], str]] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(Path("."), enabled=False))
    supervised: bool = False
    faults: FaultInjector = field(default_factory=lambda: FaultInjector(FaultsConfig(), None))
    ckpt_policy: ckpt.CheckpointPolicy = field(
        default_factory=lambda: ckpt.CheckpointPolicy(0, 0.0, False, 86400.0)
    )
    saver: ckpt.AsyncCheckpointer | None = None
    save_results: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    save_stalls: list[tuple[int, float, float]] = field(default_factory=list)
    stop_requested: bool = False
    guardian: Guardian = field(default_factory=lambda: Guardian(GuardsConfig(), {}))
    history: list[dict[str, Any]] = field(default_factory=list)  # metric records so far (what the rules read)
    escalate: bool = False  # too many skipped updates: roll back after this step
    # what the update's forward runs through: LogprobModule(policy), wrapped by DDP or sharded by FSDP2
    train_module: torch.nn.Module | None = None
    # the whole-weights model the sampler and evals use: the policy itself, or a copy when it is sharded
    sampler_model: PreTrainedModel | None = None
    # train.share_prefix for the update's forwards; off when the policy is sharded (distributed.py says why)
    update_share_prefix: bool = True
    scorer: ScorerPool | None = None  # Ray actors scoring rewards (distributed.scorer = "ray")

    def report_status(self, **fields: Any) -> None:
        """Live status: the heartbeat always; status.json too unless a supervisor owns it."""
        self.heartbeat.beat(force=True, **fields)
        if not self.supervised:
            self.run_dir.write_status(pid=os.getpid(), **fields)

    def event(self, kind: str, step: int, **fields: Any) -> None:
        self.run_dir.event(kind, step, **fields)
        if self.console is not None and kind not in ("checkpoint",):
            self.console.message(f"[{kind}] step {step}: " + ", ".join(f"{k}={v}" for k, v in fields.items()))


# ------------------------------------------------------------------------------------------------ setup


def build_optimizer(
    cfg: Config, policy: PreTrainedModel
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    a = cfg.algo
    params = [p for p in policy.parameters() if p.requires_grad]
    # The fused kernel is one pass over each tensor instead of a dozen foreach ops: 10 against 38 ms per
    # step for 5.2M fp32 parameters on one CPU thread (benchmarks/cpu_overheads.py). Same update rule; it
    # exists for CPU and CUDA.
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(
        params, lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), weight_decay=a.weight_decay, fused=fused
    )
    total = max(cfg.train.steps, 1)

    def factor(step: int) -> float:
        if a.warmup_steps and step < a.warmup_steps:
            return (step + 1) / a.warmup_steps
        progress = min(1.0, (step - a.warmup_steps) / max(1, total - a.warmup_steps))
        if a.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if a.lr_schedule == "linear":
            return 1.0 - progress
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys.extend(changed_keys(a, b, f"{prefix}{k}."))
        elif a != b:
            keys.append(f"{prefix}{k}")
    return keys


def unsafe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [
        k
        for k in changed_keys(old, new)
        if not any(k == s or (s.endswith(".") and k.startswith(s)) for s in SAFE_TO_CHANGE)
    ]


def setup(cfg: Config, run_path: str | Path, resume: ResumeMode = "auto") -> tuple[Run, TrainState]:
    world = init_world(cfg.train.device, cfg.distributed.backend, cfg.distributed.timeout_s)
    check_batch_arithmetic(cfg, world.world_size)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    config_dict = config_to_dict(cfg)
    task = get_task(cfg.task.name, seed=cfg.task.seed, **cfg.task.params)
    for setting in ("scorer", "sampler"):  # a missing Ray fails before the model loads; pools start last
        if getattr(cfg.distributed, setting) == "ray":
            import_ray(f"distributed.{setting}")
    if cfg.train.compile and world.world_size > 1:
        raise ValueError(
            f"train.compile is for a single process; this run has {world.world_size} ranks. Turn it off "
            "(DDP / FSDP2 with a compiled decoder is not tested in keelrl yet)."
        )
    policy, tokenizer = load_policy(cfg.model)
    policy.to(world.device)
    policy.eval()  # dropout off: see module docstring
    if cfg.train.compile:
        compile_decoder(policy)
    template = resolve_template(cfg.task.template, tokenizer)
    run_dir = RunDir(run_path, writer=world.is_writer)  # created only once the inputs are known to be good
    sharded = world.world_size > 1 and cfg.distributed.strategy == "fsdp2"
    sampler_model = (
        copy.deepcopy(policy) if sharded else policy
    )  # sampling needs whole weights (made before sharding)
    train_module = wrap_for_training(policy, world, cfg.distributed.strategy)
    optimizer, scheduler = build_optimizer(cfg, policy)  # after sharding: over the shards
    ref = None
    if cfg.algo.kl_coef > 0:
        ref, _ = load_policy(cfg.model)
        ref.to(world.device).eval().requires_grad_(False)
        if cfg.train.compile:
            compile_decoder(ref)
    state = TrainState(step=0, policy=policy, optimizer=optimizer, scheduler=scheduler, ref_policy=ref)
    source = make_source(task, cfg.curriculum, cfg.train.seed)

    r = cfg.rollout
    run = Run(
        cfg=cfg,
        world=world,
        run_dir=run_dir,
        tokenizer=tokenizer,
        task=task,
        template=template,
        sampler=HFSampler(
            sampler_model,
            tokenizer,
            chunk_size=r.chunk_size,
            share_prefix=cfg.train.share_prefix,
            autocast=cfg.train.autocast,
        ),
        source=source,
        settings=SamplingSettings(r.max_new_tokens, r.temperature, r.top_p, r.top_k),
        eval_settings=SamplingSettings(
            cfg.eval.max_new_tokens or r.max_new_tokens, cfg.eval.temperature, 1.0, 0
        ),
    )
    run.train_module, run.sampler_model = train_module, sampler_model
    run.update_share_prefix = cfg.train.share_prefix and not sharded
    run.supervised = os.environ.get(ENV_SUPERVISED) == "1"
    run.heartbeat = Heartbeat(run_dir.path, enabled=world.is_writer)
    run.faults = FaultInjector(cfg.faults, run_dir if world.is_writer else None, cfg.train.seed)
    c = cfg.checkpoint
    run.ckpt_policy = ckpt.CheckpointPolicy(
        c.every_steps, c.every_minutes, c.auto, c.assumed_mtbf_hours * 3600
    )
    if c.async_save:
        run.saver = ckpt.AsyncCheckpointer(lambda path, err, snap: run.save_results.put((path, err, snap)))
    restore_or_start(run, state, resume, config_dict)
    source.load_state_dict(state.curriculum)
    sync_sampler(run, state)
    run.ckpt_policy.observe_failures(*observed_failures(run_dir))
    run.guardian = Guardian(cfg.guards, state.guards)
    run.history = run_dir.metrics()  # every rank: the guards decide the same on all of them
    if world.is_writer:
        run_dir.write_config(config_dict)
        _open_sinks(run, state, config_dict)
    start_pools(run, state)
    return run, state


def start_pools(run: Run, state: TrainState) -> None:
    """The Ray actor pools the config asks for (distributed.scorer / sampler = "ray"), on one Ray sized for
    both; the sampling pool replaces the in-process sampler and gets the current weights."""
    cfg, d = run.cfg, run.cfg.distributed
    cpus = d.ray_workers * (d.scorer == "ray") + d.ray_sampler_workers * (d.sampler == "ray")
    try:
        if d.scorer == "ray":
            run.scorer = ScorerPool(
                task_factory(run.task), d.ray_workers, d.ray_max_retries, d.ray_address, ray_cpus=cpus
            )
        if d.sampler == "ray":
            run.sampler = SamplerPool(
                cfg.model,
                d.ray_sampler_workers,
                chunk_size=cfg.rollout.chunk_size,
                share_prefix=cfg.train.share_prefix,
                autocast=cfg.train.autocast,
                compile=cfg.train.compile,
                max_retries=d.ray_max_retries,
                address=d.ray_address,
                ray_cpus=cpus,
            )
            sync_sampler(run, state)
    except BaseException:  # a pool that did start must not outlive the failed setup
        shutdown_pools(run)
        raise


def shutdown_pools(run: Run) -> None:
    if run.scorer is not None:
        run.scorer.shutdown()
    if isinstance(run.sampler, SamplerPool):
        run.sampler.shutdown()


def restore_or_start(run: Run, state: TrainState, resume: ResumeMode, config_dict: dict[str, Any]) -> None:
    run_dir = run.run_dir
    has_checkpoints = bool(ckpt.committed(run_dir.checkpoints))
    if resume == "never" and (has_checkpoints or run_dir.metrics_file.exists()):
        raise ResumeError(
            f"{run_dir.path} already holds a run (metrics or checkpoints). Use --resume auto to continue it, "
            "or a new --run-dir to start over."
        )
    if not has_checkpoints:
        run_dir.truncate_after(-1)
        return
    path, skipped = ckpt.find_resumable(run_dir.checkpoints)
    for bad, why in skipped:
        run.event("checkpoint_skipped", -1, checkpoint=bad.name, reason=why)
    if path is None:
        run.event("resume_from_scratch", 0, reason="no checkpoint verified")
        run_dir.truncate_after(-1)
        return
    saved = ckpt.read_state(path)
    unsafe = unsafe_changes(saved.get("config", {}), config_dict)
    if unsafe:
        raise ResumeError(
            f"refusing to resume {run_dir.path} with a changed config: {', '.join(unsafe)} differ from the checkpoint "
            f"{path.name}. These change what the run computes. Resume with the original values, or start a new --run-dir. "
            f"(Keys that may change on resume: {', '.join(SAFE_TO_CHANGE)})"
        )
    ckpt.load_into(path, state)
    dropped = run_dir.truncate_after(state.step)
    run.event("resume", state.step, checkpoint=path.name, dropped_metric_lines=dropped)


def observed_failures(run_dir: RunDir) -> tuple[int, float]:
    """(failures, wall seconds) of this run so far, from events.jsonl and metrics.jsonl: the inputs of the
    automatic checkpoint interval."""
    events = run_dir.events()
    failures = sum(1 for e in events if e.get("kind") == "restart")
    times = [float(e["time"]) for e in events if "time" in e]
    first = min(times) if times else time.time()
    return failures, max(0.0, time.time() - first)


def _open_sinks(run: Run, state: TrainState, config_dict: dict[str, Any]) -> None:
    cfg = run.cfg
    run.console = ConsoleSink(cfg.train.steps, state.step, cfg.log.console_every, cfg.log.progress)
    run.sinks = [run.console]
    if cfg.log.tensorboard and tensorboard_available():
        run.sinks.append(TensorBoardSink(run.run_dir.path / "tb", state.step))
    if cfg.log.wandb:
        run.sinks.append(WandbSink(run.run_dir.path, cfg.log.wandb_project, config_dict))


# ----------------------------------------------------------------------------------------------- phases


def sample_phase(run: Run, state: TrainState, n: int | None = None, attempt: int = 0) -> list[Rollout]:
    """Draw this step's prompts (all ranks see the same global list, each samples its shard) and generate
    group_size completions per prompt. `n` prompts (default: the step's), `attempt` > 0 for dynamic-sampling
    refills (fresh sampling seeds)."""
    cfg, world = run.cfg, run.world
    problems = run.source.next_problems(cfg.prompts_per_step if n is None else n)
    per_rank = len(problems) // world.world_size
    mine = list(enumerate(problems))[world.rank * per_rank : (world.rank + 1) * per_rank]
    G = cfg.rollout.group_size
    prompts, seeds, meta = [], [], []
    for group, (index, problem) in mine:
        ids, prefix = _prompt_ids(run, index, problem)
        for k in range(G):
            prompts.append(ids)
            refill = ("refill", attempt) if attempt else ()
            rollbacks = state.guards.get("rollbacks", 0)
            seeds.append(stable_hash("sample", cfg.train.seed, state.step, rollbacks, group * G + k, *refill))
            meta.append((group, index, problem, prefix))
    gens = run.sampler.generate(prompts, run.settings, seeds)
    rollouts = []
    for (group, index, problem, prefix), ids, gen in zip(meta, prompts, gens):
        rollouts.append(
            Rollout(
                problem_index=index,
                problem=problem,
                group=group,
                prompt_ids=ids,
                completion_ids=gen.completion_ids,
                sample_logprobs=gen.logprobs,
                trainable=[1] * len(gen.completion_ids),
                finish_reason=gen.finish_reason,
                policy_version=run.sampler.policy_version,
                sampling=run.settings,
                text=run.tokenizer.decode(gen.completion_ids, skip_special_tokens=True),
                info={"prefix": prefix},
            )
        )
    return rollouts


def _prompt_ids(run: Run, index: int, problem: dict[str, Any]) -> tuple[list[int], str]:
    if index not in run.prompt_cache:
        if len(run.prompt_cache) > 100_000:
            run.prompt_cache.clear()
        prompt = run.task.prompt(problem, run.template)
        run.prompt_cache[index] = (
            render_prompt(run.tokenizer, prompt, run.template),
            prompt.assistant_prefix,
        )
    return run.prompt_cache[index]


def score_phase(run: Run, state: TrainState, rollouts: list[Rollout]) -> dict[str, float]:
    """Score every rollout with the task's checker (in parallel when the task can; on the Ray actor pool,
    with the same results, when distributed.scorer = "ray"). A checker that raises (user code can) scores
    that sample 0 with reason `score_error`, and the step records how many failed, instead of killing the
    run."""
    texts = [r.info.pop("prefix", "") + r.text for r in rollouts]
    problems = [r.problem for r in rollouts]
    out: dict[str, float] = {}
    if run.scorer is not None and not run.faults.wraps_scoring:
        # on the Ray pool (fault drills wrap the checker in this process, so with them on we score locally)
        scored = run.scorer.score(problems, texts)
        scores, errors = scored.scores, scored.errors
        if scored.replaced:
            run.event(
                "scorer_worker_replaced", state.step, count=scored.replaced, total=run.scorer.replaced_total
            )
        out["scorer/replaced_workers"] = float(run.scorer.replaced_total)  # since this process started
    else:
        drill = run.faults.wrap_score(run.task.score, state.step) if run.faults.wraps_scoring else None
        scores, errors = score_safely(run.task, problems, texts, drill)
    for r, s in zip(rollouts, scores):
        r.reward, r.correct, r.info = s.reward, s.correct, dict(s.info)
    if errors:
        run.event(
            "score_errors",
            state.step,
            count=len(errors),
            first=errors[0],
            injected=any("injected fault" in e for e in errors),
        )
    return {"reward/errors": float(len(errors)), **out}


def sampler_pool_metrics(run: Run, state: TrainState) -> dict[str, float]:
    """With distributed.sampler = "ray": an event for sampling actors replaced since the last step (in this
    step's generation, refills or the eval before it), and their count since this process started."""
    if not isinstance(run.sampler, SamplerPool):
        return {}
    replaced = run.sampler.take_replaced()
    if replaced:
        run.event("sampler_worker_replaced", state.step, count=replaced, total=run.sampler.replaced_total)
    return {"sampler/replaced_workers": float(run.sampler.replaced_total)}


def curriculum_phase(
    run: Run, state: TrainState, rollouts: list[Rollout]
) -> tuple[list[Rollout], dict[str, float]]:
    """Dynamic sampling (when on): replace groups without reward variance by groups of newly drawn prompts,
    reusing sample_phase and score_phase, within curriculum.refill_budget. Then the problem source observes
    every group generated this step (all ranks). Returns the batch to train on and the step's
    curriculum/... and task/... metrics."""
    cfg, world = run.cfg, run.world
    G = cfg.rollout.group_size
    groups = [rollouts[i : i + G] for i in range(0, len(rollouts), G)]
    out: dict[str, float] = {}
    generated = groups
    if cfg.curriculum.dynamic_sampling:
        errors = 0.0

        def draw(n: int, attempt: int) -> list[list[Rollout]]:
            nonlocal errors
            new = sample_phase(run, state, n, attempt)
            errors += score_phase(run, state, new)["reward/errors"]
            return [new[i : i + G] for i in range(0, len(new), G)]

        refill = fill_batch(
            groups,
            len(groups),
            draw,
            lambda g: has_signal([r.reward for r in g]),
            refill_budget_prompts(cfg.curriculum.refill_budget, cfg.prompts_per_step, world.world_size),
            world.world_size,
            reduce_max=lambda x: int(max(all_gather_list([x], world))),
            reduce_sum=lambda x: int(all_reduce_sum(x, world)),
        )
        generated = refill.generated
        for j, group in enumerate(refill.batch):
            for r in group:
                r.group = world.rank * len(groups) + j
        rollouts = [r for group in refill.batch for r in group]
        out.update(refill.stats.metrics())
        out["curriculum/generated_samples"] = all_reduce_sum(len(generated) * G, world)
        out["reward/errors"] = errors
        if refill.stats.exhausted:
            streak = 1
            for record in reversed(run.history):
                if record.get("curriculum/budget_exhausted") != 1.0:
                    break
                streak += 1
            if streak & (streak - 1) == 0:  # the 1st, 2nd, 4th, 8th... exhausted step in a row
                run.event(
                    "dynamic_sampling_exhausted",
                    state.step + 1,
                    steps_in_a_row=streak,
                    dropped_groups=refill.stats.dropped,
                    regenerated_prompts=refill.stats.regenerated,
                    degenerate_groups_trained=refill.stats.filled_degenerate,
                    message="refill budget spent before every group had reward variance; trained on the batch as is",
                )
    local = [(g[0].problem, tuple(r.reward for r in g), tuple(r.correct for r in g)) for g in generated]
    outcomes = [GroupOutcome(p, rw, c) for p, rw, c in all_gather_list(local, world)]
    run.source.observe(outcomes)
    out.update(run.source.metrics())
    out.update(task_metrics(outcomes))
    return rollouts, out


def advantage_phase(run: Run, rollouts: list[Rollout]) -> dict[str, float]:
    """Advantages from the global batch's rewards (every rank gathers all rewards, so batch-level
    estimators see the same numbers everywhere, and keeps its own slice)."""
    a = run.cfg.algo
    local = [r.reward for r in rollouts]
    rewards = torch.tensor(all_gather_list(local, run.world), dtype=torch.float64)
    adv, metrics = compute_advantages(
        rewards, run.cfg.rollout.group_size, a.advantage, a.std_eps, a.group_baseline
    )
    offset = run.world.rank * len(rollouts)
    for r, value in zip(rollouts, adv[offset : offset + len(rollouts)].tolist()):
        r.advantage = value
    return metrics


@dataclass
class TrainBatch:
    """Right-padded sequences (prompt + completion). target_mask[i, t] = 1 where position t predicts a
    trainable completion token (built from prompt and completion lengths, never from pad ids); the
    per-token tensors are aligned with it."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    target_mask: torch.Tensor  # [B, T]
    sampler_logprobs: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B]
    old_logprobs: torch.Tensor | None = None  # [B, T] pi_old for the PPO ratio
    ref_logprobs: torch.Tensor | None = None  # [B, T] reference policy, when KL is on
    is_weights: torch.Tensor | None = None  # [B, T] truncated IS weights, when on

    def select(self, idx: torch.Tensor) -> TrainBatch:
        T = int(self.lengths[idx].max())

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx, :T]

        return TrainBatch(
            self.input_ids[idx, :T],
            self.attention_mask[idx, :T],
            self.target_mask[idx, :T],
            self.sampler_logprobs[idx, :T],
            self.advantages[idx],
            self.lengths[idx],
            cut(self.old_logprobs),
            cut(self.ref_logprobs),
            cut(self.is_weights),
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
        if C:
            target[i, P - 1 : P - 1 + C] = torch.tensor(r.trainable, dtype=torch.float32)
            slp[i, P - 1 : P - 1 + C] = torch.tensor(r.sample_logprobs, dtype=torch.float32)
    adv = torch.tensor([r.advantage for r in rollouts], dtype=torch.float32)
    return TrainBatch(
        input_ids.to(device),
        attn.to(device),
        target.to(device),
        slp.to(device),
        adv.to(device),
        torch.tensor(lengths, device=device),
    )


def micro_batches(
    batch: TrainBatch, idx: torch.Tensor, size: int, group_prompts: bool = False
) -> list[TrainBatch]:
    """Split the mini-batch `idx` into micro-batches of similar lengths (less padding). With `group_prompts`
    (prefix sharing), rows with the same prompt are kept next to each other (ordered by prompt length, prompt,
    then length), so a micro-batch holds few distinct prompts and runs each once. The loss does not depend on
    the split: weights use global counts."""
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


def as_logprob_module(model: torch.nn.Module) -> torch.nn.Module:
    """A policy as the module the update calls (models pass through `LogprobModule`; wrapped ones as they are)."""
    return LogprobModule(model) if isinstance(model, PreTrainedModel) else model


def sync_sampler(run: Run, state: TrainState) -> None:
    """Point the sampler at the current weights. A sharded policy is gathered (every rank takes part) into
    the sampler's whole copy."""
    if is_sharded(state.policy):
        assert run.sampler_model is not None
        run.sampler_model.load_state_dict(full_state_dict(state.policy))
        run.sampler.sync_weights(run.sampler_model, state.policy_version)
    else:
        run.sampler.sync_weights(state.policy, state.policy_version)


def whole_policy(run: Run, state: TrainState) -> PreTrainedModel:
    """The policy with whole weights: itself, or the sampler's copy (kept in sync) when it is sharded."""
    if is_sharded(state.policy):
        assert run.sampler_model is not None
        return run.sampler_model
    return state.policy


def on_writer(run: Run, decide: Callable[[], Any]) -> Any:
    """`decide()` evaluated on rank 0 and broadcast: for decisions that read files or clocks and must be the
    same on every rank (whether to save, what is committed)."""
    return broadcast_object(decide() if run.world.is_writer else None, run.world)


def forward_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    micro_batch_size: int,
    temperature: float,
    share_prefix: bool = True,
    autocast: Autocast = "off",
) -> torch.Tensor:
    """Log-probs [B, T] of every completion token of the batch under `model` (a policy, or the run's
    train_module), micro-batched, no gradient."""
    module = as_logprob_module(model)
    out = torch.zeros_like(batch.sampler_logprobs)
    B = batch.input_ids.shape[0]
    for start in range(0, B, micro_batch_size):
        idx = torch.arange(start, min(start + micro_batch_size, B), device=batch.input_ids.device)
        mb = batch.select(idx)
        with torch.no_grad(), autocast_context(mb.input_ids.device, autocast):
            lp, _ = module(
                mb.input_ids, mb.attention_mask, mb.target_mask, temperature, share_prefix=share_prefix
            )
        out[idx, : lp.shape[1]] = lp
    return out


def prepare_batch(
    run: Run, state: TrainState, rollouts: list[Rollout]
) -> tuple[TrainBatch, dict[str, float]]:
    """Collate, and attach old-policy, reference and IS-weight log-probs. Measures the sampler/trainer
    log-prob gap whenever the trainer recomputes (mismatch/*)."""
    cfg, a, world = run.cfg, run.cfg.algo, run.world
    batch = collate(rollouts, run.tokenizer.pad_token_id or 0, world.device)
    temp, mbs = run.settings.temperature, cfg.train.micro_batch_size
    # tokens the update runs the model over (prompt + completion, no padding), global
    metrics: dict[str, float] = {"tokens/trained": all_reduce_sum(float(batch.lengths.sum()), world)}
    share, autocast = run.update_share_prefix, cfg.train.autocast
    if state.ref_policy is not None:
        batch.ref_logprobs = forward_logprobs(state.ref_policy, batch, mbs, temp, share, autocast)
    if a.old_logprobs == "recompute" or a.tis_cap > 0:
        assert run.train_module is not None  # set by setup for every world size
        batch.old_logprobs = forward_logprobs(run.train_module, batch, mbs, temp, share, autocast)
        metrics.update(mismatch_metrics(batch.old_logprobs, batch.sampler_logprobs, batch.target_mask, world))
    else:
        batch.old_logprobs = batch.sampler_logprobs
    if a.tis_cap > 0:
        batch.is_weights = truncated_is_weights(batch.old_logprobs, batch.sampler_logprobs, a.tis_cap)
    return batch, metrics


def mismatch_metrics(
    trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor, world: World
) -> dict[str, float]:
    """Sampler vs trainer on the same tokens: mismatch/kl is the token mean of k3(sampler || trainer) (an
    estimate of KL between the two), mismatch/max_abs the largest |log-prob gap|."""
    log_r = (trainer_lp - sampler_lp).clamp(-20, 20) * mask
    k3 = (torch.exp(log_r) - 1 - log_r) * mask
    n = all_reduce_sum(float(mask.sum()), world)
    return {
        "mismatch/kl": all_reduce_sum(float(k3.sum()), world) / max(n, 1.0),
        "mismatch/max_abs": float((log_r.abs() * mask).max()) if mask.any() else 0.0,
    }


def update_phase(
    run: Run, state: TrainState, batch: TrainBatch, advantage_abs_mean: float
) -> dict[str, float]:
    """PPO-style update: `ppo_epochs` passes, each split into `minibatches` optimizer steps, each
    accumulated over micro-batches with global-count loss weights. Each optimizer step is first judged
    by the per-step guards and skipped (gradient dropped) when one fires."""
    cfg, a, world = run.cfg, run.cfg.algo, run.world
    policy = state.policy
    assert run.train_module is not None  # set by setup for every world size
    B = batch.input_ids.shape[0]
    sums: dict[str, float] = {}
    ratio_max = 0.0
    skipped = nonfinite = 0
    lr = state.optimizer.param_groups[0]["lr"]
    mb_size = B // a.minibatches
    for epoch in range(a.ppo_epochs):
        perm = torch.arange(B, device=world.device)
        if a.minibatches > 1:
            g = torch.Generator().manual_seed(
                stable_hash("minibatch", cfg.train.seed, state.step, epoch) % 2**63
            )
            perm = torch.randperm(B, generator=g).to(world.device)
        for m in range(a.minibatches):
            state.optimizer.zero_grad(set_to_none=True)
            stats = minibatch_backward(
                run.train_module,
                batch,
                perm[m * mb_size : (m + 1) * mb_size],
                a,
                cfg.train.micro_batch_size,
                run.settings.temperature,
                cfg.rollout.max_new_tokens,
                world,
                share_prefix=run.update_share_prefix,
                autocast=cfg.train.autocast,
            )
            ratio_max = max(ratio_max, stats.pop("ratio/max"))
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
            run.faults.corrupt_gradients(state.step + 1, policy)
            grad_norm = agree_on_norm(grad_norm_and_clip(policy, a.grad_clip), world)
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm
            finding = None
            if run.cfg.guards.enabled:
                finding = check_update(
                    run.history,
                    state.step + 1,
                    stats.get("loss/total", 0.0),
                    grad_norm,
                    ratio_max,
                    advantage_abs_mean,
                    run.cfg.guards,
                )
            if finding is not None and finding.action == "skip":
                state.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                nonfinite += finding.name == "nonfinite"
                run.escalate = run.guardian.record_skip(state.step + 1) or run.escalate
                run.event(
                    "skip",
                    state.step + 1,
                    rule=finding.name,
                    evidence=finding.evidence,
                    message=finding.message,
                    epoch=epoch,
                    minibatch=m,
                )
                continue
            state.optimizer.step()
    with warnings.catch_warnings():
        # The schedule follows the RL step, skipped updates included, so that a guard's skip (or a resume)
        # never shifts the learning rate; PyTorch warns when the run's first optimizer step was skipped.
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
        state.scheduler.step()
    state.policy_version += 1
    sync_sampler(run, state)
    passes = a.ppo_epochs * a.minibatches
    out = {k: v / passes for k, v in sums.items()}
    out["ratio/max"] = ratio_max
    out["lr"] = lr
    out["guard/skipped_updates"] = float(skipped)
    out["guard/nonfinite_updates"] = float(nonfinite)
    return out


def minibatch_backward(
    policy: torch.nn.Module,
    batch: TrainBatch,
    idx: torch.Tensor,
    algo: AlgoConfig,
    micro_batch_size: int,
    temperature: float,
    max_new_tokens: int,
    world: World,
    share_prefix: bool = True,
    autocast: Autocast = "off",
) -> dict[str, float]:
    """Accumulate into .grad the gradient of the mini-batch `idx`'s loss, one micro-batch at a time.
    Every micro-batch is weighted with the mini-batch's global token and sequence counts, so the summed
    gradient (and loss) is the same for any micro_batch_size and any number of ranks. Returns the
    mini-batch's loss terms and statistics (token-weighted like the loss). `policy` is a model or the
    run's train_module (DDP / FSDP2: gradients are summed over ranks on the last micro-batch)."""
    a = algo
    module = as_logprob_module(policy)
    scale = loss_scale(world)
    g_tokens = all_reduce_sum(float(batch.target_mask[idx].sum()), world)
    g_seqs = all_reduce_sum(float(len(idx)), world)
    sums: dict[str, float] = {"ratio/max": 0.0}

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value

    mbs = list(micro_batches(batch, idx, micro_batch_size, group_prompts=share_prefix))
    for i, mb in enumerate(mbs):
        pulse()
        with grad_sync(module, i == len(mbs) - 1):  # ranks sum their gradients once, on the last one
            with autocast_context(mb.input_ids.device, autocast):
                lp, ent = module(
                    mb.input_ids,
                    mb.attention_mask,
                    mb.target_mask,
                    temperature,
                    with_entropy=True,
                    entropy_grad=a.entropy_coef > 0,
                    share_prefix=share_prefix,
                )  # [b, T]
            assert ent is not None
            w = token_weights(mb.target_mask, a.loss_agg, g_tokens, g_seqs, max_new_tokens)  # [b, T]
            loss, stats = microbatch_loss(lp, ent, w, mb, a)
            (loss * scale).backward()
        for key, value in stats.items():
            if key == "ratio/max":
                sums[key] = max(sums[key], value)
            else:
                add(key, value)
    return all_reduce_stats(sums, world)


def microbatch_loss(
    lp: torch.Tensor, ent: torch.Tensor, w: torch.Tensor, mb: TrainBatch, a: AlgoConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The micro-batch's share of the mini-batch loss (token weights `w` [b, T] carry the global
    normaliser) and its statistics, weighted the same way."""
    assert mb.old_logprobs is not None
    stats: dict[str, float] = {}
    adv = mb.advantages[:, None].expand_as(lp)  # [b, T]
    pg, pstats = ppo_clip_loss(lp, mb.old_logprobs, adv, a.clip_low, a.clip_high, a.dual_clip)
    if mb.is_weights is not None:
        pg = pg * mb.is_weights
    policy_loss = (pg * w).sum()
    loss = policy_loss
    if mb.ref_logprobs is not None:
        kl_term = (kl_penalty(lp, mb.ref_logprobs, a.kl_estimator) * w).sum()
        loss = loss + a.kl_coef * kl_term
        stats["kl/ref"] = float(kl_term.detach())
    ent_term = (ent * w).sum()
    if a.entropy_coef > 0:
        loss = loss - a.entropy_coef * ent_term
    with torch.no_grad():
        stats["loss/policy"] = float(policy_loss)
        stats["loss/total"] = float(loss)
        stats["entropy"] = float(ent_term)
        stats["clipfrac/low"] = float((pstats["clipped_low"] * w).sum())
        stats["clipfrac/high"] = float((pstats["clipped_high"] * w).sum())
        log_r = (mb.old_logprobs - lp).clamp(-20, 20)
        stats["kl/old"] = float(((torch.exp(log_r) - 1 - log_r) * w).sum())
        stats["ratio/max"] = (
            float(pstats["ratio"][mb.target_mask.bool()].max()) if mb.target_mask.any() else 0.0
        )
    return loss, stats


def grad_norm_and_clip(model: torch.nn.Module, clip: float) -> float:
    """Global L2 norm of the gradients (before clipping); clips in place when clip > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(
        params, clip if clip > 0 else float("inf"), error_if_nonfinite=False
    )
    if hasattr(norm, "full_tensor"):  # sharded parameters (FSDP2): the norm is a DTensor
        norm = norm.full_tensor()
    return float(norm)


# ---------------------------------------------------------------------------------------------- metrics


def rollout_metrics(run: Run, rollouts: list[Rollout]) -> dict[str, float]:
    """Reward, accuracy, format and length statistics over the global batch."""
    local = [
        (
            r.reward,
            float(r.correct),
            float(bool(r.info.get("formatted", r.reward > 0))),
            len(r.completion_ids),
            float(r.finish_reason == "length"),
            float(is_repetitive(r.completion_ids)),
        )
        for r in rollouts
    ]
    rows = torch.tensor(all_gather_list(local, run.world), dtype=torch.float64)  # [B, 6]
    reward, correct, formatted, length, truncated, repetitive = rows.unbind(dim=1)
    return {
        "reward/mean": float(reward.mean()),
        "reward/std": float(reward.std(correction=0)),
        "accuracy": float(correct.mean()),
        "format_rate": float(formatted.mean()),
        "response_length/mean": float(length.mean()),
        "response_length/max": float(length.max()),
        "response_length/truncated_frac": float(truncated.mean()),
        "repetition/frac": float(repetitive.mean()),
        "tokens/generated": float(length.sum()),
    }


def eval_phase(run: Run, state: TrainState) -> dict[str, float]:
    """Held-out eval of the current policy (greedy by default), shared with `keelrl eval`. Rank 0 evaluates;
    every rank gets the numbers."""
    metrics: dict[str, float] = {}
    if run.world.is_writer:
        metrics = _eval_metrics(run, state)
    metrics = broadcast_object(metrics, run.world)  # all ranks: best checkpoint and guards decide alike
    state.last_eval = {**metrics, "step": state.step}
    return metrics


def _eval_metrics(run: Run, state: TrainState) -> dict[str, float]:
    cfg = run.cfg
    results = run_eval(
        sampler=run.sampler,
        tokenizer=run.tokenizer,
        task=run.task,
        template=run.template,
        num_problems=cfg.eval.problems,
        settings=run.eval_settings,
        samples=cfg.eval.samples,
        seed=cfg.train.seed,
        batch_size=cfg.eval.batch_size,
    )
    summary = summarize(results)
    errors = score_errors(results)
    if errors:
        run.event("score_errors", state.step, count=len(errors), first=errors[0], phase="eval")
    return {f"eval/{k}": v for k, v in summary.items() if k != "problems"}


def is_eval_step(cfg: Config, step: int) -> bool:
    return step == cfg.train.steps or (cfg.eval.every_steps > 0 and step % cfg.eval.every_steps == 0)


# ------------------------------------------------------------------------------------------- checkpoint


def save_checkpoint(
    run: Run, state: TrainState, metrics: dict[str, float], reason: str, wait: bool = False
) -> None:
    """Snapshot `state` to CPU memory and commit it (rank 0 writes), in the background when
    checkpoint.async_save. A sharded policy's ranks first write their shards (synchronously) into the
    directory that becomes the checkpoint. Bookkeeping (events, pruning, status) happens in `collect_saves`."""
    t0 = time.perf_counter()
    optimizer_state, staged = None, None
    if is_sharded(state.policy):
        staged = on_writer(run, lambda: ckpt.stage_dir(run.run_dir.checkpoints, state.step))
        try:
            with_state = save_sharded(state.policy, state.optimizer, str(staged / ckpt.SHARDED))
        except (CheckpointException, OSError) as err:  # every rank sees the failure (DCP gathers them)
            if run.world.is_writer:
                shutil.rmtree(staged, ignore_errors=True)
                run.event("checkpoint_failed", state.step, reason=f"writing the shards failed: {err}")
            return
        optimizer_state = {"format": "sharded", "with_state": with_state}
    if not run.world.is_writer:
        return
    cfg = run.cfg
    run.faults.before_save(state.step)
    run.heartbeat.beat(force=True, phase="checkpoint")
    ckpt_metrics = {k: v for k, v in metrics.items() if k.startswith("eval/")}
    extra = {"metrics": ckpt_metrics, "reason": reason, "snapshot_time": time.time()}
    snap = ckpt.snapshot(
        state, run.tokenizer, config_to_dict(cfg), extra, whole_policy(run, state), optimizer_state
    )
    stall = time.perf_counter() - t0
    if run.saver is not None:
        stall += run.saver.submit(snap, run.run_dir.checkpoints, run.guardian.healthy, staged)
        if wait:
            run.saver.wait()
    else:
        try:
            path = ckpt.write_snapshot(snap, run.run_dir.checkpoints, run.guardian.healthy, staged)
            run.save_results.put((path, None, snap))
        except ckpt.CheckpointError as err:
            run.save_results.put((None, err, snap))
        stall = time.perf_counter() - t0
    run.save_stalls.append((state.step, stall, time.perf_counter() - t0))
    collect_saves(run)


def collect_saves(run: Run) -> None:
    """Handle finished checkpoint writes in the main thread: events, pruning, status, drills."""
    cfg = run.cfg
    while not run.save_results.empty():
        path, err, snap = run.save_results.get()
        if err is not None or path is None:
            run.event("checkpoint_failed", snap.step, reason=str(err))
            continue
        # keep a healthy checkpoint from before the guards' lookback, so a rollback can land before trouble
        anchor = ckpt.rollback_anchor(run.run_dir.checkpoints, snap.step - cfg.guards.skip_window)
        deleted = ckpt.prune(
            run.run_dir.checkpoints,
            cfg.checkpoint.keep_last,
            cfg.checkpoint.keep_best,
            cfg.checkpoint.best_metric,
            protect=(anchor,) if anchor and cfg.guards.enabled else (),
        )
        written_s = time.time() - snap.state.get("snapshot_time", time.time())
        run.ckpt_policy.record_save(written_s)
        run.event(
            "checkpoint",
            snap.step,
            path=path.name,
            reason=snap.state.get("reason"),
            seconds=round(written_s, 3),
            deleted=[p.name for p in deleted],
        )
        run.report_status(last_checkpoint=path.name)
        run.faults.after_save(path, snap.step)


def update_best(run: Run, state: TrainState, metrics: dict[str, float]) -> bool:
    """Track the best value of checkpoint.best_metric; True when this step set a new best."""
    value = metrics.get(run.cfg.checkpoint.best_metric)
    if value is None or (state.best_metric is not None and value <= state.best_metric):
        return False
    state.best_metric, state.best_step = float(value), state.step
    return True


# ------------------------------------------------------------------------------------------------- loop


def log_step(run: Run, state: TrainState, metrics: dict[str, float]) -> None:
    # rank 0's record everywhere (times differ between ranks), so every rank's guards see the same history
    record = broadcast_object({"step": state.step, "time": time.time(), **metrics}, run.world)
    run.history.append(record)
    run.run_dir.append_metrics(record)
    for sink in run.sinks:
        sink.log(state.step, record)
    run.report_status(state="running", step=state.step)


def train_step(run: Run, state: TrainState) -> dict[str, float]:
    """One RL step: sample -> score -> advantages -> update. Returns the step's metrics."""
    t0 = time.perf_counter()
    run.heartbeat.beat(phase="sample")
    rollouts = sample_phase(run, state)
    t1 = time.perf_counter()
    run.heartbeat.beat(phase="score")
    metrics = score_phase(run, state, rollouts)
    t2 = time.perf_counter()
    rollouts, chosen = curriculum_phase(run, state, rollouts)
    metrics["reward/errors"] += chosen.pop("reward/errors", 0.0)
    metrics.update(chosen)
    metrics.update(sampler_pool_metrics(run, state))
    tc = time.perf_counter()
    run.heartbeat.beat(phase="update")
    metrics.update(rollout_metrics(run, rollouts))
    metrics.update(advantage_phase(run, rollouts))
    batch, prep = prepare_batch(run, state, rollouts)
    metrics.update(prep)
    metrics.update(update_phase(run, state, batch, metrics["advantage/abs_mean"]))
    t3 = time.perf_counter()
    state.step += 1
    state.curriculum = run.source.state_dict()
    metrics["guard/skipped_steps"] = float(state.guards.get("skipped_steps", 0))
    metrics.update(
        {
            "time/gen_s": t1 - t0,
            "time/score_s": t2 - t1,
            "time/refill_s": tc - t2,
            "time/train_s": t3 - tc,
            "time/step_s": t3 - t0,
            "throughput/tokens_per_s": metrics["tokens/generated"] / max(t3 - t0, 1e-9),
        }
    )
    n = run.cfg.log.rollouts_per_step
    if n and run.world.is_writer:
        stride = max(1, len(rollouts) // n)
        run.run_dir.append_rollouts([r.to_json(state.step) for r in rollouts[::stride][:n]])
    return metrics


# ---------------------------------------------------------------------------------------------- guards


def guard_phase(run: Run, state: TrainState) -> str:
    """Run the divergence rules on the history so far and act: returns "ok", "rollback" (done) or "stop".
    Every rank runs it on the same history (log_step broadcasts rank 0's records), so all decide alike."""
    action, changed, findings = run.guardian.after_step(run.history)
    for f in changed:
        run.event(
            "guard",
            state.step,
            rule=f.name,
            severity=f.severity,
            action=f.action,
            first_step=f.steps[0],
            evidence=f.evidence,
            message=f.message,
            suggestion=f.suggestion,
        )
    trigger = next((f for f in findings if f.action == action), None)
    if run.escalate:
        run.escalate = False
        recent = run.guardian.state["recent_skips"]
        trigger = Finding(
            "too_many_skips",
            "critical",
            (recent[0], state.step),
            {"skips": float(len(recent))},
            f"{len(recent)} updates skipped within {run.cfg.guards.skip_window} steps",
            "see the skip events for which guard fired",
            "rollback",
        )
        action = "rollback"
    if action == "rollback" and trigger is not None:
        return "rollback" if rollback(run, state, trigger) else "stop"
    if action == "stop" and trigger is not None:
        run.event(
            "guard_stop",
            state.step,
            rule=trigger.name,
            evidence=trigger.evidence,
            message=trigger.message,
            suggestion=trigger.suggestion,
        )
        return "stop"
    return "ok"


def rollback(run: Run, state: TrainState, trigger: Finding) -> bool:
    """Return to the newest verified checkpoint marked healthy and taken before the trouble began, skip the
    problems drawn since (they are not replayed), optionally scale the learning rate. Checkpoints after the
    target are set aside (renamed `rolled_back-...`), so a crash now cannot resume into the trouble.
    Returns False when no rollback is possible (none left, or no healthy checkpoint): the run then stops."""
    cfg = run.cfg.guards
    if not run.guardian.can_roll_back():
        run.event(
            "guard_stop",
            state.step,
            rule=trigger.name,
            reason=f"guards.max_rollbacks={cfg.max_rollbacks} used up",
            evidence=trigger.evidence,
            message=trigger.message,
        )
        return False
    if run.saver is not None:
        run.saver.wait()
    collect_saves(run)
    target = None
    if run.world.is_writer:
        for path in ckpt.committed(run.run_dir.checkpoints):
            manifest_ok = ckpt.verify(path) is None and ckpt.read_manifest(path).get("healthy", True)
            if manifest_ok and int(ckpt.read_manifest(path)["step"]) < trigger.steps[0]:
                target = path
                break
    target = broadcast_object(target, run.world)  # every rank loads the checkpoint rank 0 chose
    if target is None:
        run.event(
            "guard_stop",
            state.step,
            rule=trigger.name,
            reason="no healthy checkpoint from before the trouble",
            evidence=trigger.evidence,
            message=trigger.message,
        )
        return False
    guards = dict(run.guardian.state)
    cursor = run.source.state_dict()
    from_step = state.step
    ckpt.load_into(target, state)
    guards["rollbacks"] += 1
    guards["lr_scale"] *= cfg.rollback_lr_scale
    guards["recent_skips"], guards["active"] = [], {}
    state.guards = guards
    run.guardian = Guardian(cfg, state.guards)
    run.source.load_state_dict(cursor)
    state.curriculum = cursor
    if cfg.rollback_lr_scale != 1.0:
        sched = state.scheduler
        sched.base_lrs = [lr * cfg.rollback_lr_scale for lr in sched.base_lrs]
        for group, lr in zip(state.optimizer.param_groups, sched.get_last_lr()):
            group["lr"] = lr * cfg.rollback_lr_scale
    if run.world.is_writer:
        for path in ckpt.committed(run.run_dir.checkpoints):
            if int(path.name.removeprefix("step_")) > state.step:
                path.rename(path.with_name(f"rolled_back-{path.name}-r{guards['rollbacks']}"))
    run.run_dir.truncate_after(state.step)
    run.history = [r for r in run.history if int(r.get("step", -1)) <= state.step]
    sync_sampler(run, state)
    run.event(
        "rollback",
        from_step,
        to_step=state.step,
        checkpoint=target.name,
        rule=trigger.name,
        evidence=trigger.evidence,
        message=trigger.message,
        lr_scale=guards["lr_scale"],
        rollbacks=guards["rollbacks"],
        skipped_problems_from=cursor,
    )
    save_checkpoint(run, state, {}, "rollback", wait=True)
    return True


def stop_run(run: Run, state: TrainState) -> dict[str, Any]:
    """A guard asked to stop: keep a checkpoint of where we are (marked unhealthy) and say why."""
    save_checkpoint(run, state, {}, "stopped", wait=True)
    collect_saves(run)
    run.report_status(state="stopped", step=state.step)
    raise GuardStop(
        f"stopped by guards at step {state.step}; see events.jsonl (kind guard_stop) and `keelrl doctor`"
    )


def train(cfg: Config, run_path: str | Path, resume: ResumeMode = "auto") -> dict[str, Any]:
    """Run (or resume) RL training into `run_path`; returns the summary written to summary.json (or
    {"state": "preempted"} when a SIGTERM asked the run to checkpoint and stop)."""
    run, state = setup(cfg, run_path, resume)
    world = run.world
    if run.console is not None:
        run.console.message(
            f"keelrl: {cfg.model.path} ({model_summary(state.policy)['parameters'] / 1e6:.2f}M params) on "
            f"{cfg.task.name} [{run.template}], {cfg.train.steps} steps, run dir {run.run_dir.path}; {world.describe()}"
        )
    previous_handler = _install_sigterm(run)
    install_heartbeat(run.heartbeat)
    run.report_status(state="running", step=state.step, started=run.started)
    try:
        if state.step == 0 and cfg.eval.at_start and not state.last_eval:  # not again when resuming at step 0
            run.heartbeat.beat(phase="eval")
            initial = eval_phase(run, state)
            update_best(run, state, initial)
            log_step(run, state, initial)
        if (
            state.step == 0
            and cfg.guards.enabled
            and not on_writer(run, lambda: ckpt.committed(run.run_dir.checkpoints))
        ):
            # a rollback target in case trouble starts at once
            save_checkpoint(run, state, state.last_eval, "initial")
        while state.step < cfg.train.steps:
            metrics = train_step(run, state)
            if is_eval_step(cfg, state.step):
                run.heartbeat.beat(phase="eval")
                metrics.update(eval_phase(run, state))
            new_best = update_best(run, state, metrics)
            log_step(run, state, metrics)
            verdict = guard_phase(run, state)
            if verdict == "stop":
                return stop_run(run, state)
            if verdict == "rollback":
                continue
            keep_best = new_best and cfg.checkpoint.keep_best > 0 and state.step < cfg.train.steps
            if (
                on_writer(run, lambda: run.ckpt_policy.due(state.step) or run.faults.save_forced(state.step))
                or keep_best
            ):
                save_checkpoint(run, state, metrics, "best" if keep_best else "interval")
            collect_saves(run)
            run.faults.after_step(state.step)
            if all_reduce_sum(float(run.stop_requested), world) > 0:  # any rank asked: all stop together
                return preempt(run, state, metrics)
        summary = finish(run, state)
    except GuardStop:
        raise
    except BaseException:
        run.report_status(state="failed", step=state.step)
        raise
    finally:
        if run.saver is not None:
            run.saver.wait()
        install_heartbeat(None)
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        for sink in run.sinks:
            sink.close()
        shutdown_pools(run)
        run.train_module = None  # DDP holds the process group: release it before leaving the group
        close_world()
    return summary


def _install_sigterm(run: Run) -> Any:
    """SIGTERM (preemption, or the supervisor passing one on) asks for a checkpoint at the end of the step."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, _frame: Any) -> None:
        run.stop_requested = True

    return signal.signal(signal.SIGTERM, handler)


def preempt(run: Run, state: TrainState, metrics: dict[str, float]) -> dict[str, Any]:
    save_checkpoint(run, state, metrics, "preempted", wait=True)
    collect_saves(run)
    run.event("preempted", state.step, action="checkpoint saved, exiting cleanly")
    run.report_status(state="preempted", step=state.step)
    return {"state": "preempted", "steps": state.step}


def finish(run: Run, state: TrainState) -> dict[str, Any]:
    """Final checkpoint, HF export of the final policy, summary.json."""
    cfg = run.cfg
    final_eval = state.last_eval if state.last_eval.get("step") == state.step else {}
    latest = on_writer(run, lambda: [p.name for p in ckpt.committed(run.run_dir.checkpoints)][:1])
    if latest != [ckpt.step_dir_name(state.step)]:
        save_checkpoint(run, state, final_eval, "final", wait=True)
    if run.saver is not None:
        run.saver.wait()
    collect_saves(run)
    summary: dict[str, Any] = {}
    if run.world.is_writer:
        policy = whole_policy(run, state)
        save_hf_dir(policy, run.tokenizer, run.run_dir.final_dir)
        initial = next((m for m in run.run_dir.metrics() if m.get("step") == 0 and "eval/accuracy" in m), {})
        summary = {
            "state": "finished",
            "steps": state.step,
            "final_eval": {k.removeprefix("eval/"): v for k, v in final_eval.items() if k != "step"},
            "initial_eval": {k.removeprefix("eval/"): v for k, v in initial.items() if k.startswith("eval/")},
            "best": {
                "metric": cfg.checkpoint.best_metric,
                "value": state.best_metric,
                "step": state.best_step,
            },
            "weights_sha256": ckpt.weights_sha256(policy),
            "final_dir": str(run.run_dir.final_dir),
            "wall_seconds": time.time() - run.started,
            "model": model_summary(policy),
            "checkpoint_stalls": [
                {"step": st, "stall_s": round(a, 4), "total_s": round(b, 4)} for st, a, b in run.save_stalls
            ],
        }
        run.run_dir.write_summary(summary)
        run.report_status(state="finished", step=state.step)
    return summary
