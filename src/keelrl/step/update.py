"""The update: advantages over the global batch, the training batch, and the optimizer steps (`update_phase`).

The update sees only per-token tensors (log-prob, old log-prob, advantage, mask) and the objective chosen by
`algo.objective` (algo/objectives.py); group logic stays in the advantage estimators.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
from transformers import PreTrainedModel

from keelrl.algo.advantages import compute_advantages
from keelrl.algo.config import AlgoConfig
from keelrl.algo.logprobs import Autocast, LogprobModule, autocast_context
from keelrl.algo.losses import kl_reward_penalty, token_weights
from keelrl.algo.objectives import LossInputs, compute_loss
from keelrl.algo.offpolicy import (
    add_sums,
    behaviour_log_ratio,
    behaviour_metrics,
    behaviour_trust_region,
    correction_weights,
)
from keelrl.core.seeds import stable_hash
from keelrl.guards.base import Finding
from keelrl.guards.step import check_update
from keelrl.rollout import Rollout
from keelrl.run.distributed import (
    World,
    agree_on_norm,
    all_gather_list,
    all_reduce_stats,
    all_reduce_sum,
    grad_sync,
    loss_scale,
)
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.run.supervisor import pulse
from keelrl.step.batch import TrainBatch, collate, micro_batches
from keelrl.step.critic import ValueModel, critic_advantages, critic_backward
from keelrl.step.weight_sync import sync_sampler


def advantage_phase(
    run: Run, state: TrainState, rollouts: list[Rollout], batch: TrainBatch
) -> tuple[dict[str, float], float]:
    """Advantages into the rollouts and `batch.advantages`: from the global batch's rewards (gathered on every
    rank, each keeping its slice; rollouts without a reward are left out, `compute_advantages`' valid), or per
    token from the critic (`gae`: step/critic.py). With `algo.kl_estimator = "k1_reward"` the KL penalty comes off
    the reward first: each sequence's summed kl_coef * k1 (the group statistics see the penalised reward), or
    each token's (gae). Returns the estimator's metrics and the mean |advantage| (the per-step guards scale
    their loss bound by it)."""
    a = run.cfg.algo
    kl = None  # [B, T] algo.kl_estimator = "k1_reward": kl_coef * k1 per token, taken from the reward
    if a.kl_estimator == "k1_reward" and batch.ref_logprobs is not None:
        kl = a.kl_coef * kl_reward_penalty(batch.sampler_logprobs, batch.ref_logprobs, batch.target_mask)
    if a.advantage == "gae":
        assert state.critic is not None  # built by setup for gae
        mbs, autocast = run.cfg.train.micro_batch_size, run.cfg.train.autocast
        return critic_advantages(state.critic, batch, rollouts, a, run.world, mbs, autocast, kl)
    penalty = kl.sum(dim=1).tolist() if kl is not None else [0.0] * len(rollouts)  # each sequence's sum
    local = [(r.reward - p, r.status == "ok") for r, p in zip(rollouts, penalty, strict=True)]
    rows = torch.tensor(all_gather_list(local, run.world), dtype=torch.float64)  # [B, 2]
    adv, metrics = compute_advantages(
        rows[:, 0], run.cfg.rollout.group_size, a.advantage, a.std_eps, a.group_baseline, rows[:, 1] > 0
    )
    offset = run.world.rank * len(rollouts)
    mine = adv[offset : offset + len(rollouts)]
    for r, value in zip(rollouts, mine.tolist()):
        r.advantage = value
    batch.advantages = mine.to(batch.advantages.device, torch.float32)
    return metrics, metrics["advantage/abs_mean"]


def as_logprob_module(model: torch.nn.Module) -> torch.nn.Module:
    """A policy as the module the update calls (models pass through `LogprobModule`; wrapped ones as they are)."""
    return LogprobModule(model) if isinstance(model, PreTrainedModel) else model


def forward_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    micro_batch_size: int,
    temperature: float,
    share_prefix: bool = True,
    autocast: Autocast = "off",
) -> torch.Tensor:
    """Log-probs [B, T] of the batch's completion tokens under `model` (policy or train_module), no grad."""
    module = as_logprob_module(model)
    return batch.per_token_no_grad(
        micro_batch_size,
        autocast,
        lambda mb: module(
            mb.input_ids, mb.attention_mask, mb.target_mask, temperature, share_prefix=share_prefix
        )[0],
    )


