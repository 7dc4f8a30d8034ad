"""Rules on reward and accuracy: train reward collapsing, groups that carry no signal, reward hacking (train
reward up while the strict checker falls), held-out eval regression."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from keelrl.guards.base import (
    ACTION_DOC,
    MAX_LOOKBACK,
    Action,
    Finding,
    Record,
    RuleThresholds,
    finding,
    head,
    mean_value,
    metric_value,
    span,
    start_and_now,
    step_of,
    tail,
)


class RewardCollapseThresholds(RuleThresholds):
    """Train reward lost much of what it had gained."""

    action: Action = Field("rollback", description=ACTION_DOC)
    window: int = Field(10, ge=2, description="Steps in the rolling mean of reward/mean.")
    baseline_steps: int = Field(5, ge=1, description="First training steps averaged for the starting reward.")
    # REFERENCE: batch reward over B samples in [0, 1] has std <= 0.5/sqrt(B), 0.06 at B = 64 and 0.02 for
    # a 10-step mean. Measured: a healthy tiny run's 10-step mean never fell more than 0.009 below its best.
    min_gain: float = Field(
        0.1, gt=0.0, description="Only judged once the rolling reward has risen this much above its start."
    )
    lost_frac: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Warn when the rolling reward has lost this fraction of its best gain.",
    )
    # REFERENCE: collapse order is gap -> grad-norm spikes -> reward falls; back to the start = all lost.
    critical_frac: float = Field(
        1.0, gt=0.0, le=1.0, description="Critical when this fraction of the gain is lost."
    )


def reward_collapse(history: Sequence[Record], t: RewardCollapseThresholds) -> Finding | None:
    """The rolling train reward lost a large part of its best gain over the start."""
    base = head(history, "reward/mean", t.baseline_steps)
    series = tail(history, "reward/mean", MAX_LOOKBACK, limit=MAX_LOOKBACK)
    if len(base) < t.baseline_steps or len(series) < t.window + t.baseline_steps:
        return None
    r0 = mean_value(base)
    values = [v for _, v in series]
    run = sum(values[: t.window])
    best, best_end = run / t.window, t.window - 1
    for i in range(t.window, len(values)):
        run += values[i] - values[i - t.window]
        if run / t.window > best:
            best, best_end = run / t.window, i
    cur = sum(values[-t.window :]) / t.window
    gain = best - r0
    if gain < t.min_gain or (lost := (best - cur) / gain) < t.lost_frac:
        return None
    return finding(
        "reward_collapse",
        "critical" if lost >= t.critical_frac else "warning",
        (series[best_end][0], series[-1][0]),
        {"reward": cur, "best_reward": best, "start_reward": r0, "fraction_lost": lost},
        f"Train reward fell from its best {best:.3g} (step {series[best_end][0]}) to {cur:.3g}, losing {lost:.0%} "
        f"of its gain over the start ({r0:.3g}).",
        "Roll back to a checkpoint before the fall and lower algo.lr; look for grad_spike, kl_blowup or mismatch "
        "findings just before it (they usually come first).",
        t.action,
    )


class NoSignalThresholds(RuleThresholds):
    """Most groups have all-equal rewards, so they give no gradient."""

    # action stays "warn". REFERENCE (prototype): the lift came suddenly after ~225 flat steps: don't stop.
    # 5 steps: at 8+ groups per step the fraction moves in steps of 1/8 or less, and a run whose first steps
    # carry no signal at all should hear it early.
    window: int = Field(5, ge=1, description="Steps averaged for groups/no_signal_frac.")
    # REFERENCE: expected p^G + (1-p)^G (0.43 at G=8, p=0.9); > 80% was reported late in training.
    warn_frac: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="Warn when this fraction of groups has all-equal rewards (no gradient).",
    )
    # All groups equal = zero policy gradient: nothing is being learned.
    critical_frac: float = Field(
        0.99, gt=0.0, le=1.0, description="Critical at this fraction: almost no group carries any signal."
    )


def no_signal(history: Sequence[Record], t: NoSignalThresholds) -> Finding | None:
    """Fraction of groups whose rewards are all equal (no advantage, no gradient)."""
    cur = tail(history, "groups/no_signal_frac", t.window)
    if len(cur) < t.window or (f := mean_value(cur)) < t.warn_frac:
        return None
    ev, why = {"no_signal_frac": f}, ""
    if rew := tail(history, "reward/mean", t.window):
        ev["reward_mean"] = r = mean_value(rew)
        if r == 0:
            why = " (every rollout failed: the task is too hard for the policy)"
        else:
            why = f" (reward/mean {r:.3g}: solved, or the reward is too coarse to tell samples apart)"
    return finding(
        "no_signal",
        "critical" if f >= t.critical_frac else "warning",
        span(cur),
        ev,
        f"{f:.0%} of groups had all-equal rewards over steps {cur[0][0]}-{cur[-1][0]}{why}; those groups give no gradient.",
        "Enable the curriculum's no-signal filter (drop all-equal groups, sample near p = 0.5), raise "
        "rollout.group_size or rollout.temperature, or make task.params easier (or harder, if everything is solved).",
        t.action,
    )


Eval = tuple[int, int, float]  # (record index, step, eval/accuracy)


def _eval_drop(history: Sequence[Record], min_evals: int) -> tuple[Eval, list[Eval], float] | None:
    """(the best eval before the last `min_evals`, those last evals, how far the best of them is below it),
    over the evals in the last MAX_LOOKBACK records; None with fewer than `min_evals` + 1 evals."""
    evals = []
    for i in range(max(0, len(history) - MAX_LOOKBACK), len(history)):
        v = metric_value(history[i], "eval/accuracy")
        if v is not None and math.isfinite(v):
            evals.append((i, step_of(history[i], i), v))
    if len(evals) < min_evals + 1:
        return None
    best = max(evals[:-min_evals], key=lambda e: (e[2], e[0]))
    recent = evals[-min_evals:]
    return best, recent, best[2] - max(v for _, _, v in recent)


class RewardHackingThresholds(RuleThresholds):
    """Train reward rises while held-out accuracy (the strict checker) falls. With a learned reward
    (reward.model) the reward watched is the reward model's raw score, reward/model."""

    # action stays "warn": rolling back does not make a hackable reward safe; the checker must be fixed.
    # REFERENCE: seed std is 5-15 points and a 200-problem eval at p = 0.5 has a standard error of 0.035
    # (0.05 for a difference), so a 0.1 drop is ~2 standard errors; format-only rewards alone gave +16 points.
    min_accuracy_drop: float = Field(
        0.1, gt=0.0, description="Held-out eval/accuracy must fall this much below its best."
    )
    min_reward_rise: float = Field(
        0.1, gt=0.0, description="Train reward/mean must rise this much over the same span."
    )
    window: int = Field(
        10,
        ge=1,
        description="Training steps averaged for the reward near each eval (and for train accuracy when there is no eval).",
    )
    # REFERENCE (prototype): a scorer that checked the expression but not the stated value was hacked
    # within ~50 steps; two evals below the best keep one noisy eval from firing.
    min_evals: int = Field(2, ge=1, description="Consecutive evals below the best before firing.")
    # REFERENCE: a 10-step mean of batch reward (B = 64) has noise ~0.5/sqrt(640) = 0.02.
    reward_tolerance: float = Field(
        0.02,
        ge=0.0,
        description="Reward now may sit this far below its level at the best eval and still count as held.",
    )


