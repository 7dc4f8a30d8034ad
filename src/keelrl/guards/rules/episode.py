"""Rules about episodes: most of a step's episodes ending without a reward (`unscored_episodes`: a verifier or a
reward function that cannot run; every task), and, for multi-turn episodes (environments; the metrics exist only
for them, so these rules stay silent on single-turn runs), tool calls failing more and more
(`tool_error_surge`) and episodes that nearly all run out of turns (`turn_budget`). None of the numbers comes
from a paper: they are judgment calls, said as such."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from keelrl.guards.base import (
    ACTION_DOC,
    Action,
    Finding,
    Record,
    Rise,
    RuleThresholds,
    finding,
    mean_value,
    metric_value,
    span,
    step_of,
    tail,
)


class UnscoredEpisodesThresholds(RuleThresholds):
    """Most of a step's episodes ended without a reward (episode/error_frac: verifier errors, agent errors and
    timeouts over the batch); judged before the update, which is then not made."""

    action: Action = Field("stop", description=ACTION_DOC)
    # Judgment: a step whose episodes mostly could not be judged says more about the verifier (no network, a
    # missing program, a reward function that raises) than about the policy, and learning from the few that
    # could is learning from a biased sample.
    max_frac: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Critical when more than this share of a step's episodes has no reward.",
    )


def unscored_episodes(history: Sequence[Record], t: UnscoredEpisodesThresholds) -> Finding | None:
    cur = tail(history, "episode/error_frac", 1)
    if not cur or (frac := cur[0][1]) <= t.max_frac:
        return None
    step = cur[0][0]
    last = next((r for r in reversed(history) if step_of(r, -1) == step), {})
    counts = {
        k: v
        for k in ("verifier_errors", "agent_errors", "timeouts")
        if (v := metric_value(last, f"episode/{k}")) is not None and math.isfinite(v)
    }
    said = ", ".join(f"{int(v)} {k.replace('_', ' ')}" for k, v in counts.items() if v) or "no count recorded"
    return finding(
        "unscored_episodes",
        "critical",
        (step, step),
        {"error_frac": frac, **counts},
        f"{frac:.0%} of step {step}'s episodes ended without a reward ({said}), so no update was made from them.",
        "The errors are in events.jsonl (score_errors) and in rollouts.jsonl.gz (info.error). Run `keelrl tasks "
        "check` on a task set, or call the reward function on one row by hand: a verifier that needs the network "
        "or a program the sandbox lacks, or a reward function that raises, fails every episode alike.",
        t.action,
    )


class ToolErrorSurgeThresholds(RuleThresholds):
    """Tool calls fail more and more often (episode/tool_error_rate: errors / calls in a step)."""

    window: int = Field(5, ge=1, description="Steps averaged for the current tool error rate.")
    baseline_steps: int = Field(5, ge=1, description="First training steps averaged for the starting rate.")
    # Judgment: when half of the calls fail, the model is mostly talking to error messages; a policy
    # that learned to call its tools does not drift there (tests/unit/test_rules.py pins the behaviour).
    warn_rate: float = Field(0.5, gt=0.0, le=1.0, description="Tool error rate worth a warning.")
    critical_rate: float = Field(0.9, gt=0.0, le=1.0, description="Critical at this rate when it has risen.")
    min_rise: float = Field(0.2, ge=0.0, description="A surge must rise this much above the starting rate.")


# Most tool calls fail: a rise from the start is a warning or critical; a rate that was high from the start is
# info (the model never learned the call format).
tool_error_surge = Rise(
    name="tool_error_surge",
    key="episode/tool_error_rate",
    levels=("warn_rate", "critical_rate"),
    evidence="tool_error_rate",
    message="Failed tool calls rose from {start:.0%} to {now:.0%} of calls (steps {first}-{last}).",
    suggestion="Read the tool messages in rollouts.jsonl.gz (keelrl report shows transcripts): a changed call "
    "format, a tool that raises, or a sandbox failing. A policy drifting into malformed calls: lower algo.lr.",
    flat="{now:.0%} of tool calls failed (steps {first}-{last}), about as many as at the start ({start:.0%}).",
)


class TurnBudgetThresholds(RuleThresholds):
    """Episodes nearly always end by running out of turns (episode/end/turns)."""

    window: int = Field(5, ge=1, description="Steps averaged.")
    # Judgment: an episode cut at max_turns was never finished, so its reward says little; when nearly all
    # are cut, either the budget is too small for the task or the policy never says it is done.
    warn_frac: float = Field(0.9, gt=0.0, le=1.0, description="Fraction of episodes out of turns that warns.")


def turn_budget(history: Sequence[Record], t: TurnBudgetThresholds) -> Finding | None:
    cur = tail(history, "episode/end/turns", t.window)
    if len(cur) < t.window or (f := mean_value(cur)) < t.warn_frac:
        return None
    return finding(
        "turn_budget",
        "warning",
        span(cur),
        {"turns_frac": f},
        f"{f:.0%} of episodes ran out of turns (steps {cur[0][0]}-{cur[-1][0]}): they never finished.",
        "Raise episode.max_turns if the task needs more steps; if the model loops (the same tool call again and "
        "again in the transcripts), the environment should end such episodes or the prompt say how to finish.",
        t.action,
    )