def prepare_batch(
    run: Run, state: TrainState, rollouts: list[Rollout]
) -> tuple[TrainBatch, dict[str, float]]:
    """Collate; attach reference log-probs and the old-policy (proximal) ones: the sampler's when it ran the
    policy being updated, else (algo.old_logprobs = "recompute", or stale batches) the trainer's, with the
    off-policy correction's weights and the behaviour/* and mismatch/* metrics (algo/offpolicy.py): recomputed
    here before several optimizer steps, or taken from the update's own forward when there is one."""
    cfg, a, world = run.cfg, run.cfg.algo, run.world
    batch = collate(rollouts, run.tokenizer.pad_token_id or 0, world.device)
    temp, mbs = run.settings.temperature, cfg.train.micro_batch_size
    # tokens the update runs the model over (prompt + completion, no padding), global
    metrics: dict[str, float] = {"tokens/trained": all_reduce_sum(float(batch.lengths.sum()), world)}
    share, autocast = run.update_share_prefix, cfg.train.autocast
    if state.ref_policy is not None:
        batch.ref_logprobs = forward_logprobs(state.ref_policy, batch, mbs, temp, share, autocast)
    if not (a.old_logprobs == "recompute" or cfg.rollout.max_staleness > 0):
        batch.old_logprobs = batch.sampler_logprobs  # the sampler ran the policy being updated
    elif a.ppo_epochs * a.minibatches > 1:  # several optimizer steps: pi_prox is recomputed first
        assert run.train_module is not None  # set by setup for every world size
        batch.old_logprobs = forward_logprobs(run.train_module, batch, mbs, temp, share, autocast)
        weights, sums = correction_weights(batch.old_logprobs, batch.sampler_logprobs, batch.target_mask, a)
        batch.is_weights = weights if a.correction != "off" else None
        metrics.update(behaviour_metrics(all_reduce_stats(sums, world)))
    # else one optimizer step per batch: pi_prox is the policy the update's own forward runs (minibatch_backward),
    # so no extra forward pass; old_logprobs stays None
    return batch, metrics


def rl_update(run: Run, state: TrainState, rollouts: list[Rollout]) -> dict[str, float]:
    """A scored batch's RL update: collate with reference and old log-probs (`prepare_batch`), advantages
    (`advantage_phase`), the optimizer steps (`update_phase`); their metrics. Shared by the RL and self-play
    steps."""
    batch, metrics = prepare_batch(run, state, rollouts)
    advantage_metrics, advantage_abs_mean = advantage_phase(run, state, rollouts, batch)
    metrics.update(advantage_metrics)
    metrics.update(update_phase(run, state, batch, advantage_abs_mean))
    return metrics


