"""Setup: config -> (Run, TrainState), and resume. Everything is checked before the run directory is created
(a wrong config, task or model leaves no half-made run behind). A run directory with checkpoints resumes
from the newest one that verifies, unless the config changed in a way that changes what the run computes.
"""

from __future__ import annotations

import copy
import functools
import os
import time
from pathlib import Path
from typing import Any, Literal

import torch

from keelrl.config import Config, ConfigError, config_to_dict
from keelrl.curriculum.sources import make_source
from keelrl.guards.engine import Guardian
from keelrl.models.load import compile_decoder, load_policy
from keelrl.models.lora import apply_lora
from keelrl.monitor.run_dir import RunDir
from keelrl.monitor.run_lock import RunLock, RunLockedError, hold
from keelrl.monitor.sinks import Terminal
from keelrl.monitor.trackers import open_trackers
from keelrl.rollout import SAMPLERS, SamplingSettings, make_async_sampler, make_sampler, resolve_template
from keelrl.rollout.episodes import Prompter
from keelrl.rollout.pipeline import Pipeline, ProgressCount
from keelrl.rollout.ray import ScorerPool, import_ray, ray_cpus
from keelrl.run import checkpoint as ckpt
from keelrl.run.distributed import World, broadcast_object, init_world, wrap_for_training
from keelrl.run.faults import FaultInjector
from keelrl.run.run import Live, ResumeError, Run
from keelrl.run.state import TrainState
from keelrl.run.supervisor import ENV_SUPERVISED, Heartbeat, pulse
from keelrl.stages import check_stage
from keelrl.stages.rm.learned import LearnedReward
from keelrl.step.collect import restore_pipeline
from keelrl.step.critic import build_critic
from keelrl.step.optimizer import build_optimizer
from keelrl.step.weight_sync import sync_sampler
from keelrl.tasks import get_task
from keelrl.tasks.env import is_environment

ResumeMode = Literal["auto", "never"]

# Config keys that may differ between a checkpoint and the config it is resumed with: they do not change
# what the resumed steps compute (only how long the run is, what is logged, how often things are saved).
SAFE_TO_CHANGE = (
    "train.steps", "train.threads", "eval.every_steps", "eval.problems", "eval.batch_size", "eval.at_start",
    "checkpoint.", "log.",
)  # fmt: skip


def changed_keys(
    old: dict[str, Any], new: dict[str, Any], default: dict[str, Any] | None = None, prefix: str = ""
) -> list[str]:
    """Dotted keys whose values differ. A key the old config lacks is compared with `default` (the current
    defaults): a field added since the checkpoint was written is no change while it keeps its default."""
    keys, default = [], default or {}
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, default.get(k)), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = default.get(k) if isinstance(default.get(k), dict) else None
            keys.extend(changed_keys(a, b, sub, f"{prefix}{k}."))
        elif a != b:
            keys.append(f"{prefix}{k}")
    return keys


