"""The [selfplay] section: `train.stage = "selfplay"`, where the policy proposes its training problems."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from keelrl.config.base import Section


class SelfPlayConfig(Section):
    proposer_prompts: int = Field(
        2,
        ge=1,
        description=(
            "Proposer prompts per step, each sampled rollout.group_size times (its group for the advantage). "
            "The solver then takes rollout.batch_size / group_size problems: this step's valid new proposals "
            "first, topped up from the buffer."
        ),
    )
    policies: Literal["one", "two"] = Field(
        "one",
        description=(
            "Who proposes. one: the policy plays both roles (the role is in the prompt) and one update trains "
            "both roles' rollouts. two: the proposer is a second policy from the same starting weights "
            "(model.path), with its own optimizer (selfplay.proposer_lr), trained only on the proposals; the "
            "policy trains only on the solutions, and it is what evals, checkpoints' weights and final/ hold (the "
            "proposer is saved in trainer_state.pt). One process, rollout.engine = 'hf', without model.lora."
        ),
    )
    proposer_lr: float = Field(
        0.0, ge=0.0, description="selfplay.policies = 'two': the proposer's learning rate; 0: algo.lr."
    )
    proposal: Literal["problem", "worked"] = Field(
        "problem",
        description=(
            "What the proposer writes (docs/selfplay.md). problem: it states the answer key and the task checks "
            "it (Countdown: `numbers -> target`, solvable by brute force; code: a reference that passes its "
            "asserts). worked: it writes a solution and the task's executor computes the key (Countdown: the "
            "target is the solution's value; code: the expected values are what the reference returns), as "
            "Absolute Zero's executor does."
        ),
    )
    proposer_max_new_tokens: int = Field(
        0,
        ge=0,
        description="Token budget of a proposal; 0: rollout.max_new_tokens (a worked line needs more).",
    )
    buffer_capacity: int = Field(
        4096, ge=1, description="Proposed problems kept (deduplicated; the oldest leave first)."
    )
