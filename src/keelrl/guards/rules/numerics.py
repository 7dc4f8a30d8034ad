"""Rules on one update's numbers and how far it moves the policy: non-finite values, gradient-norm
and SFT loss spikes, exactly-zero updates, importance-ratio outliers (judged per update only), KL blow-up,
sampler/trainer mismatch, and the effective sample size of the off-policy (behaviour) ratios."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from pydantic import Field

from keelrl.guards.base import (
    ACTION_DOC,
    MAX_LOOKBACK,
    Action,
    Finding,
    Record,
    RuleThresholds,
    Severity,
    finding,
    is_train_record,
    mean_value,
    metric_value,
    robust_z,
    span,
    step_of,
    tail,
)


class NonfiniteThresholds(RuleThresholds):
    """A loss, gradient or other metric is NaN or infinite, or the trainer skipped a non-finite update."""

    # A NaN/inf loss or gradient poisons the weights on the next optimizer step; there is no safe level.
    action: Action = Field("skip", description=ACTION_DOC)


def nonfinite(history: Sequence[Record], t: NonfiniteThresholds) -> Finding | None:
    """The latest record holds a NaN/inf value, or says the trainer dropped a non-finite update."""
    if not history:
        return None
    rec = history[-1]
    step = step_of(rec, len(history) - 1)
    # keys whose value is a non-finite number (a value that is no number at all counts as finite here)
    bad = [k for k in rec if k not in ("step", "time") and not math.isfinite(metric_value(rec, k) or 0.0)]
    skipped = metric_value(rec, "guard/nonfinite_updates") or 0.0
    if not bad and not (math.isfinite(skipped) and skipped > 0):
        return None
    what = ", ".join(sorted(bad)) if bad else "the gradient (the update was dropped)"
    return finding(
        "nonfinite",
        "critical",
        (step, step),
        {"nonfinite_metrics": len(bad), "nonfinite_updates": skipped if math.isfinite(skipped) else 0.0},
        f"Non-finite values at step {step}: {what}.",
        "Lower algo.lr, keep algo.grad_clip > 0, and check the reward for inf/NaN; with model.dtype = "
        "'bfloat16' try float32.",
        t.action,
    )


class GradSpikeThresholds(RuleThresholds):
    """grad_norm far above its recent median (robust z-score)."""

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


def _spike(
    name: str,
    history: Sequence[Record],
    key: str,
    t: GradSpikeThresholds | LossSpikeThresholds,
    suggestion: str,
) -> Finding | None:
    """The latest `key` against the `t.window` values before it: critical when it is at least `t.z` robust
    z-scores and `t.min_ratio` times their median above it."""
    x = metric_value(history[-1], key) if history else None
    if x is None or not math.isfinite(x):
        return None  # a non-finite value is nonfinite's
    values = [v for _, v in tail(history[:-1], key, t.window)]
    if len(values) < max(5, t.window // 2) or (med := statistics.median(values)) <= 0:
        return None
    z, ratio = robust_z(x, values), x / med
    if z < t.z or ratio < t.min_ratio:
        return None
    step = step_of(history[-1], len(history) - 1)
    return finding(
        name,
        "critical",
        (step, step),
        {key.replace("/", "_"): x, "window_median": med, "robust_z": z, "ratio": ratio},
        f"{key} {x:.3g} at step {step} is {ratio:.1f}x the median of the previous {len(values)} steps "
        f"(robust z {z:.1f}).",
        suggestion,
        t.action,
    )


# The losses of the supervised stages: SFT's per-token loss/nll (loss_spike judges it) and a reward model's
# per-pair loss/pair_nll. The latter is judged by no spike rule: near convergence a batch's mean pair loss is
# set by its few hard pairs (measured on the healthy runs of benchmarks/reward_model_demo.py: robust z up to
# 7.2 and 15.5, up to 5.7x the window median, with held-out pair accuracy steady); nonfinite, exact_zero and
# eval_regression (held-out pair accuracy) still apply.
SUPERVISED_LOSSES = ("loss/nll", "loss/pair_nll")


def grad_spike(history: Sequence[Record], t: GradSpikeThresholds, key: str = "grad_norm") -> Finding | None:
    """The latest grad_norm against the `window` before it (a pre-step check appends its record first).
    `key`: the record's norm to judge; a step of several optimizer steps (PPO mini-batches) judges each
    mini-batch's norm against `grad_norm/max`, the largest mini-batch norm of each step before it (the step's
    `grad_norm` is their mean, which is steadier than any one of them: measured on SmolLM2 with 4 mini-batches
    of 16, healthy mini-batch norms of 3-4 against a median mean of 1.4 were skipped as spikes).
    Not for SFT or reward-model records (SUPERVISED_LOSSES): fine-tuning's gradient norms are heavy-tailed
    while its loss stays flat (measured: 10x and 64x the window's robust z in two healthy SFT runs, benchmarks/
    sft_from_scratch.py and a STaR round in docs/RESULTS.md), so SFT is judged by loss_spike instead; a reward
    model by neither (see SUPERVISED_LOSSES)."""
    if history and any(metric_value(history[-1], k) is not None for k in SUPERVISED_LOSSES):
        return None
    return _spike(
        "grad_spike",
        history,
        key,
        t,
        "A single spike is usually one bad batch (skipping it is what PaLM did); repeated spikes mean lower "
        "algo.lr or a tighter algo.grad_clip, and check mismatch/kl first (the gap often grows before spikes).",
    )


class LossSpikeThresholds(RuleThresholds):
    """SFT: the training loss (loss/nll) far above its recent median (robust z-score): a loss spike."""

    action: Action = Field("skip", description=ACTION_DOC)
    window: int = Field(20, ge=5, description="Preceding steps the latest loss/nll is compared with.")
    # As grad_spike: PaLM met its loss spikes as rare, large events and skipped the batches around them.
    # Measured on a healthy SFT run here (docs/doctor.md; 300 steps from scratch, lr 3e-3 cosine): the largest
    # robust z of a step against its 20 predecessors was 2.1, the largest ratio to their median 1.22.
    z: float = Field(
        6.0, gt=0.0, description="Robust z-score (median/MAD of the window) above which loss/nll is a spike."
    )
    min_ratio: float = Field(
        1.5, ge=1.0, description="A spike must also be at least this many times the window median."
    )


def loss_spike(history: Sequence[Record], t: LossSpikeThresholds) -> Finding | None:
    """The latest loss/nll (SFT's per-token loss) against the `window` before it; RL and reward-model records
    have none."""
    return _spike(
        "loss_spike",
        history,
        "loss/nll",
        t,
        "One spike is usually one bad batch (skipping it is what PaLM did); if spikes repeat, lower algo.lr, "
        "keep algo.grad_clip > 0, and look for malformed or very long examples in the data.",
    )


class ExactZeroThresholds(RuleThresholds):
    """Loss and grad_norm exactly 0.0 for several steps while training."""

    action: Action = Field("stop", description=ACTION_DOC)
    # REFERENCE: a broken weight sync gave reward, loss and grad-norm of exactly 0.0 every step. One exact
    # zero happens when every group of a step has equal rewards; with varying rewards (e.g. 8 groups of 4
    # at p = 0.9, each all-equal with probability 0.66) three such steps in a row has odds ~4e-5.
    min_steps: int = Field(
        3, ge=1, description="Consecutive training steps with loss and grad_norm exactly 0.0."
    )


def _is_zero_step(rec: Record) -> bool:
    loss = metric_value(rec, "loss/total")
    loss = metric_value(rec, "loss/policy") if loss is None else loss
    lr = metric_value(rec, "lr")
    return loss == 0.0 and metric_value(rec, "grad_norm") == 0.0 and (lr is None or lr > 0)


# exact_zero's (message about its `n` steps, suggestion) by severity: critical when rewards vary within groups,
# a warning when every reward is 0 too, info when every group's rewards are equal.
ZERO_STEPS: dict[str, tuple[str, str]] = {
    "critical": (
        "loss and grad_norm are exactly 0.0 for {n} steps although rewards vary within groups: "
        "the update is disconnected from the rollouts.",
        "Check that the trainer's weights reach the sampler, that advantages are not masked away, and that the "
        "loss is not detached.",
    ),
    "warning": (
        "reward, loss and grad_norm are exactly 0.0 for {n} steps. Either no rollout earns any reward "
        "(see no_signal) or the pipeline is broken: a failed weight sync once looked exactly like this.",
        "Read a few rollouts (keelrl doctor prints some): if they are sensible, check the weight sync and the "
        "scorer; if not, the task is too hard for the policy (task.params, rollout.group_size, rollout.temperature).",
    ),
    "info": (
        "loss and grad_norm are exactly 0.0 for {n} steps because every group's rewards are equal "
        "(no gradient to follow).",
        "See no_signal: harder or more varied problems, or a larger rollout.group_size.",
    ),
}


def exact_zero(history: Sequence[Record], t: ExactZeroThresholds) -> Finding | None:
    """loss and grad_norm exactly 0.0 for `min_steps` training steps in a row (lr > 0), counting the whole
    stretch back to where it began (at most MAX_LOOKBACK records)."""
    newest_first = itertools.islice(reversed(history), MAX_LOOKBACK)
    recs = list(itertools.takewhile(_is_zero_step, filter(is_train_record, newest_first)))[::-1]
    if len(recs) < t.min_steps:
        return None
    n, steps = len(recs), (step_of(recs[0], 0), step_of(recs[-1], 0))
    evidence = {"zero_steps": float(n)}
    no_signal = [metric_value(r, "groups/no_signal_frac") for r in recs]
    rewards = [metric_value(r, "reward/mean") for r in recs]
    if None not in no_signal:
        evidence["no_signal_frac"] = min(no_signal)
    if None not in rewards:
        evidence["reward_mean"] = max(abs(v) for v in rewards)
    if "no_signal_frac" in evidence:
        has_signal = evidence["no_signal_frac"] < 1.0
    else:
        has_signal = any((metric_value(r, "reward/std") or 0.0) > 0 for r in recs)
    severity: Severity = (
        "critical" if has_signal else "warning" if evidence.get("reward_mean") == 0.0 else "info"
    )
    message, suggestion = ZERO_STEPS[severity]
    return finding("exact_zero", severity, steps, evidence, message.format(n=n), suggestion, t.action)


class RatioOutlierThresholds(RuleThresholds):
    """Per-step guard: an importance ratio far outside the trust region."""

    action: Action = Field("skip", description=ACTION_DOC)
    # PPO's clip range (0.2) means ratios past 1.2 already carry no gradient; a token whose probability moved
    # 10x (2.3 nats) between sampling and this update is far outside any trust region. veRL warns when
    # importance weights leave [0.5, 2] on average (REFERENCE.md); 10 is for a single token's maximum.
    max_ratio: float = Field(
        10.0, gt=1.0, description="Skip an update whose largest per-token ratio pi/pi_old exceeds this."
    )


def ratio_outlier(step: int, ratio_max: float, t: RatioOutlierThresholds) -> Finding | None:
    """One update's largest per-token ratio pi/pi_old, judged before the update is applied (per step only).
    pi_old is the proximal policy: recomputed when the batch is stale (rollout.max_staleness >= 1), so staleness
    does not inflate this ratio; the stale gap (the behaviour ratio) is `off_policy_ess`'s."""
    if not (math.isfinite(ratio_max) and ratio_max > t.max_ratio):
        return None
    return finding(
        "ratio_outlier",
        "critical",
        (step, step),
        {"ratio_max": ratio_max, "max_ratio": t.max_ratio},
        f"an importance ratio of {ratio_max:.3g} is far outside the trust region",
        "lower algo.lr, algo.ppo_epochs or algo.minibatches, or check sampler/trainer log-prob agreement",
        t.action,
    )


class KlBlowupThresholds(RuleThresholds):
    """The policy moves far within a step (kl/old) or jumps away from the reference (kl/ref)."""

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
        description="Critical when the mean kl/ref jumps to this many times its preceding median (or ref_floor).",
    )
    ref_history: int = Field(
        20, ge=2, description="Steps before the window whose median kl/ref is the preceding level."
    )
    # REFERENCE: healthy sampler/trainer KL is 4e-4 to 1e-2; a tenfold jump below 0.01 is still healthy.
    # The jump is measured from this level at least: a KL-penalised run starts at kl/ref = 0 exactly, and its
    # first steps multiply it many times over while healthy (measured: 0 -> 0.05 in 13 steps with
    # algo.kl_coef = 0.1, held-out accuracy rising; benchmarks/reward_model_demo.py), which a ratio against
    # a near-zero median called a blow-up and rolled back three times.
    ref_floor: float = Field(
        0.01,
        ge=0.0,
        description="kl/ref must exceed this, and ref_jump times it, to count as a blow-up (see ref_jump).",
    )


