"""Guards: divergence rules over a run's metrics (this part), and the per-step actions taken on them.

One implementation serves two readers: the trainer calls `check(history, cfg)` every step on the run's
metric records so far and acts on what it returns; `keelrl doctor` calls `scan(history, cfg)` on a
finished or running run's metrics.jsonl to get the same findings with the step ranges where they held.

A rule is a pure function `rule(history, thresholds) -> Finding | None` that judges the *latest* window
of `history` (metric records as written to metrics.jsonl, in step order: missing keys, eval-only
records and "nan"/"inf" strings are all tolerated). Each rule's thresholds are a pydantic model whose
fields say where each default comes from (REFERENCE.md facts, or a measurement on this machine:
docs/doctor.md says how those were made). `GuardsConfig` holds one of each, mounted as `[guards]`.

Severity and action: a rule reports "info" (worth knowing, no action), "warning" (logged) or
"critical". Only a critical finding carries the rule's configured `action` (warn / skip / rollback /
stop); warnings and infos always carry "warn". The trainer decides what a skip or rollback means.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field

# ============================================================================================== RULES

Severity = Literal["info", "warning", "critical"]
Action = Literal["warn", "skip", "rollback", "stop"]
Record = Mapping[str, Any]

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}
ACTION_RANK: dict[str, int] = {"warn": 0, "skip": 1, "rollback": 2, "stop": 3}

# Records a rule looks back over at most (rules needing "the best so far", e.g. reward_collapse). Bounds the
# cost of one call on a very long run; 5,000 steps is longer than any eval interval or collapse we know of.
MAX_LOOKBACK = 5000

TRAIN_KEYS = ("loss/total", "loss/policy", "grad_norm", "reward/mean")
RUNNING_STATES = ("running", "restarting")  # status.json states of a run that should still be writing


@dataclass(frozen=True)
class Finding:
    """One diagnosis. `steps` is (first, last) step the evidence covers; `evidence` holds numbers only;
    `action` is what the live trainer should do (the rule's configured action when critical, else "warn");
    `samples` are quoted rollouts the doctor attaches; `ongoing` is set by `scan` when the finding still
    holds at the last record."""

    name: str
    severity: Severity
    steps: tuple[int, int]
    evidence: dict[str, float]
    message: str
    suggestion: str
    action: Action = "warn"
    samples: tuple[str, ...] = ()
    ongoing: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "severity": self.severity,
            "steps": list(self.steps),
            "evidence": {k: _json_number(v) for k, v in self.evidence.items()},
            "message": self.message,
            "suggestion": self.suggestion,
            "action": self.action,
            "samples": list(self.samples),
            "ongoing": self.ongoing,
        }


def _json_number(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


# -------------------------------------------------------------------------------------- reading records


def metric_value(record: Record, key: str) -> float | None:
    """The record's value for `key` as a float; None when missing or not a number. The strings
    "nan", "inf", "-inf" (how run_dir writes non-finite values) become the float they name."""
    v = record.get(key)
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)  # accepts "nan", "inf", "-inf", "Infinity"
        except ValueError:
            return None
    return None


def _step(record: Record, default: int) -> int:
    s = record.get("step")
    return int(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else default


def is_train_record(record: Record) -> bool:
    """A record of a training step (not an eval-only record such as step 0's initial eval)."""
    return any(k in record for k in TRAIN_KEYS)


def tail(history: Sequence[Record], key: str, n: int, limit: int | None = None) -> list[tuple[int, float]]:
    """The last `n` finite (step, value) pairs of `key`, oldest first, looking back at most `limit`
    records (default 4n + 20, so a key that is never logged costs little)."""
    limit = 4 * n + 20 if limit is None else limit
    out: list[tuple[int, float]] = []
    stop = max(-1, len(history) - 1 - limit)
    for i in range(len(history) - 1, stop, -1):
        v = metric_value(history[i], key)
        if v is not None and math.isfinite(v):
            out.append((_step(history[i], i), v))
            if len(out) == n:
                break
    out.reverse()
    return out


def head(history: Sequence[Record], key: str, n: int, limit: int | None = None) -> list[tuple[int, float]]:
    """The first `n` finite (step, value) pairs of `key` (a run's starting level), looking at most
    `limit` records in (default 4n + 20)."""
    limit = 4 * n + 20 if limit is None else limit
    out: list[tuple[int, float]] = []
    for i in range(min(len(history), limit)):
        v = metric_value(history[i], key)
        if v is not None and math.isfinite(v):
            out.append((_step(history[i], i), v))
            if len(out) == n:
                break
    return out


def _mean(pairs: Sequence[tuple[int, float]]) -> float:
    return sum(v for _, v in pairs) / len(pairs)


def _span(pairs: Sequence[tuple[int, float]]) -> tuple[int, int]:
    return (pairs[0][0], pairs[-1][0])


def robust_z(value: float, window: Sequence[float]) -> float:
    """(value - median) / (1.4826 * MAD) of `window`: a z-score that a few outliers in the window do not
    inflate. 1.4826 makes the MAD estimate the standard deviation of normal data. A zero MAD (a constant
    window) is floored at 1e-3 of the median so that exact repeats do not give infinite scores."""
    med = statistics.median(window)
    mad = statistics.median(abs(x - med) for x in window)
    scale = 1.4826 * max(mad, 1e-3 * abs(med), 1e-12)
    return (value - med) / scale


def _r(x: float, digits: int = 4) -> float:
    """Round for evidence: 4 significant digits."""
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))


# ---------------------------------------------------------------------------------- thresholds (config)

ACTION_DOC = (
    "What the trainer does when this rule reports a critical finding: warn (log an event), skip (drop this "
    "step's update), rollback (return to the newest healthy checkpoint), stop (end the run). Warnings are "
    "only logged."
)


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(True, description="Evaluate this rule (live in the trainer and in keelrl doctor).")


class NonfiniteThresholds(_Rule):
    # A NaN/inf loss or gradient poisons the weights on the next optimizer step; there is no safe level.
    action: Action = Field("skip", description=ACTION_DOC)


class GradSpikeThresholds(_Rule):
    action: Action = Field("skip", description=ACTION_DOC)
    # 20 steps: long enough for a stable median, short enough to follow a decaying grad norm.
    window: int = Field(20, ge=5, description="Preceding steps the latest grad_norm is compared with.")
    # Measured (docs/doctor.md, dense-reward tiny run, lr 3e-4, 300 steps): the largest robust z of a
    # healthy step against its 20 predecessors was 4.4, so 6 leaves margin; PaLM's loss spikes were
    # rare, large events (~20 in a whole 540B run), not the tail of normal noise.
    z: float = Field(
        6.0, gt=0.0, description="Robust z-score (median/MAD of the window) above which grad_norm is a spike."
    )
    # Measured on the same run: the largest healthy grad_norm / window median was 1.37.
    min_ratio: float = Field(
        2.0, ge=1.0, description="A spike must also be at least this many times the window median."
    )


