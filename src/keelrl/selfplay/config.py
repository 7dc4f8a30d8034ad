"""The [selfplay] section: `train.stage = "selfplay"`, where the policy proposes its training problems."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SelfPlayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    proposer_prompts: int = Field(
        2,
        ge=1,
        description=(
            "Proposer prompts per step, each sampled rollout.group_size times (its group for the advantage). "
            "The solver then takes rollout.batch_size / group_size problems: this step's valid new proposals "
            "first, topped up from the buffer."
        ),
    )
    proposal: Literal["problem", "worked"] = Field(
        "problem",
        description=(
            "What the proposer writes (selfplay/countdown.py). problem: `numbers -> target`, kept when the "
            "brute-force solver finds it solvable. worked: the problem and a solution on the next line, "
            "`<answer>expression</answer>`; the target is the solution's value (Absolute Zero's executor "
            "computes the answer), so every well-formed proposal is solvable."
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
