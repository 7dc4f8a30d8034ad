"""The guard rules: `RULES`, the one registry (name -> rule), and `GuardsConfig`, the [guards] section with
one sub-section of thresholds per rule under its name. The rules live by family, each next to its thresholds:
numerics.py, policy.py, reward.py, process.py, episode.py, selfplay.py.

A rule is a pure function `rule(history, thresholds) -> Finding | None` that judges the *latest* window of
`history` (metrics.jsonl records, in step order). Threshold fields say where each default comes from
(REFERENCE.md facts, or a measurement here: docs/doctor.md says how).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from keelrl.guards.base import Finding, Record, RuleThresholds
from keelrl.guards.rules import episode, numerics, policy, process, reward, selfplay


def section(thresholds: type[RuleThresholds]) -> Any:
    """A rule's [guards] sub-section: its defaults, documented by its thresholds class's docstring."""
    return Field(default_factory=thresholds, description=thresholds.__doc__)


RuleFn = Callable[[Sequence[Record], Any], "Finding | None"]

# Every rule that judges metrics alone, in the order they are reported. A rule's name is also its
# [guards] sub-section in GuardsConfig below. `stalled` (process.py) is not here: it needs the clock and
# status.json, so only the doctor calls it; `ratio_outlier` (numerics.py) is judged per update only.
RULES: dict[str, RuleFn] = {
    "nonfinite": numerics.nonfinite,
    "grad_spike": numerics.grad_spike,
    "loss_spike": numerics.loss_spike,
    "exact_zero": numerics.exact_zero,
    "kl_blowup": numerics.kl_blowup,
    "mismatch": numerics.mismatch,
    "off_policy_ess": numerics.off_policy_ess,
    "entropy_collapse": policy.entropy_collapse,
    "entropy_explosion": policy.entropy_explosion,
    "reward_collapse": reward.reward_collapse,
    "reward_hacking": reward.reward_hacking,
    "eval_regression": reward.eval_regression,
    "no_signal": reward.no_signal,
    "length_explosion": policy.length_explosion,
    "length_collapse": policy.length_collapse,
    "truncation_surge": policy.truncation_surge,
    "repetition": policy.repetition,
    "throughput_drop": process.throughput_drop,
    "unscored_episodes": episode.unscored_episodes,
    "tool_error_surge": episode.tool_error_surge,
    "turn_budget": episode.turn_budget,
    "proposer_collapse": selfplay.proposer_collapse,
    "proposal_difficulty": selfplay.proposal_difficulty,
}
# Rules about one step: judged at every record when scanning (a windowed rule may be judged less often).
POINTWISE = ("nonfinite", "grad_spike", "loss_spike", "exact_zero", "unscored_episodes")
# Incidents the run can move past: `scan` reports a stretch of these that has ended one level lower.
TRANSIENT = ("nonfinite", "grad_spike", "loss_spike", "throughput_drop")


class GuardsConfig(BaseModel):
    """[guards]: one section per rule, plus how the trainer acts on findings (skips, rollbacks)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        True, description="Act on the rules during training (keelrl doctor reads them either way)."
    )
    skip_window: int = Field(
        20, ge=1, description="Steps over which skipped updates are counted for escalation."
    )
    max_skips_in_window: int = Field(
        5,
        ge=1,
        description="This many skipped updates within guards.skip_window steps escalates to a rollback.",
    )
    max_rollbacks: int = Field(
        3, ge=0, description="Rollbacks allowed per run; one more trouble after that stops the run."
    )
    rollback_lr_scale: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Multiply the learning rate by this at every rollback (1.0 = unchanged).",
    )
    ratio_outlier: numerics.RatioOutlierThresholds = section(numerics.RatioOutlierThresholds)
    # the rules, one section each, named as in RULES (stalled: doctor only)
    nonfinite: numerics.NonfiniteThresholds = section(numerics.NonfiniteThresholds)
    grad_spike: numerics.GradSpikeThresholds = section(numerics.GradSpikeThresholds)
    loss_spike: numerics.LossSpikeThresholds = section(numerics.LossSpikeThresholds)
    exact_zero: numerics.ExactZeroThresholds = section(numerics.ExactZeroThresholds)
    entropy_collapse: policy.EntropyCollapseThresholds = section(policy.EntropyCollapseThresholds)
    entropy_explosion: policy.EntropyExplosionThresholds = section(policy.EntropyExplosionThresholds)
    kl_blowup: numerics.KlBlowupThresholds = section(numerics.KlBlowupThresholds)
    mismatch: numerics.MismatchThresholds = section(numerics.MismatchThresholds)
    off_policy_ess: numerics.OffPolicyEssThresholds = section(numerics.OffPolicyEssThresholds)
    length_explosion: policy.LengthExplosionThresholds = section(policy.LengthExplosionThresholds)
    length_collapse: policy.LengthCollapseThresholds = section(policy.LengthCollapseThresholds)
    truncation_surge: policy.TruncationSurgeThresholds = section(policy.TruncationSurgeThresholds)
    repetition: policy.RepetitionThresholds = section(policy.RepetitionThresholds)
    reward_collapse: reward.RewardCollapseThresholds = section(reward.RewardCollapseThresholds)
    no_signal: reward.NoSignalThresholds = section(reward.NoSignalThresholds)
    reward_hacking: reward.RewardHackingThresholds = section(reward.RewardHackingThresholds)
    eval_regression: reward.EvalRegressionThresholds = section(reward.EvalRegressionThresholds)
    throughput_drop: process.ThroughputDropThresholds = section(process.ThroughputDropThresholds)
    stalled: process.StalledThresholds = section(process.StalledThresholds)
    unscored_episodes: episode.UnscoredEpisodesThresholds = section(episode.UnscoredEpisodesThresholds)
    tool_error_surge: episode.ToolErrorSurgeThresholds = section(episode.ToolErrorSurgeThresholds)
    turn_budget: episode.TurnBudgetThresholds = section(episode.TurnBudgetThresholds)
    proposer_collapse: selfplay.ProposerCollapseThresholds = section(selfplay.ProposerCollapseThresholds)
    proposal_difficulty: selfplay.ProposalDifficultyThresholds = section(
        selfplay.ProposalDifficultyThresholds
    )
