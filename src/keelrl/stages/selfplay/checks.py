"""Self-play's config checks."""

from __future__ import annotations

from keelrl.config import Config
from keelrl.stages.rl.checks import check_batch_arithmetic
from keelrl.stages.selfplay.proposers import PROPOSERS


def check_selfplay(cfg: Config, world_size: int) -> None:
    """RL's batch arithmetic, one process, a task with a proposal checker, synchronous sampling, and room in the
    solver's batch for every proposal a step can make (so each new one is solved, and paid, in its step)."""
    check_batch_arithmetic(cfg, world_size)
    if world_size > 1:
        raise ValueError("train.stage = 'selfplay' runs in one process for now; drop --nproc-per-node")
    if cfg.task.name not in PROPOSERS:
        raise ValueError(
            f"train.stage = 'selfplay' needs a task whose proposals keelrl can check ({', '.join(PROPOSERS)}); "
            f"task.name = {cfg.task.name!r} has none yet"
        )
    unsupported = {
        "rollout.max_staleness": (cfg.rollout.max_staleness, 0),
        "reward.model": (cfg.reward.model, ""),
        "curriculum.kind": (cfg.curriculum.kind, "sequential"),
        "curriculum.dynamic_sampling": (cfg.curriculum.dynamic_sampling, False),
    }
    for key, (value, plain) in unsupported.items():
        if value != plain:
            raise ValueError(
                f"train.stage = 'selfplay' does not combine with {key} = {value!r} yet (the proposals' buffer is "
                f"its problem source and the task's checker its reward); set {key} = {plain!r}"
            )
    if cfg.selfplay.policies == "two":
        refused = {
            "rollout.engine = 'vllm'": cfg.rollout.engine != "hf",
            "model.lora": cfg.model.lora.rank > 0,
            "algo.advantage = 'gae'": cfg.algo.advantage == "gae",
        }
        if bad := [k for k, on in refused.items() if on]:
            raise ValueError(
                f"selfplay.policies = 'two' does not combine with {', '.join(bad)} yet: the proposer is a second "
                "in-process policy on the hf engine, trained whole by a group estimator with its own optimizer; "
                "drop them or use selfplay.policies = 'one'"
            )
    proposals = cfg.selfplay.proposer_prompts * cfg.rollout.group_size
    if proposals > cfg.prompts_per_step:
        raise ValueError(
            f"selfplay.proposer_prompts x rollout.group_size = {proposals} proposals per step, but the solver "
            f"takes rollout.batch_size / group_size = {cfg.prompts_per_step} problems: lower proposer_prompts or "
            "raise rollout.batch_size, so that every new proposal is solved (and paid) in its step"
        )
    if cfg.selfplay.buffer_capacity < proposals:
        raise ValueError(
            f"selfplay.buffer_capacity = {cfg.selfplay.buffer_capacity} is below the {proposals} proposals of one "
            "step: a new problem could leave the buffer before it is solved"
        )
