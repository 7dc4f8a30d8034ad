"""The [selfplay] section: `train.stage = "selfplay"`, where the policy proposes its training problems."""

from __future__ import annotations

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
    buffer_capacity: int = Field(
        4096, ge=1, description="Proposed problems kept (deduplicated; the oldest leave first)."
    )