class ExactZeroThresholds(_Rule):
    action: Action = Field("stop", description=ACTION_DOC)
    # REFERENCE: a broken weight sync gave reward, loss and grad-norm of exactly 0.0 every step. One exact
    # zero happens when every group of a step has equal rewards; with varying rewards (e.g. 8 groups of 4
    # at p = 0.9, each all-equal with probability 0.66) three such steps in a row has odds ~4e-5.
    min_steps: int = Field(
        3, ge=1, description="Consecutive training steps with loss and grad_norm exactly 0.0."
    )


class EntropyCollapseThresholds(_Rule):
    # Collapse is gradual and rolling back usually replays it; lowering lr is the user's call.
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(10, ge=1, description="Steps averaged for the current entropy.")
    baseline_steps: int = Field(
        5, ge=1, description="First training steps averaged for the starting entropy."
    )
    # REFERENCE (arXiv 2505.22617): R ~ -a*exp(H) + b, most of the entropy drop happens early and coverage
    # narrows. Measured here (docs/doctor.md): at lr 3e-3 the tiny policy fell to 6% of its starting
    # entropy by step 150, writing "2222..." with eval accuracy halved; at lr 3e-4 it kept 52% after 300.
    warn_frac: float = Field(
        0.25, gt=0.0, lt=1.0, description="Warn when entropy falls below this fraction of its starting value."
    )
    critical_frac: float = Field(
        0.1, gt=0.0, lt=1.0, description="Critical below this fraction of the starting entropy."
    )


class EntropyExplosionThresholds(_Rule):
    action: Action = Field("rollback", description=ACTION_DOC)
    window: int = Field(5, ge=1, description="Steps averaged for the current entropy.")
    baseline_steps: int = Field(
        5, ge=1, description="First training steps averaged for the starting entropy."
    )
    # REFERENCE (a DeepCoder maintainer): rising entropy is fine while < 1 nat/token; a run at 2.0 degraded.
    warn_nats: float = Field(
        1.0, gt=0.0, description="Warn when mean token entropy (nats) exceeds this and has risen."
    )
    critical_nats: float = Field(
        2.0, gt=0.0, description="Critical when mean token entropy (nats) exceeds this and has risen."
    )
    # A random-init model starts near ln(vocab) (4.56 nats on the smoke model, measured) and must not
    # fire for merely staying there: the entropy must also have risen by this much since the start.
    min_rise: float = Field(
        0.5, ge=0.0, description="Entropy must also be this many nats above its starting value."
    )


class KlBlowupThresholds(_Rule):
    action: Action = Field("rollback", description=ACTION_DOC)
    window: int = Field(5, ge=1, description="Steps averaged for the current KL.")
    # kl/old is the k3 KL between the sampling policy and the one being updated. Inside PPO's trust region
    # (clip 0.2) |log r| <= ln 1.2 = 0.18 per token, i.e. k3 ~ 0.5 * 0.18^2 = 0.017; REFERENCE: veRL warns
    # on a sampler/trainer KL above 0.1. Above 0.1 the average token is well outside the trust region.
    max_kl_old: float = Field(
        0.1, gt=0.0, description="Critical when the mean kl/old (policy moved within a step) exceeds this."
    )
    # kl/ref grows slowly as the policy learns; a blow-up is a jump. Heuristic, no field number known:
    # 10x the preceding level within `window` steps is a discontinuity, not drift.
    ref_jump: float = Field(
        10.0,
        gt=1.0,
        description="Critical when the mean kl/ref jumps to this many times its preceding median.",
    )
    ref_history: int = Field(
        20, ge=2, description="Steps before the window whose median kl/ref is the preceding level."
    )
    # REFERENCE: healthy sampler/trainer KL is 4e-4 to 1e-2; a tenfold jump that stays below 0.01 is
    # still inside what healthy runs show.
    ref_floor: float = Field(0.01, ge=0.0, description="kl/ref must also exceed this to count as a blow-up.")


class MismatchThresholds(_Rule):
    # Rolling back cannot repair a sampler that disagrees with the trainer; truncated IS (algo.tis_cap) can.
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(5, ge=1, description="Steps averaged for the sampler/trainer gap (mismatch/kl).")
    # REFERENCE: healthy dense runs show sampler/trainer KL 4e-4 to 1e-2; veRL warns above 0.1.
    warn_kl: float = Field(
        0.01, gt=0.0, description="Warn when mean mismatch/kl exceeds this (upper end of healthy runs)."
    )
    critical_kl: float = Field(
        0.1, gt=0.0, description="Critical when mean mismatch/kl exceeds this (veRL's warning level)."
    )


class LengthExplosionThresholds(_Rule):
    # Longer answers are how TinyZero learned search: only a warning unless accuracy is not improving.
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(10, ge=1, description="Steps averaged for the current response length.")
    baseline_steps: int = Field(5, ge=1, description="First training steps averaged for the starting length.")
    # Heuristic: doubling is the smallest change a reader would call an explosion. REFERENCE (Dr. GRPO,
    # arXiv 2503.20783): per-response length normalisation favours longer *wrong* answers, so growth
    # without accuracy gain is the biased kind.
    factor: float = Field(
        2.0, gt=1.0, description="Fires when mean response length reaches this multiple of its start."
    )
    # REFERENCE: batch accuracy over B samples has std <= 0.5/sqrt(B) (0.06 at B = 64); 0.05 over a
    # 10-step mean is well above that noise.
    min_accuracy_gain: float = Field(
        0.05, ge=0.0, description="Only fires while accuracy has gained less than this since the start."
    )


class LengthCollapseThresholds(_Rule):
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(10, ge=1, description="Steps averaged for the current response length.")
    baseline_steps: int = Field(5, ge=1, description="First training steps averaged for the starting length.")
    # REFERENCE (TinyZero): the 0.5B model "guesses and stops". Heuristic: below 30% of the starting length
    # the model has dropped most of its reasoning.
    frac: float = Field(
        0.3,
        gt=0.0,
        lt=1.0,
        description="Warn when mean response length falls below this fraction of its start.",
    )
    # No shipped task's answer block fits in fewer than 2 tokens ("</answer>" alone is 9 characters).
    critical_tokens: float = Field(
        2.0, ge=0.0, description="Critical when mean response length falls below this many tokens."
    )


class TruncationSurgeThresholds(_Rule):
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(10, ge=1, description="Steps averaged for the current truncated fraction.")
    baseline_steps: int = Field(
        5, ge=1, description="First training steps averaged for the starting truncated fraction."
    )
    # REFERENCE (TinyZero reward): no <answer> gives 0, so a truncated completion carries no answer; at a
    # truncated fraction f at most 1 - f of the batch can be right, and DAPO filters/shapes overlong samples
    # because they inject reward noise. Above one half, most of the batch is cut off.
    warn_frac: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Fraction of completions cut at rollout.max_new_tokens that is worth a warning.",
    )
    critical_frac: float = Field(
        0.9, gt=0.0, le=1.0, description="Critical when this fraction is truncated and it has risen."
    )
    # Measured: the smoke model (random init) starts at 0.84 truncated; a high level that has not risen is
    # reported as info (raise rollout.max_new_tokens) rather than as a surge.
    min_rise: float = Field(
        0.2, ge=0.0, description="A surge must rise at least this much above the starting fraction."
    )


