"""The [reward] section: a learned reward model scoring RL's completions (`reward.model`). Training one is
`keelrl rm train` ([data] names the preference pairs there, as it names SFT's examples)."""

from __future__ import annotations

from pydantic import Field

from keelrl.config.base import Section


class RewardConfig(Section):
    model: str = Field(
        "",
        description=(
            "A reward model scoring each completion: a `keelrl rm train` run directory (its final/), or any HF "
            "...ForSequenceClassification directory with one label. '' = the task's verifier alone."
        ),
    )
    model_weight: float = Field(
        1.0, description="Weight of the normalised learned score in the reward (algo/preference.py)."
    )
    verifier_weight: float = Field(
        0.0,
        description=(
            "Weight of the task verifier's reward added to it (0: the learned reward alone; the verifier still "
            "decides `accuracy` and eval/accuracy, which the reward_hacking rule compares with the learned reward)."
        ),
    )
    score_mean: float | None = Field(
        None,
        description=(
            "Subtracted from each raw score before scaling; None = the mean a keelrl reward model measured on "
            "its own data (reward_model.json in its final/)."
        ),
    )
    score_std: float | None = Field(
        None,
        gt=0.0,
        description="Divides the centred score; None = the std from reward_model.json (as score_mean).",
    )
    batch_size: int = Field(32, ge=1, description="Completions per reward-model forward pass.")
