"""What a training run is made of, split by how long each part lives.
- `TrainState` (run/state.py): everything a restart needs; saved in every checkpoint.
- `Run`: fixed for the life of one worker process once `setup` built it: config, world, run directory,
  tokenizer, task, sampler, sinks. Nothing in the loop assigns to it (the objects it holds keep their own
  caches and cursors, e.g. the problem source, whose cursor `TrainState.curriculum` saves).
- `Live`: what changes while the process runs but a restart rebuilds from the run directory or from
  `TrainState` (the metric history, the guard engine, pending checkpoint results, a SIGTERM's stop request).
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl.config import Config
from keelrl.curriculum.sources import ProblemSource
from keelrl.guards.engine import Guardian
from keelrl.monitor.run_dir import RunDir
from keelrl.monitor.run_lock import RunLock
from keelrl.monitor.sinks import Sink, Terminal, describe_event
from keelrl.rollout import Sampler, SamplingSettings
from keelrl.rollout.episodes import Prompter
from keelrl.rollout.pipeline import Pipeline
from keelrl.run import checkpoint as ckpt
from keelrl.run.distributed import World, broadcast_object, is_sharded
from keelrl.run.faults import FaultInjector
from keelrl.run.state import TrainState
from keelrl.run.supervisor import EXIT_CANNOT_SAVE, EXIT_GUARD_STOP, Heartbeat
from keelrl.tasks import Task


class RunStop(RuntimeError):
    """The run stops on purpose: the worker prints the message, exits with `exit_code`, and the supervisor
    does not restart it (a restart would stop again)."""

    exit_code = EXIT_GUARD_STOP


class GuardStop(RunStop):
    """A guard decided the run must stop; the worker exits with EXIT_GUARD_STOP and is not restarted."""


class CheckpointStop(RunStop):
    """Checkpoints kept failing past checkpoint.max_failed_saves / max_unsaved_minutes (e.g. a full disk)."""

    exit_code = EXIT_CANNOT_SAVE


class ResumeError(RuntimeError):
    """The run directory cannot be resumed as asked; the message lists what is wrong."""


@dataclass
class Live:
    """What changes during the run and is rebuilt, not restored, after a restart."""

    guardian: Guardian
    history: list[dict[str, Any]]  # metric records so far (what the rules read), identical on every rank
    save_results: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # (path, error, snapshot)
    save_stalls: list[tuple[int, float, float]] = field(default_factory=list)  # (step, stall s, total s)
    stop_requested: bool = False  # SIGTERM: checkpoint at the end of this step and exit
    escalate: bool = False  # too many skipped updates: roll back after this step
    stop_reason: str = ""  # why a guard stops the run: the finding's sentences (recovery.guard_phase)


@dataclass
class Run:
    """What stays fixed during a run (built by `setup.setup`)."""

    cfg: Config
    world: World
    run_dir: RunDir
    tokenizer: PreTrainedTokenizerBase
    task: Task
    prompter: Prompter  # problem -> prompt token ids, cached
    source: ProblemSource  # which problems next; its cursor is saved in TrainState.curriculum
    sampler: Sampler
    settings: SamplingSettings
    eval_settings: SamplingSettings
    live: Live
    # what the update's forward runs through: LogprobModule(policy), wrapped by DDP or sharded by FSDP2
    train_module: torch.nn.Module | None
    # the whole-weights model the sampler and evals use: the policy itself, or a copy when it is sharded
    sampler_model: PreTrainedModel
    update_share_prefix: bool  # train.share_prefix for the update; off when the policy is sharded
    heartbeat: Heartbeat
    supervised: bool
    faults: FaultInjector
    ckpt_policy: ckpt.CheckpointPolicy
    saver: ckpt.AsyncCheckpointer | None
    lock: RunLock | None = None  # the run directory's lock, when this process holds it (no supervisor)
    scorer: Any = None  # Ray actors scoring rewards (distributed.scorer = "ray"), else None
    pipeline: Pipeline | None = None  # rollout.max_staleness >= 1: batches sampled ahead in another process
    reward_model: Any = None  # reward.model: the learned reward (stages/rm/learned.py LearnedReward)
    # SFT's encoded examples (stages/sft/step.py SFTData); RM's pairs (stages/rm/step.py PairData)
    stage_data: Any = None
    # selfplay.policies = "two": the run as the proposer sees it (stages/selfplay/roles.py)
    proposer: Run | None = None
    # the prefix of this run's update metrics in the step's record: "" for the policy, "proposer/" for self-play's
    # proposer view (the per-step guards judge an update against its own earlier ones)
    metric_prefix: str = ""
    console: Terminal | None = None
    sinks: list[Sink] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def report_status(self, **fields: Any) -> None:
        """Live status: the heartbeat always; status.json too unless a supervisor owns it."""
        self.heartbeat.beat(force=True, **fields)
        if not self.supervised:
            self.run_dir.write_status(pid=os.getpid(), **fields)

    def event(self, kind: str, step: int, **fields: Any) -> None:
        self.run_dir.event(kind, step, **fields)
        if self.console is not None and kind not in ("checkpoint", "guard_stop"):  # the last line says a stop
            self.console.say(describe_event(kind, step, fields))

    def on_writer(self, decide: Callable[[], Any]) -> Any:
        """`decide()` evaluated on rank 0 and broadcast: for decisions that read files or clocks and must be
        the same on every rank (whether to save, what is committed)."""
        return broadcast_object(decide() if self.world.is_writer else None, self.world)

    def whole_policy(self, state: TrainState) -> PreTrainedModel:
        """The policy with whole weights: itself, or the sampler's copy (kept in sync) when it is sharded."""
        return self.sampler_model if is_sharded(state.policy) else state.policy