def update_phase(
    run: Run, state: TrainState, batch: TrainBatch, advantage_abs_mean: float
) -> dict[str, float]:
    """`ppo_epochs` passes, each split into `minibatches` optimizer steps (see `minibatch_backward`); each
    step is first judged by the per-step guards and skipped (gradient dropped) when one fires."""
    cfg, a, world = run.cfg, run.cfg.algo, run.world
    assert run.train_module is not None  # set by setup for every world size
    B = batch.input_ids.shape[0]
    sums: Counter[str] = Counter()  # per-pass metrics, averaged over the passes at the end
    ratio_max = 0.0
    skipped = nonfinite = 0
    lr = state.optimizer.param_groups[0]["lr"]
    mb_size = B // a.minibatches
    critic, critic_opt = state.critic, state.critic_optimizer
    warmup = critic is not None and state.step < a.critic_warmup_steps  # the critic learns, the policy waits
    history = own_history(run)  # what the per-step guards judge each optimizer step against
    passes = a.ppo_epochs * a.minibatches
    # one mini-batch's norm is judged against the largest mini-batch norms of the steps before (guards' grad_spike)
    grad_key, grad_max = ("grad_norm/max" if passes > 1 else "grad_norm"), 0.0
    for epoch in range(a.ppo_epochs):
        perm = torch.arange(B, device=world.device)
        if a.minibatches > 1:
            g = torch.Generator().manual_seed(
                stable_hash("minibatch", cfg.train.seed, state.step, epoch) % 2**63
            )
            perm = torch.randperm(B, generator=g).to(world.device)
        for m in range(a.minibatches):
            state.optimizer.zero_grad(set_to_none=True)
            if critic_opt is not None:
                critic_opt.zero_grad(set_to_none=True)
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
                critic=critic,
            )
            ratio_max = max(ratio_max, stats.pop("ratio/max"))
            sums.update(stats)
            run.faults.corrupt_gradients(state.step + 1, state.policy)
            grad_norm = agree_on_norm(grad_norm_and_clip(state.policy, a.grad_clip), world)
            sums["grad_norm"] += grad_norm
            grad_max = max(grad_max, grad_norm)
            finding = check_update(
                history,
                state.step + 1,
                stats.get("loss/total", 0.0),
                grad_norm,
                ratio_max,
                advantage_abs_mean,
                run.cfg.guards,
                grad_key=grad_key,
            )
            if finding is not None and finding.action == "skip":
                skipped += 1
                nonfinite += finding.name == "nonfinite"
                skip_update(run, state, finding, epoch=epoch, minibatch=m)
                continue
            if not warmup:
                state.optimizer.step()
            if critic is not None and critic_opt is not None:
                sums["critic/grad_norm"] += grad_norm_and_clip(critic, a.grad_clip)
                critic_opt.step()
    sync = end_of_step(run, state)
    out = {k: v / passes for k, v in sums.items()}
    if passes > 1:
        out["grad_norm/max"] = grad_max
    out["ratio/max"] = ratio_max
    out["lr"] = lr
    out["guard/skipped_updates"] = float(skipped)
    out["guard/nonfinite_updates"] = float(nonfinite)
    if critic is not None:
        out["critic/warmup"] = float(warmup)
    out.update(sync)
    return out


def own_history(run: Run) -> list[dict[str, Any]]:
    """The records an update is judged against: the run's, or for a role that logs its update metrics under a
    prefix (self-play's proposer, `run.metric_prefix`), that role's own, the prefix removed."""
    p = run.metric_prefix
    if not p:
        return run.live.history
    return [
        {"step": r["step"], **{k.removeprefix(p): v for k, v in r.items() if k.startswith(p)}}
        for r in run.live.history
        if "step" in r
    ]


def skip_update(run: Run, state: TrainState, finding: Finding, **where: Any) -> None:
    """Drop the gradients of an update a per-step guard judged unsafe (the step still counts), and record it:
    an event, and a skip that escalates to a rollback when they come too often."""
    state.optimizer.zero_grad(set_to_none=True)
    if state.critic_optimizer is not None:
        state.critic_optimizer.zero_grad(set_to_none=True)
    run.live.escalate = run.live.guardian.record_skip(state.step + 1) or run.live.escalate
    run.event(
        "skip", state.step + 1, rule=finding.name, evidence=finding.evidence, message=finding.message, **where
    )


def supervised_update(
    run: Run, state: TrainState, loss: float, grad_norm: float, **supervised_loss: float
) -> dict[str, float]:
    """The end of an SFT or reward-model step, whose gradients are in .grad: the per-step guards (no importance
    ratio; every example carries signal, so an exactly-zero gradient is a fault; `supervised_loss`: nll= or
    pair_nll=, see check_update) -> optimizer step, or the skip -> `end_of_step`; the step counter advances.
    Returns the weight sync's and the guards' metrics."""
    finding = check_update(
        run.live.history, state.step + 1, loss, grad_norm, 0.0, 1.0, run.cfg.guards, **supervised_loss
    )
    skipped = finding is not None and finding.action == "skip"
    if finding is not None and skipped:
        skip_update(run, state, finding)
    else:
        state.optimizer.step()
    sync = end_of_step(run, state)
    state.step += 1
    return {
        **sync,
        "guard/skipped_updates": float(skipped),
        "guard/nonfinite_updates": float(finding is not None and skipped and finding.name == "nonfinite"),
        "guard/skipped_steps": float(state.guards.get("skipped_steps", 0)),
    }