class RepetitionThresholds(_Rule):
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(
        5, ge=1, description="Steps averaged for the current repetitive fraction (repetition/frac)."
    )
    baseline_steps: int = Field(
        5, ge=1, description="First training steps averaged for the starting fraction."
    )
    # Measured: healthy tiny runs log repetition/frac 0.0 throughout; the collapsing lr 3e-3 run went
    # 0.0 -> 0.5 -> 1.0 between steps 80 and 100. REFERENCE: MiniMax-M1 had to cut generation after
    # 3,000 near-certain tokens in a row. repetition/frac counts completions whose 4-grams repeat > 50%.
    warn_frac: float = Field(
        0.2, gt=0.0, le=1.0, description="Warn when this fraction of completions is repetitive."
    )
    critical_frac: float = Field(
        0.5, gt=0.0, le=1.0, description="Critical when this fraction of completions is repetitive."
    )
    min_rise: float = Field(
        0.1, ge=0.0, description="The fraction must also have risen this much since the start."
    )


class RewardCollapseThresholds(_Rule):
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


class NoSignalThresholds(_Rule):
    # REFERENCE (prototype): the lift appeared suddenly after ~225 steps of nothing; stopping would have
    # killed it, so only warn.
    action: Action = Field("warn", description=ACTION_DOC)
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


class RewardHackingThresholds(_Rule):
    # Rolling back does not make a hackable reward safe; the user has to fix the checker.
    action: Action = Field("warn", description=ACTION_DOC)
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


class EvalRegressionThresholds(_Rule):
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


class ThroughputDropThresholds(_Rule):
    action: Action = Field("warn", description=ACTION_DOC)
    window: int = Field(
        20, ge=1, description="Steps whose median throughput/tokens_per_s is the current level."
    )
    reference: int = Field(50, ge=5, description="Steps before the window whose median is the earlier level.")
    # Heuristic: halving is a drop worth a look. Measured: on this shared 2-core machine, contention from
    # other jobs alone pushed a 20-step median to 0.14 of the earlier level, so the rule fires there too
    # (truthfully; the message says to check for contention).
    min_ratio: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Fires when current throughput falls below this fraction of the earlier level.",
    )


class StalledThresholds(_Rule):
    action: Action = Field("warn", description=ACTION_DOC)
    # Measured: the longest healthy gap between metric lines was 9.9x the median of the recent gaps (eval
    # steps and CPU contention included), so 20x leaves margin.
    factor: float = Field(
        20.0,
        gt=1.0,
        description="Stalled when silent for this many times the recent median gap between steps.",
    )
    min_seconds: float = Field(120.0, ge=0.0, description="And silent for at least this many seconds.")


class RatioOutlierThresholds(_Rule):
    action: Action = Field("skip", description=ACTION_DOC)
    # PPO's clip range (0.2) means ratios past 1.2 already carry no gradient; a token whose probability moved
    # 10x (2.3 nats) between sampling and this update is far outside any trust region. veRL warns when
    # importance weights leave [0.5, 2] on average (REFERENCE.md); 10 is for a single token's maximum.
    max_ratio: float = Field(
        10.0, gt=1.0, description="Skip an update whose largest per-token ratio pi/pi_old exceeds this."
    )


class GuardsConfig(BaseModel):
    """[guards]: one section per rule, each with `enabled`, `action` and its thresholds, plus how the
    trainer acts on them (skips, rollbacks)."""

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
    ratio_outlier: RatioOutlierThresholds = Field(
        default_factory=RatioOutlierThresholds,
        description="Per-step guard: an importance ratio far outside the trust region.",
    )

    nonfinite: NonfiniteThresholds = Field(
        default_factory=NonfiniteThresholds,
        description="A loss, gradient or other metric is NaN or infinite, or the trainer skipped a non-finite update.",
    )
    grad_spike: GradSpikeThresholds = Field(
        default_factory=GradSpikeThresholds,
        description="grad_norm far above its recent median (robust z-score).",
    )
    exact_zero: ExactZeroThresholds = Field(
        default_factory=ExactZeroThresholds,
        description="Loss and grad_norm exactly 0.0 for several steps while training.",
    )
    entropy_collapse: EntropyCollapseThresholds = Field(
        default_factory=EntropyCollapseThresholds,
        description="Token entropy fell to a small fraction of its start.",
    )
    entropy_explosion: EntropyExplosionThresholds = Field(
        default_factory=EntropyExplosionThresholds,
        description="Token entropy rose past the levels where runs degrade.",
    )
    kl_blowup: KlBlowupThresholds = Field(
        default_factory=KlBlowupThresholds,
        description="The policy moves far within a step (kl/old) or jumps away from the reference (kl/ref).",
    )
    mismatch: MismatchThresholds = Field(
        default_factory=MismatchThresholds,
        description="Sampler and trainer log-probs disagree (mismatch/kl).",
    )
    length_explosion: LengthExplosionThresholds = Field(
        default_factory=LengthExplosionThresholds,
        description="Responses grew several-fold without accuracy gains.",
    )
    length_collapse: LengthCollapseThresholds = Field(
        default_factory=LengthCollapseThresholds, description="Responses shrank to a fraction of their start."
    )
    truncation_surge: TruncationSurgeThresholds = Field(
        default_factory=TruncationSurgeThresholds,
        description="Many completions are cut at rollout.max_new_tokens.",
    )
    repetition: RepetitionThresholds = Field(
        default_factory=RepetitionThresholds,
        description="Many completions repeat themselves (repetition/frac).",
    )
    reward_collapse: RewardCollapseThresholds = Field(
        default_factory=RewardCollapseThresholds, description="Train reward lost much of what it had gained."
    )
    no_signal: NoSignalThresholds = Field(
        default_factory=NoSignalThresholds,
        description="Most groups have all-equal rewards, so they give no gradient.",
    )
    reward_hacking: RewardHackingThresholds = Field(
        default_factory=RewardHackingThresholds,
        description="Train reward rises while held-out accuracy (the strict checker) falls.",
    )
    eval_regression: EvalRegressionThresholds = Field(
        default_factory=EvalRegressionThresholds,
        description="Held-out eval/accuracy fell below the run's best.",
    )
    throughput_drop: ThroughputDropThresholds = Field(
        default_factory=ThroughputDropThresholds,
        description="Tokens per second fell well below the run's earlier level.",
    )
    stalled: StalledThresholds = Field(
        default_factory=StalledThresholds,
        description="A running run has written no metrics for far longer than a step takes (doctor only).",
    )


def _finding(
    name: str,
    severity: Severity,
    steps: tuple[int, int],
    evidence: dict[str, float],
    message: str,
    suggestion: str,
    action: Action,
) -> Finding:
    return Finding(
        name=name,
        severity=severity,
        steps=steps,
        evidence={k: _r(float(v)) for k, v in evidence.items()},
        message=message,
        suggestion=suggestion,
        action=action if severity == "critical" else "warn",
    )


