"""One RL step, read top to bottom in the order the algorithm runs: sample (or take the pipeline's batch) ->
score -> refill -> advantages -> update (keelrl.step: step/collect.py, step/update.py); and the task's held-out eval, which
every stage that samples reports."""

from __future__ import annotations

import time

from keelrl.evals import run_eval, score_errors, summarize
from keelrl.guards.step import check_batch
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.step.collect import (
    close_step,
    curriculum_phase,
    next_batch,
    pool_metrics,
    rollout_metrics,
    score_phase,
)
from keelrl.step.update import end_of_step, rl_update, skip_update


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


def task_eval(run: Run, state: TrainState) -> dict[str, float]:
    """The task's held-out eval of the current policy, as `keelrl eval` (rank 0): `eval/accuracy`, `eval/reward/mean`, ..."""
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
    if errors := score_errors(results):
        run.event("score_errors", state.step, count=len(errors), first=errors[0], phase="eval")
    return {f"eval/{k}": v for k, v in summary.items() if k != "problems"}
