"""The RL loop. One step reads top to bottom in the order the algorithm runs:

    collect (sample -> score -> refill) -> advantages -> update -> metrics -> guards -> eval -> checkpoint

`setup` builds a `Run` and a `TrainState` (run/run.py); what a step does and how it is evaluated is the
stage's (`keelrl.stages.STAGES[train.stage]`: RL's step in stages/rl/step.py, each phase one call into the module
named after it, step/collect.py and step/update.py; a supervised step with "sft", a reward model's with "rm",
propose-then-solve with "selfplay"); guards, saves and the final export are loop/recovery.py's. The loop never
branches on the stage. docs/ARCHITECTURE.md draws the data flow of one step.

Where this departs from the usual GRPO trainer, and why:
- Old-policy log-probs come from the sampler by default (`algo.old_logprobs = "sampler"`): the in-process
  sampler computes exactly what the trainer would, so the extra forward pass is skipped. A test checks the
  gap is below 1e-4; set "recompute" for a sampler whose numerics differ.
- Dropout stays off during RL (the model stays in eval mode): updates are then deterministic on CPU, which
  is what makes resume bit-exact.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import torch

from keelrl.config import Config
from keelrl.loop.recovery import (
    collect_saves,
    finish,
    guard_phase,
    install_sigterm,
    preempt,
    save_checkpoint,
    stop_run,
    stop_unsaved,
    update_best,
)
from keelrl.loop.setup import ResumeMode, setup, shutdown_engines
from keelrl.models.load import model_summary
from keelrl.run import checkpoint as ckpt
from keelrl.run.distributed import all_reduce_sum, broadcast_object, close_world
from keelrl.run.run import GuardStop, ResumeError, Run, RunStop
from keelrl.run.state import TrainState
from keelrl.run.supervisor import install_heartbeat
from keelrl.stages import get_stage

__all__ = ["GuardStop", "ResumeError", "setup", "train"]


def train(cfg: Config, run_path: str | Path, resume: ResumeMode = "auto") -> dict[str, Any]:
    """Run (or resume) training into `run_path` (RL, or SFT with train.stage = "sft": the same loop with
    another step, the stage's); returns summary.json's content ({"state": "preempted"} after a SIGTERM)."""
    threads = torch.get_num_threads()
    try:
        return _train(cfg, run_path, resume)
    finally:
        torch.set_num_threads(threads)  # setup set train.threads for the run, not for the caller after it


def _train(cfg: Config, run_path: str | Path, resume: ResumeMode) -> dict[str, Any]:
    run, state = setup(cfg, run_path, resume)
    world, stage = run.world, get_stage(cfg.train.stage)
    if run.console is not None:
        on = f"{cfg.task.name} [{run.prompter.template}]"
        if run.stage_data is not None:
            on = f"{cfg.train.stage.upper()} data {cfg.data.path}: {run.stage_data.describe()}"
        run.console.say(
            f"keelrl: {cfg.model.path} ({model_summary(state.policy)['parameters'] / 1e6:.2f}M params) on "
            f"{on}, {cfg.train.steps} steps, run dir {run.run_dir.path}; {world.describe()}"
        )
    previous_handler = install_sigterm(run)
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
            and not run.on_writer(lambda: ckpt.committed(run.run_dir.checkpoints))
        ):
            # a rollback target in case trouble starts at once
            save_checkpoint(run, state, state.last_eval, "initial")
        while state.step < cfg.train.steps:
            metrics = stage.step(run, state)
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
                run.on_writer(lambda: run.ckpt_policy.due(state.step) or run.faults.save_forced(state.step))
                or keep_best
            ):
                save_checkpoint(run, state, metrics, "best" if keep_best else "interval")
            collect_saves(run)
            stop_unsaved(run, state, run.ckpt_policy.give_up)
            run.faults.after_step(state.step)
            if all_reduce_sum(float(run.live.stop_requested), world) > 0:  # any rank asked: all stop together
                return preempt(run, state, metrics)
        summary = finish(run, state)
    except RunStop:  # a stop on purpose has already said why (status "stopped")
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
        shutdown_engines([run.scorer, run.sampler, run.pipeline])
        run.train_module = None  # DDP holds the process group: release it before leaving the group
        close_world()
        if run.lock is not None:
            run.lock.release()
    return summary


def log_step(run: Run, state: TrainState, metrics: dict[str, float]) -> None:
    # rank 0's record everywhere (times differ between ranks), so every rank's guards see the same history
    record = broadcast_object({"step": state.step, "time": time.time(), **metrics}, run.world)
    run.live.history.append(record)
    run.run_dir.append_metrics(record)
    for sink in run.sinks:
        sink.log(state.step, record)
    run.report_status(state="running", step=state.step)


def eval_phase(run: Run, state: TrainState) -> dict[str, float]:
    """Held-out eval of the current policy, as `keelrl eval`; rank 0 evaluates, every rank gets the result."""
    metrics = get_stage(run.cfg.train.stage).eval(run, state) if run.world.is_writer else {}
    metrics = broadcast_object(metrics, run.world)  # all ranks: best checkpoint and guards decide alike
    state.last_eval = {**metrics, "step": state.step}
    return metrics


def is_eval_step(cfg: Config, step: int) -> bool:
    return step == cfg.train.steps or (cfg.eval.every_steps > 0 and step % cfg.eval.every_steps == 0)
