"""Who plays the proposer (`selfplay.policies`).

- "one": the policy plays both roles; the role is in the prompt. Both roles' rollouts go through one update, so
  what the proposer role is trained on (problem lines, worked solutions) moves the solver's weights too.
- "two": the proposer is a policy of its own (`TrainState.proposer`, a `RolePolicy`), from the same starting
  weights, with its own optimizer, schedule and sampler. The step samples proposals from it and updates it on the
  proposals alone; the policy (the solver) is updated on the solutions alone. Evals, checkpoints' weights and
  final/ are the solver's; the proposer's weights and optimizer are saved in trainer_state.pt.

The proposer's update is the RL update itself (`update.rl_update`), run on the proposer's view of the run and
state (`proposer_view`): the same objective, estimator, guards and KL reference (both roles start from
model.path, so the frozen reference is the same model). Its metrics carry the prefix `proposer/`
(`Run.metric_prefix`), and the per-step guards judge its updates against its own earlier ones (a proposer's
gradient norm is not a spike because the solver's are smaller).
"""

from __future__ import annotations

import dataclasses

from keelrl.config import Config
from keelrl.models.load import load_policy
from keelrl.rollout import SAMPLERS
from keelrl.run.distributed import World
from keelrl.run.run import Run
from keelrl.run.state import RolePolicy, TrainState
from keelrl.run.supervisor import pulse
from keelrl.step.optimizer import build_optimizer
from keelrl.step.update import as_logprob_module
from keelrl.step.weight_sync import sync_sampler


def build_proposer(cfg: Config, world: World) -> RolePolicy | None:
    """selfplay.policies = "two": the proposer, a second policy from model.path with its own optimizer; None with
    one policy in both roles."""
    if cfg.selfplay.policies != "two":
        return None
    model, _ = load_policy(cfg.model)
    model.to(world.device).eval()  # eval: dropout off, as the policy's
    optimizer, scheduler = build_optimizer(cfg, model, lr=cfg.selfplay.proposer_lr or cfg.algo.lr)
    return RolePolicy(model, optimizer, scheduler)


def start_proposer(run: Run, state: TrainState) -> None:
    """Two policies: the proposer's own in-process sampler, over its own weights (and version), synced."""
    if state.proposer is None:
        return
    sampler = SAMPLERS["hf"](run.cfg, state.proposer.model, run.tokenizer, pulse)
    run.proposer = proposer_run(run, state, sampler)
    sync_proposer(run, state)


def sync_proposer(run: Run, state: TrainState) -> None:
    """The proposer's sampler follows its weights (after a rollback restored them); with one policy, nothing."""
    if state.proposer is not None:
        sync_sampler(*proposer_view(run, state), state.step)


def proposer_run(run: Run, state: TrainState, sampler: object) -> Run:
    """The run as the proposer's update and sampling see it: its own sampler, train module and metric prefix."""
    assert state.proposer is not None
    model = state.proposer.model
    return dataclasses.replace(
        run,
        sampler=sampler,
        train_module=as_logprob_module(model),
        sampler_model=model,
        metric_prefix="proposer/",
    )


def proposer_view(run: Run, state: TrainState) -> tuple[Run, TrainState]:
    """(run, state) for the proposer's role: the run's proposer view and a TrainState whose policy is the
    proposer's (the counters and guard state are the run's own objects). With one policy: (run, state)."""
    if state.proposer is None:
        return run, state
    assert run.proposer is not None  # setup builds both together
    p = state.proposer
    view = dataclasses.replace(
        state,
        policy=p.model,
        optimizer=p.optimizer,
        scheduler=p.scheduler,
        policy_version=p.version,
        critic=None,
        critic_optimizer=None,
        proposer=None,
    )
    return run.proposer, view
