"""Rules on what the policy writes: token entropy collapsing or exploding, response length exploding or
collapsing, completions cut at the length limit, repetition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pydantic import Field

from keelrl.guards.base import (
    ACTION_DOC,
    Action,
    Finding,
    Record,
    Rise,
    RuleThresholds,
    finding,
    head,
    mean_value,
    span,
    start_and_now,
    tail,
)


class EntropyCollapseThresholds(RuleThresholds):
    """Token entropy fell to a small fraction of its start."""

    # action stays "warn": collapse is gradual, a rollback usually replays it; lowering lr is the user's.
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


def entropy_collapse(history: Sequence[Record], t: EntropyCollapseThresholds) -> Finding | None:
    """Mean entropy of the last `window` steps below a fraction of the starting entropy."""
    if (got := start_and_now(history, "entropy", t.baseline_steps, t.window)) is None or got[0] <= 0:
        return None
    h0, h, cur = got
    if (frac := h / h0) >= t.warn_frac:
        return None
    return finding(
        "entropy_collapse",
        "critical" if frac < t.critical_frac else "warning",
        span(cur),
        {"entropy": h, "start_entropy": h0, "fraction_left": frac},
        f"Token entropy is {h:.3g} nats over steps {cur[0][0]}-{cur[-1][0]}, {frac:.0%} of its starting {h0:.3g}: "
        "the policy is close to deterministic and has little left to explore with.",
        "Lower algo.lr, raise algo.clip_high (DAPO's clip-higher uses 0.28), add a small algo.entropy_coef "
        "(TinyZero used 0.001), or raise rollout.temperature.",
        t.action,
    )


class EntropyExplosionThresholds(RuleThresholds):
    """Token entropy rose past the levels where runs degrade."""

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


# Mean entropy of the last `window` steps above an absolute level and risen since the start.
entropy_explosion = Rise(
    name="entropy_explosion",
    key="entropy",
    levels=("warn_nats", "critical_nats"),
    evidence="entropy",
    message="Token entropy rose from {start:.3g} to {now:.3g} nats (steps {first}-{last}); runs are reported to "
    "degrade above 1-2 nats/token.",
    suggestion="Lower algo.lr or algo.clip_high, remove algo.entropy_coef, or lower rollout.temperature; check "
    "mismatch/kl.",
)


class LengthExplosionThresholds(RuleThresholds):
    """Responses grew several-fold without accuracy gains."""

    # action stays "warn": longer answers are how TinyZero learned search; fires only while accuracy stalls.
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


def length_explosion(history: Sequence[Record], t: LengthExplosionThresholds) -> Finding | None:
    """Mean response length several times its start while accuracy has not improved."""
    if (got := start_and_now(history, "response_length/mean", t.baseline_steps, t.window)) is None:
        return None
    l0, length, cur = got
    if l0 <= 0 or length < t.factor * l0:
        return None
    ev = {"length": length, "start_length": l0, "factor": length / l0}
    acc0, acc = head(history, "accuracy", t.baseline_steps), tail(history, "accuracy", t.window)
    if acc0 and acc:
        ev["accuracy_gain"] = gain = mean_value(acc) - mean_value(acc0)
        if gain >= t.min_accuracy_gain:
            return None
    return finding(
        "length_explosion",
        "warning",
        span(cur),
        ev,
        f"Mean response length grew from {l0:.3g} to {length:.3g} tokens (steps {cur[0][0]}-{cur[-1][0]}) without "
        "an accuracy gain: longer, not better.",
        "Use algo.loss_agg = 'constant' with algo.advantage = 'dr_grpo' (per-response length normalisation favours "
        "long wrong answers), or lower rollout.max_new_tokens.",
        t.action,
    )


class LengthCollapseThresholds(RuleThresholds):
    """Responses shrank to a fraction of their start."""

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


def length_collapse(history: Sequence[Record], t: LengthCollapseThresholds) -> Finding | None:
    """Mean response length below a fraction of its start (or below a few tokens)."""
    if (got := start_and_now(history, "response_length/mean", t.baseline_steps, t.window)) is None:
        return None
    l0, length, cur = got
    if length >= t.critical_tokens and (l0 <= 0 or length >= t.frac * l0):
        return None
    return finding(
        "length_collapse",
        "critical" if length < t.critical_tokens else "warning",
        span(cur),
        {"length": length, "start_length": l0},
        f"Mean response length fell from {l0:.3g} to {length:.3g} tokens (steps {cur[0][0]}-{cur[-1][0]}): the "
        'model answers without working ("guesses and stops").',
        "Lower algo.lr; check that format credit does not pay for bare answers; raise rollout.temperature.",
        t.action,
    )


class TruncationSurgeThresholds(RuleThresholds):
    """Many completions are cut at rollout.max_new_tokens."""

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
    # Measured (configs/selfplay_countdown.toml, docs/RESULTS.md): truncation rose 0 -> 100% while accuracy held,
    # every cut completion a complete answer and 1-2 characters more: the reward was intact, the stop was lost.
    answered_frac: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="When this share of the cut completions holds a well-formed answer before the cut "
        "(response_length/truncated_formatted_frac), the surge is the policy writing on after its answer: a "
        "warning that says so, not a critical loss of answers.",
    )


# Share of completions cut at rollout.max_new_tokens high and risen since the start; high without the rise: info.
_truncation = Rise(
    name="truncation_surge",
    key="response_length/truncated_frac",
    levels=("warn_frac", "critical_frac"),
    evidence="truncated_frac",
    message="Truncated completions rose from {start:.0%} to {now:.0%} (steps {first}-{last}): cut answers earn no "
    "reward.",
    suggestion="Raise rollout.max_new_tokens if the answers need the room; if they ramble or loop, lower algo.lr and "
    "see repetition / length_explosion.",
    flat="{now:.0%} of completions hit the length limit (steps {first}-{last}), about as many as at the start "
    "({start:.0%}).",
)


def truncation_surge(history: Sequence[Record], t: TruncationSurgeThresholds) -> Finding | None:
    """Many completions cut at the length limit: a surge is a warning or critical, a high start is info; a surge
    whose cut completions mostly hold their answer is a warning that the policy writes on after it."""
    found = _truncation(history, t)
    if found is None or found.severity == "info":
        return found
    answered = tail(history, "response_length/truncated_formatted_frac", t.window)
    if not answered or (a := mean_value(answered)) < t.answered_frac:
        return found
    # full windows (found is not None), the levels unrounded (the evidence is rounded) for the message
    f0, f, cur = start_and_now(history, _truncation.key, t.baseline_steps, t.window)
    return replace(
        found,
        severity="warning",
        action="warn",
        message=f"Completions cut at the length limit rose from {f0:.0%} to {f:.0%} (steps {cur[0][0]}-"
        f"{cur[-1][0]}), but {a:.0%} of them hold a well-formed answer before the cut and are scored on it: the "
        "policy writes on after its answer instead of ending its turn.",
        suggestion="The reward is intact while the answer comes first, but every sample now costs the whole token "
        "budget and its text needs cutting at the answer; a score that requires the completion to end after its "
        "answer (or a lower algo.lr) brings the stop back.",
    )


class RepetitionThresholds(RuleThresholds):
    """Many completions repeat themselves (repetition/frac)."""

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


# Share of repetitive completions (repetition/frac) high and risen since the start.
repetition = Rise(
    name="repetition",
    key="repetition/frac",
    levels=("warn_frac", "critical_frac"),
    evidence="repetitive_frac",
    message="{now:.0%} of sampled completions repeat themselves (steps {first}-{last}; {start:.0%} at the start).",
    suggestion="Lower algo.lr, add a small algo.entropy_coef, or raise rollout.temperature; check that the reward "
    "does not pay for repeated text.",
)