def end_of_step(run: Run, state: TrainState) -> dict[str, float]:
    """After a step's updates: the learning-rate schedule and the policy version advance, and the sampler
    gets the new weights (checked where the engine holds a copy). Returns the weight sync's metrics."""
    with warnings.catch_warnings():
        # The schedule follows the step, skipped updates included, so that a guard's skip (or a resume)
        # never shifts the learning rate; PyTorch warns when the run's first optimizer step was skipped.
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
        state.scheduler.step()
    state.policy_version += 1
    return sync_sampler(run, state, state.step + 1)


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
    critic: ValueModel | None = None,
) -> dict[str, float]:
    """Accumulate into .grad the gradient of the mini-batch `idx`'s loss, one micro-batch at a time, each
    weighted with the mini-batch's global token and sequence counts (so the gradient is the same for any
    micro_batch_size and world size). Returns the loss terms and per-token statistics as token means.
    `policy` is a model or the run's train_module (DDP / FSDP2: ranks sync on the last micro-batch)."""
    a = algo
    module = as_logprob_module(policy)
    scale = loss_scale(world)
    g_tokens = all_reduce_sum(float(batch.target_mask[idx].sum()), world)
    # sequences trained on
    g_seqs = all_reduce_sum(float((batch.target_mask[idx].sum(dim=1) > 0).sum()), world)
    sums: dict[str, float] = {"ratio/max": 0.0}
    offpolicy: dict[str, float] = {}  # behaviour_sums when pi_prox comes from this forward
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
            if mb.old_logprobs is None:  # one optimizer step per batch: pi_prox is this forward's own policy
                lp_old = lp.detach()
                is_w, part = correction_weights(lp_old, mb.sampler_logprobs, mb.target_mask, a)
                offpolicy = add_sums(offpolicy, part)
                is_w = is_w if a.correction != "off" else None
            else:
                lp_old, is_w = mb.old_logprobs, mb.is_weights
            trust = None
            if is_w is not None and a.behaviour_clip:  # PPO's clip against the sampling policy, too
                log_rho = behaviour_log_ratio(lp_old, mb.sampler_logprobs, mb.target_mask, a.correction_level)
                trust = behaviour_trust_region(log_rho, mb.advantages, a.clip_low, a.clip_high)
                is_w = is_w * trust
            # token weights [b, T]: the loss's (loss_agg), then the metrics' (token mean)
            w = token_weights(mb.target_mask, a.loss_agg, g_tokens, g_seqs, max_new_tokens)
            mw = token_weights(mb.target_mask, "token_mean", g_tokens, g_seqs, max_new_tokens)
            inputs = LossInputs(lp, ent, lp_old, mb.advantages, mb.target_mask, w, mw, mb.ref_logprobs, is_w)
            loss, stats = compute_loss(inputs, a)
            if trust is not None:
                stats["clipfrac/behaviour"] = float(((1.0 - trust) * mw).sum())
            (loss * scale).backward()
        if critic is not None:  # its value loss, token-mean weighted like the metrics (step/critic.py)
            stats.update(critic_backward(critic, mb, mw, a, scale, autocast))
        for key, value in stats.items():
            sums[key] = max(sums[key], value) if key == "ratio/max" else sums.get(key, 0.0) + value
    sums.update({f"offpolicy:{k}": v for k, v in offpolicy.items()})
    out = all_reduce_stats(sums, world)  # one collective for both
    reduced = {k.removeprefix("offpolicy:"): out.pop(k) for k in list(out) if k.startswith("offpolicy:")}
    return {**out, **(behaviour_metrics(reduced) if reduced else {})}


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
