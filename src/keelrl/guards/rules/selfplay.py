"""Rules about self-play's proposer (`train.stage = "selfplay"`; the metrics exist only there, so the rules
stay silent elsewhere): a proposer that collapses onto the same few problems (`proposer_collapse`), and new
problems that teach nothing because the solver solves all or none of them (`proposal_difficulty`: trivial,
or too hard or readable only by the proposer). Absolute Zero names these failure modes; the numbers are
judgment calls, said as such."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from keelrl.guards.base import Finding, Record, RuleThresholds, finding, mean_value, span, tail


class ProposerCollapseThresholds(RuleThresholds):
    """Valid proposals are mostly duplicates of problems already proposed (selfplay/duplicate_frac against
    selfplay/valid_frac): the proposer repeats itself and the buffer stops growing."""

    window: int = Field(10, ge=1, description="Steps averaged.")
    # Judgment: when four in five valid proposals repeat old problems, the proposer earns almost nothing
    # (duplicates are paid 0) and has stopped exploring; a healthy proposer's duplicates are occasional.
    warn_share: float = Field(
        0.8, gt=0.0, le=1.0, description="Duplicates' share of valid proposals that warns."
    )
    min_valid: float = Field(
        0.05, ge=0.0, le=1.0, description="Judged only when this share of proposals is valid."
    )


def proposer_collapse(history: Sequence[Record], t: ProposerCollapseThresholds) -> Finding | None:
    valid = tail(history, "selfplay/valid_frac", t.window)
    dup = tail(history, "selfplay/duplicate_frac", t.window)
    if len(valid) < t.window or len(dup) < t.window or (v := mean_value(valid)) < t.min_valid:
        return None
    if (share := mean_value(dup) / v) < t.warn_share:
        return None
    return finding(
        "proposer_collapse",
        "warning",
        span(valid),
        {"duplicate_share": share, "valid_frac": v},
        f"{share:.0%} of the valid proposals repeated problems already in the buffer (steps {valid[0][0]}-"
        f"{valid[-1][0]}): the proposer is collapsing onto the same few problems.",
        "Read the proposals in rollouts.jsonl.gz (info.proposal). More variety: a higher rollout.temperature, more "
        "selfplay.proposer_prompts (each starts from another seeded number), or a lower algo.lr.",
        t.action,
    )


class ProposalDifficultyThresholds(RuleThresholds):
    """The solver solves nearly every new problem (trivial proposals) or nearly none (too hard, or readable
    only by the proposer): either way learnability pays nothing (selfplay/new_solve_rate)."""

    window: int = Field(10, ge=1, description="Steps (with new problems) averaged.")
    # Judgment: learnability is 1 - s inside (0, 1); a mean solve rate past these bounds leaves almost no
    # problem in between, so the proposer's reward signal is gone.
    trivial_rate: float = Field(
        0.95, gt=0.0, le=1.0, description="Mean solve rate of new problems called trivial."
    )
    hopeless_rate: float = Field(0.05, ge=0.0, lt=1.0, description="Mean solve rate called too hard.")


def proposal_difficulty(history: Sequence[Record], t: ProposalDifficultyThresholds) -> Finding | None:
    cur = tail(history, "selfplay/new_solve_rate", t.window)
    if len(cur) < t.window:
        return None
    s = mean_value(cur)
    steps = f"steps {cur[0][0]}-{cur[-1][0]}"
    if s >= t.trivial_rate:
        message = f"The solver solved {s:.0%} of the new problems ({steps}): the proposals are trivial."
        fix = "The proposer is paid 0 for trivial problems; if it stays here, raise the task's ranges or lower algo.lr."
    elif s <= t.hopeless_rate:
        message = (
            f"The solver solved {s:.0%} of the new problems ({steps}): they are too hard for it, or only the "
            "proposer can read them."
        )
        fix = "Read the proposals (info.proposal in rollouts.jsonl.gz) and the solver's attempts on them."
    else:
        return None
    return finding("proposal_difficulty", "warning", span(cur), {"new_solve_rate": s}, message, fix, t.action)