FIX_LEARNED = (
    "Read the rollouts the reward model scores highest (keelrl doctor quotes some): it rewards something people "
    "did not mean (length, a phrase). Retrain it with pairs that separate that feature from quality, add the "
    "verifier's reward (reward.verifier_weight), or stop at the checkpoint of the best eval."
)


def reward_hacking(history: Sequence[Record], t: RewardHackingThresholds) -> Finding | None:
    """Train reward up (above its start, not below its level at the best eval) while eval/accuracy has been
    below its best for `min_evals` evals; without enough evals, train accuracy stands in. The reward is the
    learned one (reward/model) when the run has one: the verifier's part of the reward may be what falls."""
    learned = bool(history) and metric_value(history[-1], "reward/model") is not None
    key, what = (
        ("reward/model", "The learned reward (reward/model)") if learned else ("reward/mean", "Train reward")
    )
    if (got := start_and_now(history, key, t.window, t.window)) is None:
        return None
    r0, r_now, _ = got
    if r_now - r0 < t.min_reward_rise:
        return None
    if (evals := _eval_drop(history, t.min_evals)) is not None:
        best, recent, drop = evals
        near = tail(history[: best[0] + 1], key, t.window)  # train reward up to the best eval
        # the best eval before any training (step 0): the reward's start is its level there (measured: a
        # learned length reward exploited from the first steps was missed while the best eval was step 0's)
        r_best = mean_value(near) if near else r0
        if drop < t.min_accuracy_drop or r_now < r_best - t.reward_tolerance:
            return None
        return finding(
            "reward_hacking",
            "critical",
            (best[1], recent[-1][1]),
            {
                "eval_accuracy_best": best[2],
                "eval_accuracy": recent[-1][2],
                "reward_start": r0,
                "reward_at_best_eval": r_best,
                "reward_now": r_now,
            },
            f"{what} rose from {r0:.3g} to {r_now:.3g} and held, while held-out eval accuracy fell from "
            f"{best[2]:.3g} (step {best[1]}) to {recent[-1][2]:.3g} (step {recent[-1][1]}): the policy is learning "
            "the reward, not the task.",
            FIX_LEARNED
            if learned
            else "Read the high-reward rollouts (keelrl doctor quotes some) and fix the task's "
            "scorer; lower format credit; keep the checkpoint of the best eval (checkpoint.best_metric = "
            "'eval/accuracy').",
            t.action,
        )
    acc0, acc = head(history, "accuracy", t.window), tail(history, "accuracy", t.window)
    if len(acc0) < t.window or len(acc) < t.window or acc[0][0] <= acc0[-1][0]:
        return None
    a0, a = mean_value(acc0), mean_value(acc)
    if a0 - a < t.min_accuracy_drop:
        return None
    return finding(
        "reward_hacking",
        "critical",
        (acc0[0][0], acc[-1][0]),
        {"accuracy_start": a0, "accuracy": a, "reward_start": r0, "reward_now": r_now},
        f"{what} rose from {r0:.3g} to {r_now:.3g} while strict accuracy on the same samples fell from "
        f"{a0:.3g} to {a:.3g}: the policy is learning the reward, not the task.",
        FIX_LEARNED
        if learned
        else "Read the high-reward rollouts and fix the task's scorer; lower format "
        "credit; turn on held-out eval (eval.every_steps) to confirm.",
        t.action,
    )


