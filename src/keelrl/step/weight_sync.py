"""Weight sync: after every update (and after setup, a resume or a rollback) the sampler gets the policy's
weights. An engine that holds a copy of them (`checks_sync`: the vLLM engine, or a Ray pool of them) is then
checked before it samples anything: each engine samples `vllm.sync_check_tokens` tokens for each of
`vllm.sync_check_prompts` fixed held-out prompts (two KV blocks long at least, so they sit in the prefix cache
from one check to the next), the trainer scores those tokens, and the worst engine's mean gap must be below
`vllm.tolerance` (rollout/sync_check.py). Above it (the `weight_sync` guard): a `weight_sync_failed` event, the weights are
pushed again with the cache reset, and the check is redone; failing twice raises `WeightSyncError`, and the
supervisor restarts the worker from the last checkpoint, so a run never trains on rollouts from unknown weights.

Metrics: time/sync_s (push and check), sync/gap_max and sync/gap_mean (the check that let the step go on),
sync/retries.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from keelrl.core.seeds import stable_hash
from keelrl.models.lora import sampler_weights
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import SamplingSettings, render_prompt
from keelrl.rollout.sync_check import SyncGap, logprob_gap, trainer_logprobs
from keelrl.rollout.types import CheckedSampler
from keelrl.run.distributed import full_state_dict, is_sharded
from keelrl.run.state import TrainState

if TYPE_CHECKING:
    from keelrl.run.run import Run


class WeightSyncError(RuntimeError):
    """The engine still samples from other weights than the trainer's after a second push."""


def sync_sampler(run: Run, state: TrainState, step: int) -> dict[str, float]:
    """Push the current weights (policy version `state.policy_version`) to the sampler and, for an engine with
    a copy, check them. `step`: the step the push belongs to (events, fault drills)."""
    t0 = time.perf_counter()
    checked = getattr(run.sampler, "checks_sync", False) and run.cfg.vllm.sync_check_prompts > 0
    push(run, state, run.faults.weight_sync_drill(step) if checked else None)
    if not checked:
        return {"time/sync_s": time.perf_counter() - t0}
    tolerance = run.cfg.vllm.tolerance
    gap, retries = probe(run, state), 0
    if gap.mean > tolerance:
        run.event(
            "weight_sync_failed",
            step,
            rule="weight_sync",
            gap_mean=round(gap.mean, 6),
            gap_max=round(gap.max, 6),
            tolerance=tolerance,
            policy_version=state.policy_version,
            message="the engine's log-probs do not match the trainer's weights; pushing the weights again",
        )
        push(run, state, None)
        gap, retries = probe(run, state), 1
        if gap.mean > tolerance:
            raise WeightSyncError(
                f"weight sync failed twice at step {step}: after pushing policy version {state.policy_version} to "
                f"the sampling engine and emptying its prefix cache, its log-probs of {gap.tokens} probe tokens "
                f"still differ from the trainer's by {gap.mean:.3g} nats on average (max {gap.max:.3g}; allowed "
                f"{tolerance:g}, vllm.sync_tolerance). Rollouts from these weights would train on unknown weights, "
                "so the step stops here. Usual causes: a weight name the engine does not know (tied or renamed "
                "layers), an engine dtype far from the trainer's (see vllm.dtype), or a broken engine."
                + (
                    f" The engine's log ends:\n{run.sampler.log_tail()}"
                    if hasattr(run.sampler, "log_tail")
                    else ""
                )
            )
        run.event("weight_sync_recovered", step, gap_mean=round(gap.mean, 6), gap_max=round(gap.max, 6))
    return {
        "time/sync_s": time.perf_counter() - t0,
        "sync/gap_max": gap.max,
        "sync/gap_mean": gap.mean,
        "sync/retries": float(retries),
    }


def push(run: Run, state: TrainState, drill: str | None) -> None:
    """Hand the sampler the current weights (a sharded policy is gathered first). `drill` (fault drills only):
    "skip" pushes nothing, "stale_prefix_cache" pushes but keeps the engine's prefix cache."""
    if is_sharded(state.policy):
        run.sampler_model.load_state_dict(full_state_dict(state.policy))
    if drill == "skip":
        return
    model = run.sampler_model
    # the in-process sampler samples the policy itself (its own tensors: nothing is copied); an engine with its
    # own copy of the base architecture gets base + adapters merged when the policy has LoRA adapters
    own = getattr(run.sampler, "model", None) is model
    weights = (untied_state_dict(model) if own else sampler_weights(model)).items()
    if drill == "stale_prefix_cache":
        cast(CheckedSampler, run.sampler).update_weights(
            weights, state.policy_version, reset_prefix_cache=False
        )
    else:
        run.sampler.update_weights(weights, state.policy_version)


def probe(run: Run, state: TrainState) -> SyncGap:
    """Every engine samples the probe, the trainer scores it: the log-prob gap of the worst engine (by mean; a
    Ray pool of vLLM actors has one engine per actor, and one stale engine is enough to fail)."""
    v = run.cfg.vllm
    longest = v.max_model_len or int(getattr(run.sampler_model.config, "max_position_embeddings", 0) or 4096)
    prompts = probe_prompts(
        run, v.sync_check_prompts, min(2 * (v.block_size or 128), longest - v.sync_check_tokens)
    )
    settings = SamplingSettings(v.sync_check_tokens, run.settings.temperature)
    seeds = [stable_hash("sync_probe", i) for i in range(len(prompts))]
    model = run.whole_policy(state)
    gaps = []
    for gens in cast(CheckedSampler, run.sampler).generate_on_each(prompts, settings, seeds):
        trainer = trainer_logprobs(model, prompts, [g.completion_ids for g in gens], settings.temperature)
        gaps.append(logprob_gap(trainer, [g.logprobs for g in gens]))
    return max(gaps, key=lambda gap: gap.mean)


def probe_prompts(run: Run, n: int, length: int) -> list[list[int]]:
    """`n` prompts of `length` tokens: held-out problems' prompts, each continued with the next problems'
    prompts and cut at `length`. Long, because the prefix cache keeps whole blocks only and a probe must pass
    through it (two blocks, or as much as the model's context leaves)."""
    template, out, index = run.prompter.template, [], 0
    for _ in range(n):
        ids: list[int] = []
        while len(ids) < length:
            problem = run.task.problem("test", index)
            ids += render_prompt(run.tokenizer, run.task.prompt(problem, template), template)
            index += 1
        out.append(ids[:length])
    return out