# ------------------------------------------------------------------------------------------- the rules


def nonfinite(history: Sequence[Record], t: NonfiniteThresholds) -> Finding | None:
    """The latest record holds a NaN/inf value, or says the trainer dropped a non-finite update."""
    if not history:
        return None
    rec = history[-1]
    step = _step(rec, len(history) - 1)
    bad = []
    for key in rec:
        if key in ("step", "time"):
            continue
        v = metric_value(rec, key)
        if v is not None and not math.isfinite(v):
            bad.append(key)
    skipped = metric_value(rec, "guard/nonfinite_updates") or 0.0
    if not bad and not (math.isfinite(skipped) and skipped > 0):
        return None
    what = ", ".join(sorted(bad)) if bad else "the gradient (the update was dropped)"
    return _finding(
        "nonfinite",
        "critical",
        (step, step),
        {"nonfinite_metrics": len(bad), "nonfinite_updates": skipped if math.isfinite(skipped) else 0.0},
        f"Non-finite values at step {step}: {what}.",
        "Lower algo.lr, keep algo.grad_clip > 0, and check the reward for inf/NaN; with model.dtype = "
        "'bfloat16' try float32.",
        t.action,
    )


def grad_spike(history: Sequence[Record], t: GradSpikeThresholds) -> Finding | None:
    """The latest grad_norm against the `window` before it. For a check before the optimizer step, append
    a record {"step": s, "grad_norm": g} to the history first."""
    if not history:
        return None
    g = metric_value(history[-1], "grad_norm")
    if g is None or not math.isfinite(g):
        return None
    prev = tail(history[:-1], "grad_norm", t.window)
    if len(prev) < max(5, t.window // 2):
        return None
    values = [v for _, v in prev]
    med = statistics.median(values)
    if med <= 0:
        return None
    z = robust_z(g, values)
    ratio = g / med
    if z < t.z or ratio < t.min_ratio:
        return None
    step = _step(history[-1], len(history) - 1)
    return _finding(
        "grad_spike",
        "critical",
        (step, step),
        {"grad_norm": g, "window_median": med, "robust_z": z, "ratio": ratio},
        f"grad_norm {g:.3g} at step {step} is {ratio:.1f}x the median of the previous {len(values)} steps "
        f"(robust z {z:.1f}).",
        "A single spike is usually one bad batch (skipping it is what PaLM did); repeated spikes mean lower "
        "algo.lr or a tighter algo.grad_clip, and check mismatch/kl first (the gap often grows before spikes).",
        t.action,
    )


def _is_zero_step(rec: Record) -> bool:
    loss = metric_value(rec, "loss/total")
    loss = metric_value(rec, "loss/policy") if loss is None else loss
    lr = metric_value(rec, "lr")
    return loss == 0.0 and metric_value(rec, "grad_norm") == 0.0 and (lr is None or lr > 0)


def exact_zero(history: Sequence[Record], t: ExactZeroThresholds) -> Finding | None:
    """loss and grad_norm exactly 0.0 for `min_steps` training steps in a row (lr > 0), counting the whole
    stretch back to where it began (at most MAX_LOOKBACK records)."""
    recs: list[Record] = []
    for i in range(len(history) - 1, max(-1, len(history) - 1 - MAX_LOOKBACK), -1):
        rec = history[i]
        if not is_train_record(rec):
            continue
        if not _is_zero_step(rec):
            break
        recs.append(rec)
    if len(recs) < t.min_steps:
        return None
    recs.reverse()
    steps = (_step(recs[0], 0), _step(recs[-1], 0))
    no_signal = [metric_value(r, "groups/no_signal_frac") for r in recs]
    rewards = [metric_value(r, "reward/mean") for r in recs]
    stds = [metric_value(r, "reward/std") for r in recs]
    evidence = {"zero_steps": float(len(recs))}
    if all(v is not None for v in no_signal):
        evidence["no_signal_frac"] = min(v for v in no_signal if v is not None)
    if all(v is not None for v in rewards):
        evidence["reward_mean"] = max(abs(v) for v in rewards if v is not None)
    has_signal = ("no_signal_frac" in evidence and evidence["no_signal_frac"] < 1.0) or (
        "no_signal_frac" not in evidence and any(s is not None and s > 0 for s in stds)
    )
    n = len(recs)
    if has_signal:
        severity: Severity = "critical"
        msg = (
            f"loss and grad_norm are exactly 0.0 for {n} steps although rewards vary within groups: "
            "the update is disconnected from the rollouts."
        )
        sug = (
            "Check that the trainer's weights reach the sampler, that advantages are not masked away, and that the "
            "loss is not detached."
        )
    elif evidence.get("reward_mean") == 0.0:
        severity = "warning"
        msg = (
            f"reward, loss and grad_norm are exactly 0.0 for {n} steps. Either no rollout earns any reward "
            "(see no_signal) or the pipeline is broken: a failed weight sync once looked exactly like this."
        )
        sug = (
            "Read a few rollouts (keelrl doctor prints some): if they are sensible, check the weight sync and the "
            "scorer; if not, the task is too hard for the policy (task.params, rollout.group_size, rollout.temperature)."
        )
    else:
        severity = "info"
        msg = (
            f"loss and grad_norm are exactly 0.0 for {n} steps because every group's rewards are equal "
            "(no gradient to follow)."
        )
        sug = "See no_signal: harder or more varied problems, or a larger rollout.group_size."
    return _finding("exact_zero", severity, steps, evidence, msg, sug, t.action)


def entropy_collapse(history: Sequence[Record], t: EntropyCollapseThresholds) -> Finding | None:
    """Mean entropy of the last `window` steps below a fraction of the starting entropy."""
    base = head(history, "entropy", t.baseline_steps)
    cur = tail(history, "entropy", t.window)
    if len(base) < t.baseline_steps or len(cur) < t.window or cur[0][0] <= base[-1][0]:
        return None
    h0, h = _mean(base), _mean(cur)
    if h0 <= 0:
        return None
    frac = h / h0
    if frac >= t.warn_frac:
        return None
    severity: Severity = "critical" if frac < t.critical_frac else "warning"
    return _finding(
        "entropy_collapse",
        severity,
        _span(cur),
        {"entropy": h, "start_entropy": h0, "fraction_left": frac},
        f"Token entropy is {h:.3g} nats over steps {cur[0][0]}-{cur[-1][0]}, {frac:.0%} of its starting {h0:.3g}: "
        "the policy is close to deterministic and has little left to explore with.",
        "Lower algo.lr, raise algo.clip_high (DAPO's clip-higher uses 0.28), add a small algo.entropy_coef "
        "(TinyZero used 0.001), or raise rollout.temperature.",
        t.action,
    )


def entropy_explosion(history: Sequence[Record], t: EntropyExplosionThresholds) -> Finding | None:
    """Mean entropy of the last `window` steps above an absolute level and risen since the start."""
    base = head(history, "entropy", t.baseline_steps)
    cur = tail(history, "entropy", t.window)
    if len(base) < t.baseline_steps or len(cur) < t.window or cur[0][0] <= base[-1][0]:
        return None
    h0, h = _mean(base), _mean(cur)
    if h < t.warn_nats or h - h0 < t.min_rise:
        return None
    severity: Severity = "critical" if h >= t.critical_nats else "warning"
    return _finding(
        "entropy_explosion",
        severity,
        _span(cur),
        {"entropy": h, "start_entropy": h0},
        f"Token entropy rose from {h0:.3g} to {h:.3g} nats (steps {cur[0][0]}-{cur[-1][0]}); runs are reported to "
        "degrade above 1-2 nats/token.",
        "Lower algo.lr or algo.clip_high, remove algo.entropy_coef, or lower rollout.temperature; check mismatch/kl.",
        t.action,
    )


def kl_blowup(history: Sequence[Record], t: KlBlowupThresholds) -> Finding | None:
    """kl/old above the trust-region level, or kl/ref jumping to many times its preceding median."""
    old = tail(history, "kl/old", t.window)
    if len(old) == t.window and _mean(old) > t.max_kl_old:
        k = _mean(old)
        return _finding(
            "kl_blowup",
            "critical",
            _span(old),
            {"kl_old": k, "max_kl_old": t.max_kl_old},
            f"kl/old averages {k:.3g} over steps {old[0][0]}-{old[-1][0]}: each update moves the policy far outside "
            "PPO's trust region.",
            "Lower algo.lr, algo.ppo_epochs or algo.minibatches, or tighten algo.clip_low / algo.clip_high.",
            t.action,
        )
    ref = tail(history, "kl/ref", t.window + t.ref_history)
    if len(ref) < t.window + max(2, t.ref_history // 2):
        return None
    cur, prev = ref[-t.window :], ref[: -t.window]
    k, before = _mean(cur), statistics.median(v for _, v in prev)
    if k <= t.ref_floor or k < t.ref_jump * max(before, 1e-12):
        return None
    return _finding(
        "kl_blowup",
        "critical",
        _span(cur),
        {"kl_ref": k, "kl_ref_before": before, "ratio": k / max(before, 1e-12)},
        f"kl/ref jumped from {before:.3g} to {k:.3g} (steps {cur[0][0]}-{cur[-1][0]}): the policy is leaving the "
        "reference model quickly.",
        "Raise algo.kl_coef or lower algo.lr; check grad_spike and mismatch findings around the same steps.",
        t.action,
    )


def mismatch(history: Sequence[Record], t: MismatchThresholds) -> Finding | None:
    """Sampler/trainer log-prob gap (mismatch/kl, logged when the trainer recomputes log-probs)."""
    cur = tail(history, "mismatch/kl", t.window)
    if len(cur) < t.window:
        return None
    k = _mean(cur)
    if k <= t.warn_kl:
        return None
    severity: Severity = "critical" if k > t.critical_kl else "warning"
    ev = {"mismatch_kl": k}
    mx = tail(history, "mismatch/max_abs", t.window)
    if mx:
        ev["max_abs_logprob_gap"] = max(v for _, v in mx)
    return _finding(
        "mismatch",
        severity,
        _span(cur),
        ev,
        f"Sampler and trainer disagree: mismatch/kl averages {k:.3g} over steps {cur[0][0]}-{cur[-1][0]} "
        "(healthy runs show 4e-4 to 1e-2).",
        "Check the weight sync and that sampler and trainer use the same temperature/top-p; enable truncated "
        "importance sampling with algo.tis_cap (about 2).",
        t.action,
    )


def length_explosion(history: Sequence[Record], t: LengthExplosionThresholds) -> Finding | None:
    """Mean response length several times its start while accuracy has not improved."""
    base = head(history, "response_length/mean", t.baseline_steps)
    cur = tail(history, "response_length/mean", t.window)
    if len(base) < t.baseline_steps or len(cur) < t.window or cur[0][0] <= base[-1][0]:
        return None
    l0, length = _mean(base), _mean(cur)
    if l0 <= 0 or length < t.factor * l0:
        return None
    ev = {"length": length, "start_length": l0, "factor": length / l0}
    acc0, acc = head(history, "accuracy", t.baseline_steps), tail(history, "accuracy", t.window)
    if acc0 and acc:
        gain = _mean(acc) - _mean(acc0)
        ev["accuracy_gain"] = gain
        if gain >= t.min_accuracy_gain:
            return None
    return _finding(
        "length_explosion",
        "warning",
        _span(cur),
        ev,
        f"Mean response length grew from {l0:.3g} to {length:.3g} tokens (steps {cur[0][0]}-{cur[-1][0]}) without "
        "an accuracy gain: longer, not better.",
        "Use algo.loss_agg = 'constant' with algo.advantage = 'dr_grpo' (per-response length normalisation favours "
        "long wrong answers), or lower rollout.max_new_tokens.",
        t.action,
    )


def length_collapse(history: Sequence[Record], t: LengthCollapseThresholds) -> Finding | None:
    """Mean response length below a fraction of its start (or below a few tokens)."""
    base = head(history, "response_length/mean", t.baseline_steps)
    cur = tail(history, "response_length/mean", t.window)
    if len(base) < t.baseline_steps or len(cur) < t.window or cur[0][0] <= base[-1][0]:
        return None
    l0, length = _mean(base), _mean(cur)
    if length >= t.critical_tokens and (l0 <= 0 or length >= t.frac * l0):
        return None
    severity: Severity = "critical" if length < t.critical_tokens else "warning"
    return _finding(
        "length_collapse",
        severity,
        _span(cur),
        {"length": length, "start_length": l0},
        f"Mean response length fell from {l0:.3g} to {length:.3g} tokens (steps {cur[0][0]}-{cur[-1][0]}): the "
        'model answers without working ("guesses and stops").',
        "Lower algo.lr; check that format credit does not pay for bare answers; raise rollout.temperature.",
        t.action,
    )


def truncation_surge(history: Sequence[Record], t: TruncationSurgeThresholds) -> Finding | None:
    """Many completions cut at the length limit: a surge (risen) is a warning or critical; a level that was
    high from the start is info."""
    key = "response_length/truncated_frac"
    base = head(history, key, t.baseline_steps)
    cur = tail(history, key, t.window)
    if len(base) < t.baseline_steps or len(cur) < t.window or cur[0][0] <= base[-1][0]:
        return None
    f0, f = _mean(base), _mean(cur)
    if f < t.warn_frac:
        return None
    rise = f - f0
    if rise < t.min_rise:
        severity: Severity = "info"
        msg = f"{f:.0%} of completions hit the length limit (steps {cur[0][0]}-{cur[-1][0]}), about as many as at the start ({f0:.0%})."
    else:
        severity = "critical" if f >= t.critical_frac else "warning"
        msg = f"Truncated completions rose from {f0:.0%} to {f:.0%} (steps {cur[0][0]}-{cur[-1][0]}): cut answers earn no reward."
    return _finding(
        "truncation_surge",
        severity,
        _span(cur),
        {"truncated_frac": f, "start_truncated_frac": f0},
        msg,
        "Raise rollout.max_new_tokens if the answers need the room; if they ramble or loop, lower algo.lr and see "
        "repetition / length_explosion.",
        t.action,
    )


def repetition(history: Sequence[Record], t: RepetitionThresholds) -> Finding | None:
    """Share of repetitive completions (repetition/frac) high and risen since the start."""
    base = head(history, "repetition/frac", t.baseline_steps)
    cur = tail(history, "repetition/frac", t.window)
    if len(base) < t.baseline_steps or len(cur) < t.window or cur[0][0] <= base[-1][0]:
        return None
    r0, r = _mean(base), _mean(cur)
    if r < t.warn_frac or r - r0 < t.min_rise:
        return None
    severity: Severity = "critical" if r >= t.critical_frac else "warning"
    return _finding(
        "repetition",
        severity,
        _span(cur),
        {"repetitive_frac": r, "start_repetitive_frac": r0},
        f"{r:.0%} of sampled completions repeat themselves (steps {cur[0][0]}-{cur[-1][0]}; {r0:.0%} at the start).",
        "Lower algo.lr, add a small algo.entropy_coef, or raise rollout.temperature; check that the reward does "
        "not pay for repeated text.",
        t.action,
    )


def reward_collapse(history: Sequence[Record], t: RewardCollapseThresholds) -> Finding | None:
    """The rolling train reward lost a large part of its best gain over the start."""
    base = head(history, "reward/mean", t.baseline_steps)
    series = tail(history, "reward/mean", MAX_LOOKBACK, limit=MAX_LOOKBACK)
    if len(base) < t.baseline_steps or len(series) < t.window + t.baseline_steps:
        return None
    r0 = _mean(base)
    values = [v for _, v in series]
    run = sum(values[: t.window])
    best, best_end = run / t.window, t.window - 1
    for i in range(t.window, len(values)):
        run += values[i] - values[i - t.window]
        if run / t.window > best:
            best, best_end = run / t.window, i
    cur = sum(values[-t.window :]) / t.window
    gain = best - r0
    if gain < t.min_gain:
        return None
    lost = (best - cur) / gain
    if lost < t.lost_frac:
        return None
    severity: Severity = "critical" if lost >= t.critical_frac else "warning"
    return _finding(
        "reward_collapse",
        severity,
        (series[best_end][0], series[-1][0]),
        {"reward": cur, "best_reward": best, "start_reward": r0, "fraction_lost": lost},
        f"Train reward fell from its best {best:.3g} (step {series[best_end][0]}) to {cur:.3g}, losing {lost:.0%} "
        f"of its gain over the start ({r0:.3g}).",
        "Roll back to a checkpoint before the fall and lower algo.lr; look for grad_spike, kl_blowup or mismatch "
        "findings just before it (they usually come first).",
        t.action,
    )


def no_signal(history: Sequence[Record], t: NoSignalThresholds) -> Finding | None:
    """Fraction of groups whose rewards are all equal (no advantage, no gradient)."""
    cur = tail(history, "groups/no_signal_frac", t.window)
    if len(cur) < t.window:
        return None
    f = _mean(cur)
    if f < t.warn_frac:
        return None
    severity: Severity = "critical" if f >= t.critical_frac else "warning"
    rew = tail(history, "reward/mean", t.window)
    ev = {"no_signal_frac": f}
    why = ""
    if rew:
        r = _mean(rew)
        ev["reward_mean"] = r
        if r == 0:
            why = " (every rollout failed: the task is too hard for the policy)"
        else:
            why = f" (reward/mean {r:.3g}: solved, or the reward is too coarse to tell samples apart)"
    return _finding(
        "no_signal",
        severity,
        _span(cur),
        ev,
        f"{f:.0%} of groups had all-equal rewards over steps {cur[0][0]}-{cur[-1][0]}{why}; those groups give no gradient.",
        "Enable the curriculum's no-signal filter (drop all-equal groups, sample near p = 0.5), raise "
        "rollout.group_size or rollout.temperature, or make task.params easier (or harder, if everything is solved).",
        t.action,
    )


def _evals(history: Sequence[Record], key: str = "eval/accuracy") -> list[tuple[int, int, float]]:
    """(record index, step, value) of every eval in the last MAX_LOOKBACK records."""
    out = []
    for i in range(max(0, len(history) - MAX_LOOKBACK), len(history)):
        v = metric_value(history[i], key)
        if v is not None and math.isfinite(v):
            out.append((i, _step(history[i], i), v))
    return out


def _reward_near(history: Sequence[Record], index: int, n: int) -> float | None:
    vals = tail(history[: index + 1], "reward/mean", n)
    return _mean(vals) if vals else None


def reward_hacking(history: Sequence[Record], t: RewardHackingThresholds) -> Finding | None:
    """Train reward up (above its start, and not below where it was at the best eval) while the strict
    held-out checker (eval/accuracy) has fallen below its best for `min_evals` evals. Without enough evals,
    train accuracy (the strict checker on the training samples) stands in for eval accuracy."""
    start = head(history, "reward/mean", t.window)
    now = tail(history, "reward/mean", t.window)
    if len(start) < t.window or len(now) < t.window or now[0][0] <= start[-1][0]:
        return None
    r0, r_now = _mean(start), _mean(now)
    if r_now - r0 < t.min_reward_rise:
        return None
    evals = _evals(history)
    if len(evals) >= t.min_evals + 1:
        best = max(evals[: -t.min_evals], key=lambda e: (e[2], e[0]))
        recent = evals[-t.min_evals :]
        drop = best[2] - max(v for _, _, v in recent)
        r_best = _reward_near(history, best[0], t.window)
        if drop < t.min_accuracy_drop or r_best is None or r_now < r_best - t.reward_tolerance:
            return None
        return _finding(
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
            f"Train reward rose from {r0:.3g} to {r_now:.3g} and held, while held-out eval accuracy fell from "
            f"{best[2]:.3g} (step {best[1]}) to {recent[-1][2]:.3g} (step {recent[-1][1]}): the policy is learning "
            "the reward, not the task.",
            "Read the high-reward rollouts (keelrl doctor quotes some) and fix the task's scorer; lower format "
            "credit; keep the checkpoint of the best eval (checkpoint.best_metric = 'eval/accuracy').",
            t.action,
        )
    acc0, acc = head(history, "accuracy", t.window), tail(history, "accuracy", t.window)
    if len(acc0) < t.window or len(acc) < t.window or acc[0][0] <= acc0[-1][0]:
        return None
    a0, a = _mean(acc0), _mean(acc)
    if a0 - a < t.min_accuracy_drop:
        return None
    return _finding(
        "reward_hacking",
        "critical",
        (acc0[0][0], acc[-1][0]),
        {"accuracy_start": a0, "accuracy": a, "reward_start": r0, "reward_now": r_now},
        f"Train reward rose from {r0:.3g} to {r_now:.3g} while strict accuracy on the same samples fell from "
        f"{a0:.3g} to {a:.3g}: the policy is learning the reward, not the task.",
        "Read the high-reward rollouts and fix the task's scorer; lower format credit; turn on held-out eval "
        "(eval.every_steps) to confirm.",
        t.action,
    )


def eval_regression(history: Sequence[Record], t: EvalRegressionThresholds) -> Finding | None:
    """The last `min_evals` evals all fell `min_drop` below the best earlier eval."""
    evals = _evals(history)
    if len(evals) < t.min_evals + 1:
        return None
    best = max(evals[: -t.min_evals], key=lambda e: (e[2], e[0]))
    latest = evals[-t.min_evals :]
    drop = best[2] - max(v for _, _, v in latest)
    if drop < t.min_drop:
        return None
    return _finding(
        "eval_regression",
        "critical" if drop >= t.critical_frac * best[2] else "warning",
        (
            best[1] + 1,
            latest[-1][1],
        ),  # the trouble began after the best eval: its checkpoint is a good target
        {"eval_accuracy_best": best[2], "eval_accuracy": latest[-1][2], "drop": best[2] - latest[-1][2]},
        f"Held-out eval accuracy fell from its best {best[2]:.3g} (step {best[1]}) to {latest[-1][2]:.3g} "
        f"(step {latest[-1][1]}) and stayed below for {t.min_evals} evals.",
        "A collapse right after the first updates means algo.lr is far too high (guards.rollback_lr_scale "
        "lowers it at each rollback). Keep the best checkpoint (checkpoint.keep_best, best_metric = "
        "'eval/accuracy'); see reward_hacking and entropy_collapse for why.",
        t.action,
    )


def throughput_drop(history: Sequence[Record], t: ThroughputDropThresholds) -> Finding | None:
    """Median tokens/s of the last `window` steps below a fraction of the `reference` steps before."""
    series = tail(history, "throughput/tokens_per_s", t.window + t.reference)
    if len(series) < t.window + max(5, t.reference // 2):
        return None
    cur, ref = series[-t.window :], series[: -t.window]
    now, before = statistics.median(v for _, v in cur), statistics.median(v for _, v in ref)
    if before <= 0 or now >= t.min_ratio * before:
        return None
    return _finding(
        "throughput_drop",
        "warning",
        _span(cur),
        {"tokens_per_s": now, "tokens_per_s_before": before, "ratio": now / before},
        f"Throughput fell to {now:.4g} tokens/s over steps {cur[0][0]}-{cur[-1][0]}, {now / before:.0%} of the earlier "
        f"{before:.4g}.",
        "Check for other jobs on the machine, memory pressure or swapping, and a slower sampler "
        "(time/gen_s vs time/train_s); rollout.chunk_size and train.micro_batch_size trade memory for speed.",
        t.action,
    )


def stalled(
    history: Sequence[Record], t: StalledThresholds, *, now: float, last_write: float, state: str | None
) -> Finding | None:
    """A run whose status says it is running has been silent (no metric or status write since
    `last_write`) for `factor` times its recent median gap between steps. Doctor only."""
    if state not in RUNNING_STATES:
        return None  # finished, failed, or unknown (e.g. a metrics.jsonl exported from elsewhere)
    times = tail(history, "time", 21)
    if len(times) < 3:
        return None
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(times) if b[1] >= a[1]]
    if not gaps:
        return None
    typical = statistics.median(gaps)
    silent = now - max(last_write, times[-1][1])
    if silent < t.min_seconds or silent < t.factor * typical:
        return None
    step = times[-1][0]
    return _finding(
        "stalled",
        "critical",
        (step, step),
        {"silent_s": silent, "median_step_gap_s": typical},
        f"No new metrics for {silent:.0f} s after step {step} (steps usually take {typical:.3g} s) although the "
        f"run's status is {state}.",
        "Check the process (is it alive? stuck in eval, a checkpoint write or a collective?); the supervisor's hang "
        "watchdog restarts such runs. If it was killed, resume it with keelrl train ... --resume auto.",
        t.action,
    )


# ------------------------------------------------------------------------------------- running the rules

RuleFn = Callable[[Sequence[Record], Any], "Finding | None"]


def live_rules(cfg: GuardsConfig) -> list[tuple[RuleFn, _Rule]]:
    """Every rule that judges metrics alone, with its thresholds, in the order they are reported."""
    return [
        (nonfinite, cfg.nonfinite),
        (grad_spike, cfg.grad_spike),
        (exact_zero, cfg.exact_zero),
        (kl_blowup, cfg.kl_blowup),
        (mismatch, cfg.mismatch),
        (entropy_collapse, cfg.entropy_collapse),
        (entropy_explosion, cfg.entropy_explosion),
        (reward_collapse, cfg.reward_collapse),
        (reward_hacking, cfg.reward_hacking),
        (eval_regression, cfg.eval_regression),
        (no_signal, cfg.no_signal),
        (length_explosion, cfg.length_explosion),
        (length_collapse, cfg.length_collapse),
        (truncation_surge, cfg.truncation_surge),
        (repetition, cfg.repetition),
        (throughput_drop, cfg.throughput_drop),
    ]


# Rules about one step: judged at every record when scanning (a windowed rule may be judged less often).
POINTWISE = (nonfinite, grad_spike, exact_zero)
# Incidents the run can move past: `scan` reports a stretch of these that has ended one level lower.
TRANSIENT = ("nonfinite", "grad_spike", "throughput_drop")
# Stretches of one rule separated by at most this many steps are reported as one.
MERGE_GAP = 5


def check(history: Sequence[Record], cfg: GuardsConfig | None = None) -> list[Finding]:
    """Live use, once per step: every enabled rule on the latest window of `history` (all metric records
    of the run so far, in step order, the newest last). Most severe first."""
    cfg = cfg or GuardsConfig()
    found = [f for rule, t in live_rules(cfg) if t.enabled and (f := rule(history, t)) is not None]
    return sorted(found, key=lambda f: -SEVERITY_RANK[f.severity])


def strongest_action(findings: Sequence[Finding]) -> Action:
    """The most drastic action among the findings (stop > rollback > skip > warn)."""
    return max((f.action for f in findings), key=lambda a: ACTION_RANK[a], default="warn")


class _Prefix(Sequence[Record]):
    """history[:end] without copying: lets `scan` call the rules at every step of a long run."""

    def __init__(self, records: Sequence[Record], end: int) -> None:
        self._records, self._end = records, end

    def __len__(self) -> int:
        return self._end

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | Sequence[Record]:
        if isinstance(i, slice):
            start, stop, stride = i.indices(self._end)
            if stride == 1 and start == 0:
                return _Prefix(self._records, max(stop, 0))
            return [self._records[j] for j in range(start, stop, stride)]
        if i < 0:
            i += self._end
        if not 0 <= i < self._end:
            raise IndexError(i)
        return self._records[i]

    def __iter__(self) -> Iterator[Record]:
        for i in range(self._end):
            yield self._records[i]


@dataclass
class _Open:
    first: Finding
    worst: Finding
    last_step: int
    first_step: int
    last_point: int
    hits: int = 1


def scan(history: Sequence[Record], cfg: GuardsConfig | None = None, max_points: int = 500) -> list[Finding]:
    """Doctor use: replay the rules over a whole history and return one finding per stretch of steps where
    a rule held (its `steps` cover the stretch; its evidence and message are from the worst point, the
    latest among equals; `ongoing` when it still holds at the last record). Windowed rules are judged at
    most `max_points` times (evenly spaced), pointwise ones at every record. A stretch of a TRANSIENT rule
    that has ended is reported one severity lower (the run moved past it). Most severe first."""
    cfg = cfg or GuardsConfig()
    records = list(history)
    n = len(records)
    if n == 0:
        return []
    stride = max(1, math.ceil(n / max_points))
    open_: dict[str, _Open] = {}
    done: list[Finding] = []
    rules = [(rule, t) for rule, t in live_rules(cfg) if t.enabled]
    for end in range(1, n + 1):
        judged = end == n or (end - 1) % stride == stride - 1
        point = end - 1
        view = _Prefix(records, end)
        for rule, t in rules:
            if rule not in POINTWISE and not judged:
                continue
            f = rule(view, t)
            cur = open_.get(rule.__name__)
            if f is None:
                continue
            if cur is not None and (
                f.steps[0] <= cur.last_step + MERGE_GAP or cur.last_point >= point - stride
            ):
                cur.hits += 1
                cur.last_step = max(cur.last_step, f.steps[1])
                cur.first_step = min(cur.first_step, f.steps[0])
                cur.last_point = point
                if SEVERITY_RANK[f.severity] >= SEVERITY_RANK[cur.worst.severity]:
                    cur.worst = f
                continue
            if cur is not None:
                done.append(_close(cur, n, records))
            open_[rule.__name__] = _Open(
                first=f, worst=f, last_step=f.steps[1], first_step=f.steps[0], last_point=point
            )
    for cur in open_.values():
        done.append(_close(cur, n, records))
    last_step = _step(records[-1], n - 1)
    done = [replace(f, ongoing=f.steps[1] >= last_step and f.ongoing) for f in done]
    return sorted(done, key=lambda f: (-SEVERITY_RANK[f.severity], not f.ongoing, f.steps[0]))


def _close(cur: _Open, n: int, records: Sequence[Record]) -> Finding:
    ongoing = cur.last_point >= n - 1
    ev = dict(cur.worst.evidence)
    if cur.hits > 1:
        ev["times_fired"] = float(cur.hits)
    severity = cur.worst.severity
    if not ongoing and cur.worst.name in TRANSIENT and severity != "info":
        severity = "warning" if severity == "critical" else "info"
    return replace(
        cur.worst, severity=severity, steps=(cur.first_step, cur.last_step), evidence=ev, ongoing=ongoing
    )


# ===================================================================================== PER-STEP ACTIONS
# The trainer's use of the rules above. Two moments:
#   before each optimizer step: `check_update` (non-finite loss or gradient, gradient-norm spike, an exact
#     zero gradient while rewards vary, importance ratios far outside the trust region) -> skip the update;
#   after each step: `Guardian.after_step` runs every windowed rule -> warn / rollback / stop (a window rule
#     configured with "skip" only warns: by then the update is applied; per-step rules did the skipping).
# Too many skips within guards.skip_window escalates to a rollback. Everything the guardian remembers is a
# JSON dict kept in TrainState.guards, so it survives restarts and rollbacks.


def check_update(
    history: Sequence[Record],
    step: int,
    loss: float,
    grad_norm: float,
    ratio_max: float,
    advantage_abs_mean: float,
    cfg: GuardsConfig,
) -> Finding | None:
    """Judge one update before it is applied. Returns the finding that says to skip it, or None."""
    rec = {"step": step, "loss/total": loss, "grad_norm": grad_norm}
    if (
        cfg.nonfinite.enabled
        and (f := nonfinite([rec], cfg.nonfinite)) is not None
        and f.severity == "critical"
    ):
        return f
    if cfg.grad_spike.enabled and (f := grad_spike([*history, rec], cfg.grad_spike)) is not None:
        if f.severity == "critical":
            return f
    # Judged on the advantages, not on the batch's rewards: groups that are each all-right or all-wrong make
    # rewards vary across the batch with every advantage 0, and a zero gradient is then correct (measured:
    # judging reward/std skipped such SmolLM2 steps and escalated them to a pointless rollback).
    if cfg.exact_zero.enabled and grad_norm == 0.0 and advantage_abs_mean > 1e-9:
        return _finding(
            "exact_zero",
            "critical",
            (step, step),
            {"grad_norm": 0.0, "advantage_abs_mean": advantage_abs_mean},
            "the gradient is exactly zero although advantages are not: the update computes nothing",
            "check that the policy is trainable (requires_grad) and that advantages reach the loss",
            "skip",
        )
    t = cfg.ratio_outlier
    if t.enabled and math.isfinite(ratio_max) and ratio_max > t.max_ratio:
        return _finding(
            "ratio_outlier",
            "critical",
            (step, step),
            {"ratio_max": ratio_max, "max_ratio": t.max_ratio},
            f"an importance ratio of {ratio_max:.3g} is far outside the trust region",
            "lower algo.lr, algo.ppo_epochs or algo.minibatches, or check sampler/trainer log-prob agreement",
            t.action,
        )
    return None


class Guardian:
    """Turns findings into decisions and remembers what it decided (state: a JSON dict)."""

    def __init__(self, cfg: GuardsConfig, state: dict[str, Any]) -> None:
        self.cfg = cfg
        self.state = state
        state.setdefault("skipped_steps", 0)
        state.setdefault("recent_skips", [])
        state.setdefault("rollbacks", 0)
        state.setdefault("lr_scale", 1.0)
        state.setdefault("active", {})

    def record_skip(self, step: int) -> bool:
        """Count a skipped update; True when skips within the window call for a rollback."""
        self.state["skipped_steps"] += 1
        recent = [s for s in self.state["recent_skips"] if s > step - self.cfg.skip_window] + [step]
        self.state["recent_skips"] = recent
        return len(recent) >= self.cfg.max_skips_in_window

    def after_step(self, history: Sequence[Record]) -> tuple[Action, list[Finding], list[Finding]]:
        """(action, findings that are new or changed severity since last step, all current findings)."""
        findings = check(history, self.cfg) if self.cfg.enabled else []
        changed = [f for f in findings if self.state["active"].get(f.name, [None])[0] != f.severity]
        self.state["active"] = {f.name: [f.severity, f.action] for f in findings}
        action = strongest_action(findings)
        if action == "skip":
            action = "warn"
        return action, changed, findings

    @property
    def healthy(self) -> bool:
        """No finding that calls for a rollback or a stop holds: a checkpoint taken now is a valid rollback
        target. (Warnings, and skips already applied, do not make a checkpoint unhealthy.)"""
        return not any(action in ("rollback", "stop") for _, action in self.state["active"].values())

    def can_roll_back(self) -> bool:
        return self.state["rollbacks"] < self.cfg.max_rollbacks