class EvalRegressionThresholds(RuleThresholds):
    """Held-out eval/accuracy fell below the run's best."""

    # The action applies at critical severity (half the best accuracy gone); a smaller drop only warns.
    action: Action = Field("rollback", description=ACTION_DOC)
    # Same noise argument as reward_hacking: 0.1 is ~2 standard errors of a 200-problem eval difference.
    min_drop: float = Field(
        0.1, gt=0.0, description="eval/accuracy must fall this much below the run's best eval."
    )
    min_evals: int = Field(2, ge=1, description="Consecutive evals below the best before firing.")
    # Measured: the demo at algo.lr = 3e-3 fell from 0.35 to 0.0 after one update; at 1e-3 it wobbled from
    # 0.73 to 0.49 (a third lost: a warning). Losing half is far outside eval noise at any accuracy >= 0.2.
    critical_frac: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Critical when the recent evals all lost at least this fraction of the best eval accuracy.",
    )


def eval_regression(history: Sequence[Record], t: EvalRegressionThresholds) -> Finding | None:
    """The last `min_evals` evals all fell `min_drop` below the best earlier eval."""
    if (evals := _eval_drop(history, t.min_evals)) is None:
        return None
    best, latest, drop = evals
    if drop < t.min_drop:
        return None
    # the trouble began after the best eval: its checkpoint is a good target
    return finding(
        "eval_regression",
        "critical" if drop >= t.critical_frac * best[2] else "warning",
        (best[1] + 1, latest[-1][1]),
        {"eval_accuracy_best": best[2], "eval_accuracy": latest[-1][2], "drop": best[2] - latest[-1][2]},
        f"Held-out eval accuracy fell from its best {best[2]:.3g} (step {best[1]}) to {latest[-1][2]:.3g} "
        f"(step {latest[-1][1]}) and stayed below for {t.min_evals} evals.",
        "A collapse right after the first updates means algo.lr is far too high (guards.rollback_lr_scale "
        "lowers it at each rollback). Keep the best checkpoint (checkpoint.keep_best, best_metric = "
        "'eval/accuracy'); see reward_hacking and entropy_collapse for why.",
        t.action,
    )
