"""The RL step's config checks: the batch arithmetic (groups, ranks, mini- and micro-batches) must come out even."""

from __future__ import annotations

from keelrl.config import Config


def check_batch_arithmetic(cfg: Config, world_size: int) -> None:
    """Raise ValueError spelling out the arithmetic when batch settings do not fit together."""
    r, a, t = cfg.rollout, cfg.algo, cfg.train
    if r.batch_size % r.group_size:
        raise ValueError(
            f"rollout.batch_size={r.batch_size} is not divisible by rollout.group_size={r.group_size} "
            f"({r.batch_size} / {r.group_size} = {r.batch_size / r.group_size:g}); every prompt needs a full group. "
            f"Use a multiple of {r.group_size}, e.g. {max(1, r.batch_size // r.group_size) * r.group_size}."
        )
    prompts = r.batch_size // r.group_size
    if prompts % world_size:
        raise ValueError(
            f"rollout.batch_size / rollout.group_size = {prompts} prompts per step cannot be split evenly over "
            f"{world_size} ranks ({prompts} / {world_size} = {prompts / world_size:g})."
        )
    if r.batch_size % a.minibatches:
        raise ValueError(
            f"rollout.batch_size={r.batch_size} is not divisible by algo.minibatches={a.minibatches} "
            f"({r.batch_size} / {a.minibatches} = {r.batch_size / a.minibatches:g})."
        )
    per_rank_minibatch = r.batch_size // a.minibatches // world_size
    if per_rank_minibatch % t.micro_batch_size:
        raise ValueError(
            f"the mini-batch of rollout.batch_size / algo.minibatches{' / world_size' if world_size > 1 else ''} = "
            f"{per_rank_minibatch} sequences is not divisible by train.micro_batch_size={t.micro_batch_size} "
            f"({per_rank_minibatch} / {t.micro_batch_size} = {per_rank_minibatch / t.micro_batch_size:g}). "
            f"Pick a micro_batch_size that divides {per_rank_minibatch}."
        )
