"""The RL loop. One step reads top to bottom in the order the algorithm runs:

    collect (sample -> score -> refill) -> advantages -> update -> metrics -> guards -> eval -> checkpoint

`setup` builds a `Run` and a `TrainState` (run.py); each phase is one call into the module named after it:
collect.py, update.py, recovery.py. docs/ARCHITECTURE.md draws the data flow of one step. With
`train.stage = "sft"` the same loop runs a supervised step instead, with "rm" a reward model's step (`STEPS`,
sft/step.py, rm/step.py).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keelrl import checkpoint as ckpt
from keelrl.collect import (
    close_step,
    curriculum_phase,
    next_batch,
    pool_metrics,
    rollout_metrics,
    score_phase,
)
from keelrl.config import Config
from keelrl.distributed import all_reduce_sum, broadcast_object, close_world
from keelrl.evaluate import run_eval, score_errors, summarize
from keelrl.guards.step import check_batch
from keelrl.models import model_summary
from keelrl.recovery import (
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
from keelrl.rm.step import held_out_pairs, rm_step
from keelrl.run import GuardStop, ResumeError, Run, RunStop
from keelrl.selfplay.step import selfplay_step
from keelrl.setup import ResumeMode, setup, shutdown_engines
from keelrl.sft.step import held_out_loss, sft_step
from keelrl.state import TrainState
from keelrl.supervisor import install_heartbeat
from keelrl.update import end_of_step, rl_update, skip_update

__all__ = ["GuardStop", "ResumeError", "setup", "train", "train_step"]


def train(cfg: Config, run_path: str | Path, resume: ResumeMode = "auto") -> dict[str, Any]:
    """Run (or resume) training into `run_path` (RL, or SFT with train.stage = "sft": the same loop with
    another step, `STEPS`); returns summary.json's content ({"state": "preempted"} after a SIGTERM)."""
    run, state = setup(cfg, run_path, resume)
    world = run.world
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
            metrics = STEPS[cfg.train.stage](run, state)
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


def train_step(run: Run, state: TrainState) -> dict[str, float]:
    """One RL step: sample (or take the pipeline's batch) -> score -> refill -> advantages -> update. Returns the
    step's metrics."""
    t0 = time.perf_counter()
    run.heartbeat.beat(phase="sample")
    rollouts, async_metrics = next_batch(run, state)
    t1 = time.perf_counter()
    run.heartbeat.beat(phase="score")
    errors = score_phase(run, state, rollouts)
    t2 = time.perf_counter()
    rollouts, metrics, refill_errors = curriculum_phase(run, state, rollouts)
    metrics["reward/errors"] = float(errors + refill_errors)
    metrics.update(pool_metrics(run, state))
    tc = time.perf_counter()
    run.heartbeat.beat(phase="update")
    metrics.update(rollout_metrics(run, rollouts))
    unscored = check_batch(run.live.history, state.step + 1, metrics, run.cfg.guards)
    if unscored is None:
        metrics.update(rl_update(run, state, rollouts))
    else:  # most episodes have no reward: no update from them (guard_phase then acts, by default a stop)
        skip_update(run, state, unscored)
        metrics.update({"guard/skipped_updates": 1.0, **end_of_step(run, state)})
    metrics.update(async_metrics)
    t3 = time.perf_counter()
    return close_step(run, state, rollouts, metrics, (t0, t1, t2, tc, t3))


# What one step of the loop does, by train.stage
STEPS: dict[str, Callable[[Run, TrainState], dict[str, float]]] = {
    "rl": train_step,
    "sft": sft_step,
    "rm": rm_step,
    "selfplay": selfplay_step,
}


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
    metrics: dict[str, float] = {}
    if run.world.is_writer:
        metrics = _eval_metrics(run, state)
    metrics = broadcast_object(metrics, run.world)  # all ranks: best checkpoint and guards decide alike
    state.last_eval = {**metrics, "step": state.step}
    return metrics


def _eval_metrics(run: Run, state: TrainState) -> dict[str, float]:
    cfg = run.cfg
    if cfg.train.stage == "rm":  # a reward model: held-out pair accuracy (as eval/accuracy), loss, margin
        return {f"eval/{k}": v for k, v in held_out_pairs(run, state).items()}
    if cfg.train.stage == "sft":  # the held-out loss, and the task's accuracy unless data.task_eval is off
        held_out = {f"eval/{k}": v for k, v in held_out_loss(run, state).items()}
        return held_out if not cfg.data.task_eval else {**held_out, **_task_eval(run, state)}
    return _task_eval(run, state)


def _task_eval(run: Run, state: TrainState) -> dict[str, float]:
    cfg = run.cfg
    results = run_eval(
        sampler=run.sampler,
        tokenizer=run.tokenizer,
        task=run.task,
        template=run.prompter.template,
        num_problems=cfg.eval.problems,
        settings=run.eval_settings,
        samples=cfg.eval.samples,
        seed=cfg.train.seed,
        batch_size=cfg.eval.batch_size,
        limits=run.prompter.limits,
    )
    summary = summarize(results)
    errors = score_errors(results)
    if errors:
        run.event("score_errors", state.step, count=len(errors), first=errors[0], phase="eval")
    return {f"eval/{k}": v for k, v in summary.items() if k != "problems"}


def is_eval_step(cfg: Config, step: int) -> bool:
    return step == cfg.train.steps or (cfg.eval.every_steps > 0 and step % cfg.eval.every_steps == 0)
