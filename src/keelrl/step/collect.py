"""Collect a step's batch: draw problems, run episodes (episodes.py, the path evals use too), score them,
refill groups without signal. Every rank sees the same global problem list and samples its shard; each
row's seed is derived from (train.seed, step, rollbacks, row), so a completion does not depend on how rows
are split across ranks or batches, and a rollback does not replay the samples that led into trouble.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from keelrl.core.seeds import stable_hash
from keelrl.curriculum.sources import (
    GroupOutcome,
    fill_batch,
    has_signal,
    refill_budget_prompts,
    task_metrics,
)
from keelrl.models.lora import sampler_weights
from keelrl.monitor.traces import is_repetitive
from keelrl.rollout import Rollout
from keelrl.rollout.episodes import Episode, generate, score
from keelrl.rollout.pipeline import staleness_metrics
from keelrl.rollout.types import is_truncated
from keelrl.run.distributed import all_gather_list, all_reduce_sum
from keelrl.run.run import ResumeError, Run
from keelrl.run.state import TrainState
from keelrl.run.supervisor import pulse
from keelrl.tasks.base import STATUSES, score_safely
from keelrl.tasks.env import EPISODE_ENDS


def draw_episodes(
    run: Run, state: TrainState, step: int, n: int | None = None, attempt: int = 0
) -> list[Episode]:
    """Draw `n` prompts for `step` (default: a step's; the same list on all ranks) and this rank's shard of
    their episodes, group_size per prompt. `attempt` > 0: a dynamic-sampling refill (fresh seeds)."""
    cfg, world = run.cfg, run.world
    problems = run.source.next_problems(cfg.prompts_per_step if n is None else n)
    per_rank = len(problems) // world.world_size
    mine = list(enumerate(problems))[world.rank * per_rank : (world.rank + 1) * per_rank]
    G, refill = cfg.rollout.group_size, ("refill", attempt) if attempt else ()
    seed = functools.partial(stable_hash, "sample", cfg.train.seed, step, state.guards.get("rollbacks", 0))
    return [
        Episode(i, problem, group, seed(group * G + k, *refill))
        for group, (i, problem) in mine
        for k in range(G)
    ]


def sample_phase(run: Run, state: TrainState, n: int | None = None, attempt: int = 0) -> list[Rollout]:
    """Sample this step's episodes (`draw_episodes`) with the current policy, in this process's sampler."""
    episodes = draw_episodes(run, state, state.step, n, attempt)
    run.faults.before_sampling(state.step + 1, run.sampler)
    return generate(run.sampler, run.prompter, episodes, run.settings)


def next_batch(run: Run, state: TrainState) -> tuple[list[Rollout], dict[str, float]]:
    """This step's rollouts: sampled now (synchronous), or taken from the asynchronous pipeline, sampled by
    version step - max_staleness (rollout/pipeline.py); with the async/* metrics then."""
    if run.pipeline is None:
        return sample_phase(run, state), {}
    run.faults.before_sampling(state.step + 1, run.pipeline.sampler)
    rollouts, metrics = run.pipeline.take(state.step, on_wait=pulse)
    metrics.update(staleness_metrics(rollouts, state.policy_version, lambda x: all_gather_list(x, run.world)))
    return rollouts, metrics


def fill_pipeline(run: Run, state: TrainState) -> None:
    """Keep the pipeline (if any) max_staleness + 1 batches ahead of the step: push the current weights when the
    sampler lacks them, then submit the batches of steps up to state.step + max_staleness (rollout/pipeline.py's
    schedule). Then the problem source's state joins TrainState."""
    pipe = run.pipeline
    if pipe is not None:
        if pipe.pushed_version != state.policy_version:
            # the pipeline's sampler holds its own copy of the base architecture (LoRA: the merged weights)
            pipe.push(sampler_weights(run.whole_policy(state)).items(), state.policy_version)
        for step in range(pipe.next_step, state.step + pipe.staleness + 1):
            pipe.submit(step, draw_episodes(run, state, step))
    state.curriculum = run.source.state_dict()  # the draws are part of the state a checkpoint holds


def restore_pipeline(run: Run, state: TrainState) -> None:
    """Asynchronous runs: put back the batches the checkpoint holds for this rank (none when starting, or after a
    rollback, which drops them), then fill the pipeline up to its schedule (rollout/pipeline.py)."""
    assert run.pipeline is not None
    if state.pipeline and len(state.pipeline) != run.world.world_size:
        raise ResumeError(
            f"the checkpoint holds the asynchronous pipeline of {len(state.pipeline)} ranks; this run has "
            f"{run.world.world_size}. Resume with the same number of processes."
        )
    run.pipeline.restore(state.pipeline[run.world.rank] if state.pipeline else [], state.step)
    fill_pipeline(run, state)


def score_phase(run: Run, state: TrainState, rollouts: list[Rollout]) -> int:
    """Score every rollout (on the Ray pool when distributed.scorer = "ray", unless fault drills wrap the
    checker here); returns how many checkers raised (those samples score 0)."""
    if run.scorer is not None and not run.faults.wraps_scoring:
        errors = score(run.task, rollouts, run.scorer.score)
    else:
        drill = run.faults.wrap_score(run.task.score, state.step) if run.faults.wraps_scoring else None
        errors = score(run.task, rollouts, lambda p, t: score_safely(run.task, p, t, drill))
    if errors:
        injected = any("injected fault" in e for e in errors)
        run.event("score_errors", state.step, count=len(errors), first=errors[0], injected=injected)
    # reward.model: the learned score joins the verifier's (stages/rm/learned.py)
    if run.reward_model is not None:
        run.reward_model.apply(run.prompter, rollouts)
    return len(errors)


def pool_metrics(run: Run, state: TrainState) -> dict[str, float]:
    """With Ray actor pools or an engine process: an event for workers replaced since the last call (in this
    step's scoring, generation, refills or the eval before it), and their count since this process started."""
    out: dict[str, float] = {}
    async_sampler = run.pipeline.sampler if run.pipeline is not None else None
    for name, pool in (("scorer", run.scorer), ("sampler", run.sampler), ("sampler", async_sampler)):
        # the pool or engine itself (a vLLM engine; a pool of vLLM actors also counts engine restarts in
        # them), else a Ray pool's ActorPool
        actors = pool if hasattr(pool, "take_replaced") else getattr(pool, "actors", None)
        if not hasattr(actors, "take_replaced"):
            continue
        replaced = actors.take_replaced()
        if replaced:
            run.event(f"{name}_worker_replaced", state.step, count=replaced, total=actors.replaced_total)
        out[f"{name}/replaced_workers"] = float(actors.replaced_total)
    return out


def curriculum_phase(
    run: Run, state: TrainState, rollouts: list[Rollout]
) -> tuple[list[Rollout], dict[str, float], int]:
    """Dynamic sampling (`curriculum.fill_batch`, when on), then the problem source observes every group of
    this step (all ranks). Returns the batch, the curriculum/... and task/... metrics, the refills' errors."""
    cfg, world = run.cfg, run.world
    G = cfg.rollout.group_size
    groups = [rollouts[i : i + G] for i in range(0, len(rollouts), G)]
    out: dict[str, float] = {}
    generated, errors = groups, 0
    if cfg.curriculum.dynamic_sampling:

        def draw(n: int, attempt: int) -> list[list[Rollout]]:
            nonlocal errors
            new = sample_phase(run, state, n, attempt)
            errors += score_phase(run, state, new)
            return [new[i : i + G] for i in range(0, len(new), G)]

        refill = fill_batch(
            groups,
            len(groups),
            draw,
            lambda g: has_signal([r.reward for r in g if r.status == "ok"]),
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
        if refill.stats.exhausted:
            report_exhausted(run, state, refill.stats)
    # the source learns from the samples that have a reward (status "ok") only
    local = [
        (
            g[0].problem,
            tuple(r.reward for r in g if r.status == "ok"),
            tuple(r.correct for r in g if r.status == "ok"),
        )
        for g in generated
    ]
    outcomes = [GroupOutcome(p, rw, c) for p, rw, c in all_gather_list(local, world)]
    run.source.observe(outcomes)
    out.update(run.source.metrics())
    out.update(task_metrics(outcomes))
    return rollouts, out, errors


def report_exhausted(run: Run, state: TrainState, stats: Any) -> None:
    """An event on the 1st, 2nd, 4th, 8th... step in a row whose refill budget ran out."""
    streak = 1
    for record in reversed(run.live.history):
        if record.get("curriculum/budget_exhausted") != 1.0:
            break
        streak += 1
    if streak & (streak - 1) == 0:
        run.event(
            "dynamic_sampling_exhausted",
            state.step + 1,
            steps_in_a_row=streak,
            dropped_groups=stats.dropped,
            regenerated_prompts=stats.regenerated,
            degenerate_groups_trained=stats.filled_degenerate,
            message="refill budget spent before every group had reward variance; trained on the batch as is",
        )


def rollout_metrics(run: Run, rollouts: list[Rollout]) -> dict[str, float]:
    """Reward, accuracy, format and length statistics over the global batch (lengths count sampled tokens:
    a multi-turn episode's environment tokens are not the model's response); `episode_metrics` too for an
    environment. Reward, accuracy and format count the rollouts that have a reward (status "ok"); the others are
    counted by status (`episode/verifier_errors`, `episode/agent_errors`, `episode/timeouts`) and
    `episode/error_frac` is their share of the batch."""
    local = [
        (
            r.reward,
            float(r.correct),
            # a task without a format flag: a positive verifier reward (not a learned one) counts as formatted
            float(bool(r.info.get("formatted", r.info.get("verifier_reward", r.reward) > 0))),
            float(sum(r.trainable)),
            float(is_truncated(r.finish_reason)),
            float(is_repetitive([t for t, m in zip(r.completion_ids, r.trainable) if m])),
            float(STATUSES.index(r.status)),
        )
        for r in rollouts
    ]
    rows = torch.tensor(all_gather_list(local, run.world), dtype=torch.float64)  # [B, 7]
    status = rows[:, 6]
    scored = rows[status == 0] if bool((status == 0).any()) else rows  # [b, 7] the rollouts with a reward
    reward, correct, formatted = scored[:, 0], scored[:, 1], scored[:, 2]
    length, truncated, repetitive = rows[:, 3], rows[:, 4], rows[:, 5]
    cut = scored[:, 4] > 0  # [b] truncated, with a reward: did the answer come before the cut?
    return {
        "reward/mean": float(reward.mean()),
        "reward/std": float(reward.std(correction=0)),
        "accuracy": float(correct.mean()),
        "format_rate": float(formatted.mean()),
        "response_length/mean": float(length.mean()),
        "response_length/max": float(length.max()),
        "response_length/truncated_frac": float(truncated.mean()),
        "response_length/truncated_formatted_frac": float(formatted[cut].mean()) if bool(cut.any()) else 0.0,
        "repetition/frac": float(repetitive.mean()),
        "tokens/generated": float(length.sum()),
        "episode/verifier_errors": float((status == STATUSES.index("verifier_error")).sum()),
        "episode/agent_errors": float((status == STATUSES.index("agent_error")).sum()),
        "episode/timeouts": float((status == STATUSES.index("timeout")).sum()),
        "episode/error_frac": float((status != 0).double().mean()),
        **(episode_metrics(run, rollouts) if run.prompter.multiturn else {}),
        **(learned_reward_metrics(run, rollouts) if run.reward_model is not None else {}),
        **reward_function_metrics(run, rollouts),
    }


def reward_function_metrics(run: Run, rollouts: list[Rollout]) -> dict[str, float]:
    """Each reward function's mean over the batch's rollouts with a reward that list them (`info["rewards"]`:
    task "dataset"), as `reward/fn/<name>`."""
    parts = all_gather_list(
        [r.info["rewards"] for r in rollouts if r.status == "ok" and "rewards" in r.info], run.world
    )
    names = sorted({n for p in parts for n in p})
    return {
        f"reward/fn/{n}": float(torch.tensor([p[n] for p in parts if n in p]).double().mean()) for n in names
    }


def learned_reward_metrics(run: Run, rollouts: list[Rollout]) -> dict[str, float]:
    """reward.model: the batch's mean raw learned score and mean verifier reward (the two parts of reward/mean)."""
    local = [(r.info["reward_model"], r.info["verifier_reward"]) for r in rollouts]
    rows = torch.tensor(all_gather_list(local, run.world), dtype=torch.float64)  # [B, 2]
    return {"reward/model": float(rows[:, 0].mean()), "reward/verifier": float(rows[:, 1].mean())}


def episode_metrics(run: Run, rollouts: list[Rollout]) -> dict[str, float]:
    """Multi-turn episodes over the global batch: mean turns, tool calls and whole-sequence length per episode,
    tool errors in all and per call, and the fraction that ended for each reason (`episode/end/<reason>`); for
    episodes in a box (terminal tasks: info container_s, verifier_s), the mean seconds from its start to the
    verifier's end and of the verifier (`episode/container_s`, `episode/verifier_s`)."""
    local = [
        (r.info.get("turns", 0), r.info.get("tool_calls", 0), r.info.get("tool_errors", 0),
         len(r.prompt_ids) + len(r.completion_ids), EPISODE_ENDS.index(r.finish_reason),  # type: ignore[arg-type]
         r.info.get("container_s", -1.0), r.info.get("verifier_s", -1.0), r.info.get("action_errors", 0))
        for r in rollouts
    ]  # fmt: skip
    rows = torch.tensor(all_gather_list(local, run.world), dtype=torch.float64)  # [B, 8]
    turns, calls, errors, length, end, box_s, verifier_s, action_errors = rows.unbind(dim=1)
    timed = box_s >= 0  # [B] episodes that ran in a box
    box = {
        "episode/container_s": float(box_s[timed].mean()),
        "episode/verifier_s": float(verifier_s[timed].mean()),
    }
    return {
        **(box if bool(timed.any()) else {}),
        "episode/turns": float(turns.mean()),
        "episode/tool_calls": float(calls.mean()),
        "episode/tool_errors": float(errors.sum()),
        "episode/tool_error_rate": float(errors.sum() / calls.sum()) if calls.sum() > 0 else 0.0,
        # turns a typed action could not parse, per episode
        "episode/action_errors": float(action_errors.mean()),
        "episode/length": float(length.mean()),
        **{f"episode/end/{name}": float((end == i).double().mean()) for i, name in enumerate(EPISODE_ENDS)},
    }


def close_step(
    run: Run, state: TrainState, rollouts: list[Rollout], metrics: dict[str, float], times: tuple[float, ...]
) -> dict[str, float]:
    """After the update: the step counts; the asynchronous pipeline gets the new version and the next batch;
    the problem source's state joins TrainState; the guard, checkpoint and time metrics are added (`times`: the
    clock at the start, after sampling, scoring, refills and the update); log.rollouts_per_step of the step's
    rollouts, evenly spaced, go to rollouts.jsonl.gz (rank 0). Shared by the RL and self-play steps."""
    t0, t1, t2, tc, t3 = times
    state.step += 1
    # asynchronous: push the new version, submit the batch it samples; then the source's state joins TrainState
    fill_pipeline(run, state)
    metrics["guard/skipped_steps"] = float(state.guards.get("skipped_steps", 0))
    metrics.update(run.ckpt_policy.behind(state.step))  # only once a checkpoint save has failed
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
        decode = run.tokenizer.decode  # the prompt as the policy saw it: `keelrl report` shows it
        kept = rollouts[::stride][:n]
        run.run_dir.append_rollouts([{**r.to_json(state.step), "prompt": decode(r.prompt_ids)} for r in kept])
    return metrics