def unsafe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The changed keys (see `changed_keys`) that change what a resumed run computes."""
    return [
        k
        for k in changed_keys(old, new, config_to_dict(Config()))
        if not any(k == s or (s.endswith(".") and k.startswith(s)) for s in SAFE_TO_CHANGE)
    ]


def setup(cfg: Config, run_path: str | Path, resume: ResumeMode = "auto") -> tuple[Run, TrainState]:
    world = init_world(cfg.train.device, cfg.distributed.backend, cfg.distributed.timeout_s)
    # the world size is known now: a batch that does not split over the ranks is the user's to fix
    stage = check_stage(cfg, world.world_size)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    config_dict = config_to_dict(cfg)
    # the task, and its recipe for processes that rebuild it (Ray scoring actors)
    make_task = functools.partial(get_task, cfg.task.name, cfg.task.seed, cfg.sandbox, **cfg.task.params)
    task = make_task()
    if is_environment(task) and cfg.distributed.scorer == "ray":
        raise ConfigError(
            f"task {cfg.task.name} is a multi-turn environment: its episodes are scored as each ends, on the "
            "trainer's environment threads (episode.workers); set distributed.scorer = 'local'"
        )
    for setting in ("scorer", "sampler"):  # a missing Ray fails before the model loads; pools start last
        if getattr(cfg.distributed, setting) == "ray":
            import_ray(f"distributed.{setting}")
    if cfg.train.compile and world.world_size > 1:
        raise ConfigError(
            f"train.compile is for a single process; this run has {world.world_size} ranks. Turn it off "
            "(DDP / FSDP2 with a compiled decoder is not tested in keelrl yet)."
        )
    if cfg.model.lora.rank and world.world_size > 1 and cfg.distributed.strategy == "fsdp2":
        raise ConfigError(
            "model.lora with distributed.strategy = 'fsdp2' is not built; use 'ddp' (the optimizer state of "
            "adapters is small, so sharding it saves little)"
        )
    policy, tokenizer = load_policy(cfg.model, head=stage.head)
    # LoRA: adapters in, base frozen, before wrapping and the optimizer (keelrl/models/lora.py)
    lora_base = apply_lora(policy, cfg.model.lora, cfg.model.path) if cfg.model.lora.rank else None
    policy.to(world.device)
    policy.eval()  # dropout off: updates are deterministic on CPU, which makes resume bit-exact
    if cfg.train.compile:
        compile_decoder(policy)
    template = resolve_template(cfg.task.template, tokenizer)
    reward_model = LearnedReward(cfg.reward, cfg.model, world.device) if cfg.reward.model else None
    run_dir = RunDir(run_path, writer=world.is_writer)  # created only once the inputs are known to be good
    lock = lock_run_dir(run_dir, world)  # before anything in it is written
    engines: list[Any] = []  # Ray pools started so far: they must not outlive a failed setup
    try:
        sharded = world.grouped and cfg.distributed.strategy == "fsdp2"
        # sampling needs whole weights: a copy made before sharding
        sampler_model = copy.deepcopy(policy) if sharded else policy
        train_module = wrap_for_training(policy, world, cfg.distributed.strategy)
        optimizer, scheduler = build_optimizer(cfg, policy)  # after sharding: over the shards
        ref = None
        if cfg.algo.kl_coef > 0:
            ref, _ = load_policy(cfg.model)
            ref.to(world.device).eval().requires_grad_(False)
            if cfg.train.compile:
                compile_decoder(ref)
        critic, critic_opt = None, None
        if cfg.algo.advantage == "gae":
            if world.world_size > 1:
                raise ConfigError(
                    f"algo.advantage = 'gae' (PPO with a learned critic) runs in one process for now; this run has "
                    f"{world.world_size} ranks. Use a group estimator (grpo, rloo, ...) under torchrun."
                )
            critic, critic_opt = build_critic(cfg.model, cfg.algo, policy, world.device)
        state = TrainState(
            step=0,
            policy=policy,
            optimizer=optimizer,
            scheduler=scheduler,
            ref_policy=ref,
            critic=critic,
            critic_optimizer=critic_opt,
            lora_base=lora_base,
            proposer=stage.build_roles(cfg, world) if stage.build_roles else None,
        )
        source = (  # the stage's own problems (self-play's proposals), else the curriculum's
            stage.problem_source(cfg, task)
            if stage.problem_source
            else make_source(task, cfg.curriculum, cfg.train.seed)
        )
        restore_or_start(run_dir, state, resume, config_dict)
        source.load_state_dict(state.curriculum)
        live = Live(Guardian(cfg.guards, state.guards), run_dir.metrics())  # every rank: guards decide alike
        r, c, d = cfg.rollout, cfg.checkpoint, cfg.distributed
        if d.scorer == "ray":
            engines.append(
                ScorerPool(
                    make_task,
                    d.ray_workers,
                    d.ray_max_retries,
                    d.ray_address,
                    ray_cpus=ray_cpus(cfg),
                    on_progress=pulse,
                )
            )
        pipeline = None
        settings = SamplingSettings(r.max_new_tokens, r.temperature, r.top_p, r.top_k)
        if r.max_staleness:  # sampling runs in another process; evals keep sampling the current policy here
            progress = ProgressCount()
            pipeline = Pipeline(
                make_async_sampler(cfg, sampler_model, tokenizer, progress),
                # its own prompter: its tokenizer is used on the pipeline's thread
                Prompter(task, copy.deepcopy(tokenizer), template, cfg.episode),
                settings,
                r.max_staleness,
                progress,
            )
            engines.append(pipeline)
            engines.append(SAMPLERS["hf"](cfg, sampler_model, tokenizer, pulse))
        else:
            engines.append(make_sampler(cfg, sampler_model, tokenizer, on_progress=pulse))
        run = Run(
            cfg=cfg,
            world=world,
            run_dir=run_dir,
            tokenizer=tokenizer,
            task=task,
            prompter=Prompter(task, tokenizer, template, cfg.episode),
            source=source,
            sampler=engines[-1],
            scorer=engines[0] if d.scorer == "ray" else None,
            settings=settings,
            eval_settings=SamplingSettings(
                cfg.eval.max_new_tokens or r.max_new_tokens, cfg.eval.temperature, 1.0, 0
            ),
            live=live,
            train_module=train_module,
            sampler_model=sampler_model,
            update_share_prefix=cfg.train.share_prefix and not sharded,
            heartbeat=Heartbeat(run_dir.path, enabled=world.is_writer),
            supervised=os.environ.get(ENV_SUPERVISED) == "1",
            lock=lock,
            faults=FaultInjector(cfg.faults, run_dir if world.is_writer else None, cfg.train.seed),
            ckpt_policy=ckpt.CheckpointPolicy(
                c.every_steps,
                c.every_minutes,
                c.auto,
                c.assumed_mtbf_hours * 3600,
                c.max_failed_saves,
                c.max_unsaved_minutes,
                state.step,
            ),
            saver=ckpt.AsyncCheckpointer(lambda *result: live.save_results.put(result))
            if c.async_save
            else None,
            pipeline=pipeline,
            stage_data=stage.load_data(cfg, tokenizer, task, template) if stage.load_data else None,
            reward_model=reward_model,
        )
        sync_sampler(run, state, state.step)
        if stage.start_roles is not None:  # another role's sampler (self-play's proposer)
            stage.start_roles(run, state)
        if pipeline is not None:
            restore_pipeline(run, state)
        run.ckpt_policy.observe_failures(*observed_failures(run_dir))
        if world.is_writer:
            run_dir.write_config(config_dict)
            open_sinks(run, state, config_dict)
    except BaseException:
        shutdown_engines(engines)
        if lock is not None:
            lock.release()
        raise
    return run, state


def lock_run_dir(run_dir: RunDir, world: World) -> RunLock | None:
    """The writer rank takes the run directory unless its supervisor holds it for this worker; a refusal
    reaches every rank, so a torchrun group stops together instead of waiting on rank 0."""
    lock, refusal = None, None
    if world.is_writer and os.environ.get(ENV_SUPERVISED) != "1":
        try:
            lock = hold(run_dir)
        except RunLockedError as err:
            refusal = str(err)
    refusal = broadcast_object(refusal, world)
    if refusal is not None:
        raise RunLockedError(refusal)
    return lock


def shutdown_engines(engines: list[Any]) -> None:
    """Stop the Ray pools among `engines` (the in-process sampler has nothing to stop)."""
    for engine in engines:
        if hasattr(engine, "shutdown"):
            engine.shutdown()


def restore_or_start(
    run_dir: RunDir, state: TrainState, resume: ResumeMode, config_dict: dict[str, Any]
) -> None:
    """Load the newest checkpoint that verifies and loads into `state` (skipping broken ones, with an event
    each) and drop the metric lines after it; or start from scratch."""
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
    while path is not None:
        unsafe = unsafe_changes(ckpt.read_state(path).get("config", {}), config_dict)
        if unsafe:
            raise ResumeError(
                f"refusing to resume {run_dir.path} with a changed config: {', '.join(unsafe)} differ from the checkpoint "
                f"{path.name}. These change what the run computes. Resume with the original values, or start a new --run-dir. "
                f"(Keys that may change on resume: {', '.join(SAFE_TO_CHANGE)})"
            )
        try:
            ckpt.load_into(path, state)
            break
        except ckpt.CheckpointUnreadable as err:
            skipped.append((path, str(err)))
            path, older = ckpt.find_resumable(run_dir.checkpoints, older_than=path.name)
            skipped += older
    for bad, why in skipped:
        run_dir.event("checkpoint_skipped", -1, checkpoint=bad.name, reason=why)
    if path is None:
        run_dir.event("resume_from_scratch", 0, reason="no checkpoint verified")
        run_dir.truncate_after(-1)
        return
    dropped, torn = run_dir.truncate_after(state.step)
    run_dir.event(
        "resume", state.step, checkpoint=path.name, dropped_metric_lines=dropped, torn_metric_lines=torn
    )


def observed_failures(run_dir: RunDir) -> tuple[int, float]:
    """(failures, wall seconds) of this run so far: the inputs of the automatic checkpoint interval."""
    events = run_dir.events()
    failures = sum(1 for e in events if e.get("kind") == "restart")
    first = min((float(e["time"]) for e in events if "time" in e), default=time.time())
    return failures, max(0.0, time.time() - first)


def open_sinks(run: Run, state: TrainState, config_dict: dict[str, Any]) -> None:
    cfg = run.cfg
    run.console = Terminal(
        cfg.train.steps, state.step, cfg.train.stage, cfg.log.progress, cfg.log.console_every
    )
    run.sinks = [run.console, *open_trackers(run.run_dir.path, cfg.log, state.step, config_dict)]