def kl_blowup(history: Sequence[Record], t: KlBlowupThresholds) -> Finding | None:
    """kl/old above the trust-region level, or kl/ref jumping to many times its preceding median (measured from
    ref_floor at least)."""
    old = tail(history, "kl/old", t.window)
    if len(old) == t.window and (k := mean_value(old)) > t.max_kl_old:
        return finding(
            "kl_blowup",
            "critical",
            span(old),
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
    k, before = mean_value(cur), statistics.median(v for _, v in prev)
    if k <= t.ref_floor or k < t.ref_jump * max(before, t.ref_floor):
        return None
    return finding(
        "kl_blowup",
        "critical",
        span(cur),
        # the ratio judged above (1e-12: a ref_floor of 0 with a zero median)
        {"kl_ref": k, "kl_ref_before": before, "ratio": k / max(before, t.ref_floor, 1e-12)},
        f"kl/ref jumped from {before:.3g} to {k:.3g} (steps {cur[0][0]}-{cur[-1][0]}): the policy is leaving the "
        "reference model quickly.",
        "Raise algo.kl_coef or lower algo.lr; check grad_spike and mismatch findings around the same steps.",
        t.action,
    )


class MismatchThresholds(RuleThresholds):
    """Sampler and trainer log-probs disagree (mismatch/kl): a sampler whose numerics differ, or, with stale
    batches (rollout.max_staleness >= 1), a policy that moved far between sampling and the update."""

    # action stays "warn": a rollback cannot repair a disagreeing sampler; the off-policy correction can.
    window: int = Field(5, ge=1, description="Steps averaged for the sampler/trainer gap (mismatch/kl).")
    # REFERENCE: healthy dense runs show sampler/trainer KL 4e-4 to 1e-2; veRL warns above 0.1.
    warn_kl: float = Field(
        0.01, gt=0.0, description="Warn when mean mismatch/kl exceeds this (upper end of healthy runs)."
    )
    critical_kl: float = Field(
        0.1, gt=0.0, description="Critical when mean mismatch/kl exceeds this (veRL's warning level)."
    )
    # Measured (docs/RESULTS.md, asynchronous training): the demo's RL stage at k = 1 and 2 kept the 5-step mean
    # of mismatch/kl at or below 0.025 on healthy seeds; the seed that collapsed at k = 2 reached 0.35.
    stale_warn_kl: float = Field(
        0.05,
        gt=0.0,
        description="With stale batches (async/staleness_max > 0): warn above this mean mismatch/kl.",
    )
    stale_critical_kl: float = Field(
        0.2, gt=0.0, description="With stale batches: critical above this mean mismatch/kl."
    )


def mismatch(history: Sequence[Record], t: MismatchThresholds) -> Finding | None:
    """Sampler/trainer log-prob gap (mismatch/kl, logged when the trainer recomputes log-probs). With stale
    batches (async/staleness_max > 0 in the latest record) the gap includes the policy's own movement over the
    staleness, and the stale thresholds apply."""
    cur = tail(history, "mismatch/kl", t.window)
    if len(cur) < t.window:
        return None
    stale = metric_value(history[-1], "async/staleness_max") or 0.0
    warn, critical = (t.stale_warn_kl, t.stale_critical_kl) if stale > 0 else (t.warn_kl, t.critical_kl)
    k = mean_value(cur)
    if k <= warn:
        return None
    ev = {"mismatch_kl": k}
    if mx := tail(history, "mismatch/max_abs", t.window):
        ev["max_abs_logprob_gap"] = max(v for _, v in mx)
    if stale > 0:
        ev["staleness_max"] = stale
        message = (
            f"The policy moved far between sampling and the update: mismatch/kl (sampling policy vs the one "
            f"updated, up to {stale:g} versions apart) averages {k:.3g} over steps {cur[0][0]}-{cur[-1][0]} "
            "(healthy asynchronous runs stay below 0.025). Stale feedback lets updates overshoot."
        )
        suggestion = "Lower algo.lr or rollout.max_staleness; keep algo.correction on."
    else:
        message = (
            f"Sampler and trainer disagree: mismatch/kl averages {k:.3g} over steps {cur[0][0]}-{cur[-1][0]} "
            "(healthy runs show 4e-4 to 1e-2)."
        )
        suggestion = (
            "Check the weight sync and that sampler and trainer use the same temperature/top-p; with "
            "algo.old_logprobs = 'recompute' keep an off-policy correction on (algo.correction = 'tis', the default)."
        )
    return finding(
        "mismatch", "critical" if k > critical else "warning", span(cur), ev, message, suggestion, t.action
    )


class OffPolicyEssThresholds(RuleThresholds):
    """The effective sample size of the behaviour ratios pi_prox / pi_sampler (behaviour/ess) is low: a few stale
    or mismatched samples carry most of the weight."""

    window: int = Field(5, ge=1, description="Steps averaged for behaviour/ess.")
    # REFERENCE: veRL's rollout-correction warns when the effective sample size falls below 0.3; VCPO
    # (2602.17616) found low ESS precedes collapse in asynchronous runs.
    min_ess: float = Field(
        0.3, gt=0.0, le=1.0, description="Warn when the mean behaviour/ess is below this (veRL's level)."
    )
    critical_ess: float = Field(
        0.1, gt=0.0, le=1.0, description="Critical when the mean behaviour/ess is below this."
    )


def off_policy_ess(history: Sequence[Record], t: OffPolicyEssThresholds) -> Finding | None:
    """Mean behaviour/ess over the window below min_ess (logged whenever the proximal policy is recomputed:
    rollout.max_staleness >= 1, or algo.old_logprobs = 'recompute')."""
    cur = tail(history, "behaviour/ess", t.window)
    if len(cur) < t.window or (ess := mean_value(cur)) >= t.min_ess:
        return None
    ev = {"ess": ess}
    for key, name in (("async/staleness_mean", "staleness"), ("behaviour/ratio_max", "ratio_max")):
        if (v := metric_value(history[-1], key)) is not None:
            ev[name] = v
    stale = ev.get("staleness", 0.0) > 0
    cause = (
        f"the batches are {ev['staleness']:.3g} policy versions old and the policy moved too far meanwhile"
        if stale
        else "the sampler's log-probs differ from the trainer's"
    )
    return finding(
        "off_policy_ess",
        "critical" if ess < t.critical_ess else "warning",
        span(cur),
        ev,
        f"The behaviour ratios pi_prox / pi_sampler have an effective sample size of {ess:.3g} (steps "
        f"{cur[0][0]}-{cur[-1][0]}): {cause}, so a few samples carry most of the gradient's weight.",
        "Lower rollout.max_staleness or algo.lr, and keep an off-policy correction on (algo.correction = 'tis' "
        "or 'mis'; 'off' trains on these samples as if they were on-policy)."
        if stale
        else "Check the weight sync and the engine's dtype (vllm.dtype), and keep algo.correction on.",
        t.action,
    )
