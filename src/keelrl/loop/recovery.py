"""Recovery: checkpoints, the guards' actions (rollback, stop), preemption and the final export.

A checkpoint is snapshotted to CPU memory and committed atomically by rank 0 (in a background thread
when checkpoint.async_save); its bookkeeping (events, pruning, status) happens in the main thread in
`collect_saves`. A save that fails (a full disk) is an event that says how far behind the newest good
checkpoint now is; training goes on until checkpoint.max_failed_saves / max_unsaved_minutes, then stops
with a message instead of crashing (a crash would restart, redo the same steps and fail the same way).
A rollback returns to the newest verified checkpoint marked healthy that was taken before the trouble
began, skips the problems drawn since, and sets aside the checkpoints after it.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.checkpoint import CheckpointException

from keelrl.config import config_to_dict
from keelrl.guards.base import Finding
from keelrl.guards.engine import Guardian
from keelrl.models.load import model_summary, save_hf_dir
from keelrl.models.lora import has_lora, lora_summary, merged_model, save_adapter_dir
from keelrl.run import checkpoint as ckpt
from keelrl.run.distributed import all_gather_list, is_sharded, save_sharded
from keelrl.run.run import CheckpointStop, GuardStop, Run
from keelrl.run.state import TrainState
from keelrl.run.supervisor import pulse
from keelrl.stages import get_stage
from keelrl.step.collect import restore_pipeline
from keelrl.step.weight_sync import sync_sampler


def save_checkpoint(
    run: Run, state: TrainState, metrics: dict[str, float], reason: str, wait: bool = False
) -> None:
    """Snapshot `state` and commit it (see the module docstring). A sharded policy's ranks first write their
    shards (synchronously) into the directory that becomes the checkpoint."""
    t0 = time.perf_counter()
    if run.pipeline is not None:  # every rank: its batches sampled ahead, gathered for rank 0 to write
        state.pipeline = all_gather_list([run.pipeline.drain(pulse)], run.world)
    optimizer_state, staged = None, None
    if is_sharded(state.policy):
        staged = run.on_writer(lambda: ckpt.stage_dir(run.run_dir.checkpoints, state.step))
        try:
            with_state = save_sharded(state.policy, state.optimizer, str(staged / ckpt.SHARDED))
        except (CheckpointException, OSError) as err:  # every rank sees the failure (DCP gathers them)
            if run.world.is_writer:
                shutil.rmtree(staged, ignore_errors=True)
                save_failed(run, state.step, f"writing the shards failed: {err}")
            return
        optimizer_state = {"format": "sharded", "with_state": with_state}
    if not run.world.is_writer:
        return
    on_file = run.faults.before_save(state.step)
    run.heartbeat.beat(force=True, phase="checkpoint")
    run.run_dir.sync_metrics()
    ckpt_metrics = {k: v for k, v in metrics.items() if k.startswith("eval/")}
    extra = {"metrics": ckpt_metrics, "reason": reason, "snapshot_time": time.time()}
    snap = ckpt.snapshot(
        state, run.tokenizer, config_to_dict(run.cfg), extra, run.whole_policy(state), optimizer_state
    )
    stall = time.perf_counter() - t0
    if run.saver is not None:
        stall += run.saver.submit(snap, run.run_dir.checkpoints, run.live.guardian.healthy, staged, on_file)
        if wait:
            run.saver.wait()
    else:
        try:
            path = ckpt.write_snapshot(
                snap, run.run_dir.checkpoints, run.live.guardian.healthy, staged, on_file
            )
            run.live.save_results.put((path, None, snap))
        except ckpt.CheckpointError as err:
            run.live.save_results.put((None, err, snap))
        stall = time.perf_counter() - t0
    run.live.save_stalls.append((state.step, stall, time.perf_counter() - t0))
    collect_saves(run)


def collect_saves(run: Run) -> None:
    """Handle finished checkpoint writes in the main thread: events, pruning, status, drills."""
    cfg = run.cfg
    while not run.live.save_results.empty():
        path, err, snap = run.live.save_results.get()
        if err is not None or path is None:
            save_failed(run, snap.step, str(err))
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
        snapshot_time = snap.state.get("snapshot_time", time.time())
        written_s = time.time() - snapshot_time
        run.ckpt_policy.record_save(written_s, snap.step, snapshot_time)
        run.event(
            "checkpoint",
            snap.step,
            path=path.name,
            reason=snap.state.get("reason"),
            seconds=round(written_s, 3),
            bytes=sum(int(f["bytes"]) for f in ckpt.read_manifest(path)["files"].values()),
            adapter_only=snap.adapter_config is not None,
            deleted=[p.name for p in deleted],
        )
        run.report_status(last_checkpoint=path.name)
        run.faults.after_save(path, snap.step)


def save_failed(run: Run, step: int, reason: str) -> None:
    """Count a failed save (rank 0) and say how far behind the newest good checkpoint now is."""
    policy = run.ckpt_policy
    policy.record_failure(reason)
    newest = ckpt.committed(run.run_dir.checkpoints)
    run.event(
        "checkpoint_failed",
        step,
        reason=reason,
        good_checkpoint=newest[0].name if newest else None,
        steps_since_good=step - policy.good_step,
        minutes_since_good=round(policy.minutes_since_good(), 2),
        failed_in_row=policy.failed_in_row,
    )


def stop_unsaved(run: Run, state: TrainState, why: Callable[[], str | None]) -> None:
    """Stop the run (CheckpointStop: its own exit code, not restarted) when `why()` (on rank 0: a reason, or
    None) says saving has failed for too long; the one-paragraph message says where the run can resume."""

    def message() -> str | None:
        reason = why()
        if reason is None:
            return None
        policy, newest = run.ckpt_policy, ckpt.committed(run.run_dir.checkpoints)
        good = (
            f"The newest good checkpoint is {newest[0].name} ({state.step - policy.good_step} steps and "
            f"{policy.minutes_since_good():.1f} minutes behind): run the same command once there is space and "
            "it resumes from there."
            if newest
            else "No checkpoint was saved, so the next run starts over."
        )
        return f"stopped at step {state.step}: {reason}. The last one: {policy.last_error} {good}"

    text = run.on_writer(message)
    if text is not None:
        run.report_status(state="stopped", step=state.step, reason=text)
        raise CheckpointStop(text)


def update_best(run: Run, state: TrainState, metrics: dict[str, float]) -> bool:
    """Track the best value of checkpoint.best_metric; True when this step set a new best."""
    value = metrics.get(run.cfg.checkpoint.best_metric)
    if value is None or (state.best_metric is not None and value <= state.best_metric):
        return False
    state.best_metric, state.best_step = float(value), state.step
    return True


def guard_phase(run: Run, state: TrainState) -> str:
    """Run the divergence rules on the history so far and act: returns "ok", "rollback" (done) or "stop".
    Every rank runs it on the same history (log_step broadcasts rank 0's records), so all decide alike."""
    action, changed, findings = run.live.guardian.after_step(run.live.history)
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
    if run.live.escalate:
        run.live.escalate = False
        recent = run.live.guardian.state["recent_skips"]
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
        run.live.stop_reason = f"{trigger.name}: {trigger.message} What to do: {trigger.suggestion}"
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
    """Roll back (module docstring), optionally scaling the lr; later checkpoints become `rolled_back-...`,
    so a crash cannot resume into the trouble. False when none is possible: the run then stops."""
    cfg = run.cfg.guards

    def refuse(reason: str) -> bool:
        run.live.stop_reason = f"{trigger.name}: {trigger.message} No rollback was possible: {reason}."
        run.event(
            "guard_stop",
            state.step,
            rule=trigger.name,
            reason=reason,
            evidence=trigger.evidence,
            message=trigger.message,
        )
        return False

    if not run.live.guardian.can_roll_back():
        return refuse(f"guards.max_rollbacks={cfg.max_rollbacks} used up")
    if run.saver is not None:
        run.saver.wait()
    collect_saves(run)
    before_trouble = ckpt.step_dir_name(int(trigger.steps[0]))
    target = run.on_writer(  # every rank loads the checkpoint rank 0 chose
        lambda: ckpt.find_resumable(run.run_dir.checkpoints, healthy_only=True, older_than=before_trouble)[0]
    )
    if target is None:
        return refuse("no healthy checkpoint from before the trouble")
    guards = dict(run.live.guardian.state)
    cursor = run.source.state_dict()
    from_step = state.step
    ckpt.load_into(target, state)
    guards["rollbacks"] += 1
    guards["lr_scale"] *= cfg.rollback_lr_scale
    guards["recent_skips"], guards["active"] = [], {}
    state.guards = guards
    run.live.guardian = Guardian(cfg, state.guards)
    run.source.load_state_dict(cursor)
    state.curriculum = cursor
    if cfg.rollback_lr_scale != 1.0:
        schedules = [(state.optimizer, state.scheduler)]
        if state.proposer is not None:  # self-play's second policy (stages/selfplay/roles.py) backs off too
            schedules.append((state.proposer.optimizer, state.proposer.scheduler))
        for optimizer, sched in schedules:
            sched.base_lrs = [lr * cfg.rollback_lr_scale for lr in sched.base_lrs]
            for group, lr in zip(optimizer.param_groups, sched.get_last_lr()):
                group["lr"] = lr * cfg.rollback_lr_scale
    if run.world.is_writer:
        for path in ckpt.committed(run.run_dir.checkpoints):
            if int(path.name.removeprefix("step_")) > state.step:
                path.rename(path.with_name(f"rolled_back-{path.name}-r{guards['rollbacks']}"))
    run.run_dir.truncate_after(state.step)
    run.live.history = [r for r in run.live.history if int(r.get("step", -1)) <= state.step]
    sync_sampler(run, state, state.step)
    sync_roles = get_stage(run.cfg.train.stage).sync_roles
    if sync_roles is not None:  # another role's sampler follows its restored weights (self-play's proposer)
        sync_roles(run, state)
    if run.pipeline is not None:
        state.pipeline = []  # not the checkpoint's queued batches: drawn before the trouble (pipeline.py)
        restore_pipeline(run, state)
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
    why = f"stopped by guards at step {state.step}: {run.live.stop_reason} (keelrl doctor {run.run_dir.path})"
    run.report_status(state="stopped", step=state.step, reason=why)
    raise GuardStop(why)


def install_sigterm(run: Run) -> Any:
    """SIGTERM (preemption, or the supervisor passing one on) asks for a checkpoint at the end of the step."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, _frame: Any) -> None:
        run.live.stop_requested = True

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
    if run.saver is not None:
        run.saver.wait()
    collect_saves(run)
    if run.on_writer(lambda: run.ckpt_policy.good_step != state.step):  # no good checkpoint of this step yet
        save_checkpoint(run, state, final_eval, "final", wait=True)
    final_failed = "the checkpoint of the final step could not be written"
    stop_unsaved(run, state, lambda: final_failed if run.ckpt_policy.good_step != state.step else None)
    summary: dict[str, Any] = {}
    if run.world.is_writer:
        policy = run.whole_policy(state)
        try:
            # final/: merged HF weights; final/adapter/: the peft adapter (models/lora.py)
            if has_lora(policy):
                base = (state.lora_base or {}).get("path", cfg.model.path)
                save_hf_dir(merged_model(policy), run.tokenizer, run.run_dir.final_dir)
                save_adapter_dir(policy, run.run_dir.final_dir / "adapter", base)
            else:
                save_hf_dir(policy, run.tokenizer, run.run_dir.final_dir)
            stage = get_stage(cfg.train.stage)
            if stage.finish is not None:  # what the stage writes beside the weights (a reward model's card)
                stage.finish(run, state, final_eval)
        except ckpt.WRITE_ERRORS as err:
            why = (
                f"training finished and its final checkpoint is saved, but exporting the policy to "
                f"{run.run_dir.final_dir} failed ({type(err).__name__}: {err}). Free space there and run the "
                "same command again: it resumes at the last step and only redoes the export."
            )
            run.report_status(state="stopped", step=state.step, reason=why)
            raise CheckpointStop(why) from None
        initial = next((m for m in run.run_dir.metrics() if m.get("step") == 0 and "eval/accuracy" in m), {})
        summary = {
            "state": "finished",
            "stage": cfg.train.stage,
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
            **({"lora": {**lora_summary(policy), "base": state.lora_base}} if has_lora(policy) else {}),
            "checkpoint_stalls": [
                {"step": st, "stall_s": round(a, 4), "total_s": round(b, 4)}
                for st, a, b in run.live.save_stalls
            ],
        }
        run.run_dir.write_summary(summary)
        run.report_status(state="finished", step=state.step)
    return summary
