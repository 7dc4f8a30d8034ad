"""The divergence rules (keelrl.guards) on synthetic metric streams: each rule fires on its pattern with
the right severity and action, and every rule stays quiet on a healthy stream."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest
from pydantic import ValidationError

from keelrl.guards.base import SEVERITY_RANK, Finding, head, metric_value, robust_z, tail
from keelrl.guards.engine import check, scan, strongest_action
from keelrl.guards.rules import RULES, GuardsConfig
from keelrl.guards.rules.numerics import grad_spike, loss_spike
from keelrl.guards.rules.process import stalled

CFG = GuardsConfig()


def healthy(n: int = 120, seed: int = 0, eval_every: int = 10) -> list[dict[str, Any]]:
    """A plausible healthy GRPO run: reward and accuracy creep up, entropy drifts down a little, everything
    else is steady with noise. Step 0 is an eval-only record, as the trainer writes it."""
    rng = random.Random(seed)
    t0 = 1_700_000_000.0
    out: list[dict[str, Any]] = [{"step": 0, "time": t0, "eval/accuracy": 0.20, "eval/reward/mean": 0.25}]
    for s in range(1, n + 1):
        p = s / n
        acc = 0.2 + 0.25 * p + rng.uniform(-0.03, 0.03)
        rec: dict[str, Any] = {
            "step": s,
            "time": t0 + 2.0 * s + rng.uniform(0, 0.2),
            "reward/mean": acc + 0.08 + rng.uniform(-0.02, 0.02),
            "reward/std": 0.4,
            "accuracy": acc,
            "format_rate": 0.9,
            "response_length/mean": 100 + rng.uniform(-5, 5),
            "response_length/max": 180.0,
            "response_length/truncated_frac": 0.05 + rng.uniform(-0.02, 0.02),
            "repetition/frac": rng.choice([0.0, 0.0, 0.0, 0.03]),
            "groups/no_signal_frac": 0.35 + rng.uniform(-0.1, 0.1),
            "loss/policy": rng.uniform(-0.05, 0.05),
            "loss/total": rng.uniform(-0.05, 0.05),
            "entropy": 0.9 - 0.15 * p + rng.uniform(-0.02, 0.02),
            "clipfrac/low": 0.01,
            "clipfrac/high": 0.02,
            "kl/old": 0.004 + rng.uniform(0, 0.002),
            "kl/ref": 0.001 + 0.01 * p + rng.uniform(0, 0.001),
            "mismatch/kl": 0.001 + rng.uniform(0, 0.001),
            "grad_norm": 0.3 + rng.uniform(-0.05, 0.05),
            "lr": 1e-6,
            "guard/nonfinite_updates": 0.0,
            "time/step_s": 2.0,
            "throughput/tokens_per_s": 1000 + rng.uniform(-60, 60),
        }
        if s % eval_every == 0:
            rec["eval/accuracy"] = 0.2 + 0.25 * p + rng.uniform(-0.02, 0.02)
        out.append(rec)
    return out


def set_from(history: list[dict[str, Any]], start: int, **values: Any) -> list[dict[str, Any]]:
    """Copy of history with keys (given with '/' written as '__') set on every record from step `start`
    on; a callable value is called with the step."""
    out = []
    for rec in history:
        rec = dict(rec)
        if rec["step"] >= start and "reward/mean" in rec:
            for k, v in values.items():
                rec[k.replace("__", "/")] = v(rec["step"]) if callable(v) else v
        out.append(rec)
    return out


def only(findings: list[Finding], name: str) -> Finding:
    hits = [f for f in findings if f.name == name]
    assert len(hits) == 1, f"expected one {name} finding, got {[(f.name, f.severity) for f in findings]}"
    return hits[0]


def severity(history: list[dict[str, Any]], name: str) -> str:
    return only(check(history), name).severity


# -------------------------------------------------------------------------------- healthy is quiet


def test_healthy_stream_is_quiet_at_every_step() -> None:
    h = healthy()
    for end in range(1, len(h) + 1):
        assert check(h[:end]) == [], f"false alarm at step {h[end - 1]['step']}"
    assert scan(h) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_healthy_stream_quiet_for_other_seeds(seed: int) -> None:
    assert scan(healthy(seed=seed)) == []


def test_rules_need_history_before_judging() -> None:
    h = healthy(3)
    assert check(h) == []
    assert check([]) == []
    assert scan([]) == []


# ------------------------------------------------------------------------------ reading records


def test_metric_value_reads_strings_and_tolerates_junk() -> None:
    rec = {"a": "nan", "b": "inf", "c": "-inf", "d": 2, "e": True, "f": "oops", "g": None, "h": [1]}
    assert math.isnan(metric_value(rec, "a") or 0.0)
    assert metric_value(rec, "b") == math.inf
    assert metric_value(rec, "c") == -math.inf
    assert metric_value(rec, "d") == 2.0
    assert metric_value(rec, "e") == 1.0
    assert metric_value(rec, "f") is None
    assert metric_value(rec, "g") is None
    assert metric_value(rec, "h") is None
    assert metric_value(rec, "missing") is None


def test_tail_and_head_skip_missing_and_nonfinite() -> None:
    h = [{"step": 0}, {"step": 1, "x": 1.0}, {"step": 2, "x": "nan"}, {"step": 3, "x": 3.0}, {"step": 4}]
    assert tail(h, "x", 2) == [(1, 1.0), (3, 3.0)]
    assert head(h, "x", 1) == [(1, 1.0)]
    assert tail(h, "y", 3) == []


def test_robust_z_worked_number() -> None:
    # median 3, MAD 1 -> scale 1.4826; (6 - 3) / 1.4826 = 2.0235
    assert robust_z(6.0, [1, 2, 3, 4, 5]) == pytest.approx(2.0235, abs=1e-4)
    # a constant window does not divide by zero
    assert math.isfinite(robust_z(2.0, [1.0] * 10))


# ---------------------------------------------------------------------------- each rule fires


def test_nonfinite_fires_on_nan_string_and_skipped_update() -> None:
    h = healthy(30)
    h[-1]["loss/total"] = "nan"
    f = only(check(h), "nonfinite")
    assert (f.severity, f.action, f.steps) == ("critical", "skip", (30, 30))
    assert "loss/total" in f.message
    h2 = healthy(30)
    h2[-1]["guard/nonfinite_updates"] = 1.0
    assert only(check(h2), "nonfinite").evidence["nonfinite_updates"] == 1.0


def test_grad_spike_fires_on_a_tenfold_jump_not_on_noise() -> None:
    h = healthy(40)
    h[-1]["grad_norm"] = 3.0
    f = only(check(h), "grad_spike")
    assert (f.severity, f.action) == ("critical", "skip")
    assert f.evidence["ratio"] == pytest.approx(10, rel=0.2)
    h[-1]["grad_norm"] = 0.4  # 1.3x: within what healthy runs show
    assert not [f for f in check(h) if f.name == "grad_spike"]


def test_grad_spike_works_before_the_optimizer_step() -> None:
    """The per-step use: append the pending step's grad norm to the history."""
    h = healthy(40)
    assert grad_spike([*h, {"step": 41, "grad_norm": 5.0}], CFG.grad_spike) is not None
    assert grad_spike([*h, {"step": 41, "grad_norm": 0.31}], CFG.grad_spike) is None


def test_a_minibatch_norm_is_judged_against_the_largest_minibatch_norms() -> None:
    """With several optimizer steps per batch, one mini-batch's norm is compared with the steps' grad_norm/max,
    not with their mean (SmolLM2, 4 mini-batches of 16: healthy mini-batch norms of 3-4 against a median mean
    of 1.4 were skipped)."""
    from keelrl.guards.step import check_update

    rng = random.Random(0)
    h = [{"step": s, "grad_norm": 1.4 + rng.uniform(-0.1, 0.1), "grad_norm/max": 2.4 + rng.uniform(-0.3, 0.3)}
         for s in range(1, 21)]  # fmt: skip
    judge = lambda norm, key: check_update(h, 21, 0.0, norm, 1.0, 0.5, CFG, grad_key=key)  # noqa: E731
    assert judge(3.5, "grad_norm") is not None  # as a whole-step norm 3.5 is a spike (2.5x the mean)...
    assert judge(3.5, "grad_norm/max") is None  # ...as one of a step's mini-batches it is not
    f = judge(25.0, "grad_norm/max")  # a real spike still is
    assert f is not None and f.name == "grad_spike" and f.evidence["grad_norm_max"] == 25.0
    assert f.evidence["window_median"] == pytest.approx(2.4, abs=0.3)


def sft_history(n: int) -> list[dict]:
    """An SFT run's records: loss/nll falling slowly from 2.0 with +-3% batch noise."""
    return [{"step": s, "loss/nll": 2.0 * 0.99**s * (1 + 0.03 * ((-1) ** s))} for s in range(1, n + 1)]


def test_loss_spike_fires_on_a_jump_and_is_quiet_on_a_healthy_sft_run() -> None:
    h = sft_history(40)
    assert loss_spike(h, CFG.loss_spike) is None
    assert not [f for f in check(h) if f.name == "loss_spike"]
    spiked = [*h, {"step": 41, "loss/nll": 3.0}]  # 2.3x the window median (~1.3)
    f = loss_spike(spiked, CFG.loss_spike)
    assert f is not None and (f.severity, f.action) == ("critical", "skip")
    assert f.evidence["ratio"] == pytest.approx(
        3.0 / statistics.median(x["loss/nll"] for x in h[-20:]), rel=1e-3
    )
    assert loss_spike([*h, {"step": 41, "loss/nll": 1.8}], CFG.loss_spike) is None  # 1.4x: under min_ratio
    assert loss_spike([*h, {"step": 41, "loss/nll": float("nan")}], CFG.loss_spike) is None  # nonfinite's job
    assert loss_spike(healthy(40), CFG.loss_spike) is None  # an RL run logs no loss/nll


def test_exact_zero_severity_depends_on_whether_rewards_vary() -> None:
    zero = {"loss__total": 0.0, "loss__policy": 0.0, "grad_norm": 0.0}
    varied = set_from(healthy(30), 27, **zero)
    f = only(check(varied), "exact_zero")
    assert (f.severity, f.action, f.steps) == ("critical", "stop", (27, 30))
    assert f.evidence["zero_steps"] == 4
    # REFERENCE's silent failure: reward, loss and grad all exactly zero
    dead = set_from(healthy(30), 27, **zero, reward__mean=0.0, reward__std=0.0, groups__no_signal_frac=1.0)
    assert only(check(dead), "exact_zero").severity == "warning"
    solved = set_from(healthy(30), 27, **zero, reward__mean=1.0, reward__std=0.0, groups__no_signal_frac=1.0)
    assert only(check(solved), "exact_zero").severity == "info"
    short = set_from(healthy(30), 29, **zero)
    assert not [f for f in check(short) if f.name == "exact_zero"]
    lr_off = set_from(healthy(30), 27, **zero, lr=0.0)
    assert not [f for f in check(lr_off) if f.name == "exact_zero"]


def test_entropy_collapse_warning_then_critical() -> None:
    h = set_from(healthy(60), 41, entropy=0.18)  # 20% of the start (0.9)
    f = only(check(h), "entropy_collapse")
    assert f.severity == "warning" and f.evidence["fraction_left"] == pytest.approx(0.2, abs=0.01)
    h = set_from(healthy(60), 41, entropy=0.05)
    assert only(check(h), "entropy_collapse").severity == "critical"
    assert "algo.lr" in only(check(h), "entropy_collapse").suggestion


def test_entropy_explosion_needs_level_and_rise() -> None:
    h = set_from(healthy(60), 51, entropy=2.5)
    f = only(check(h), "entropy_explosion")
    assert (f.severity, f.action) == ("critical", "rollback")
    h = set_from(healthy(60), 51, entropy=1.5)
    assert only(check(h), "entropy_explosion").severity == "warning"
    # a random-init model sits near ln(vocab) from the start: high but not rising
    flat_high = set_from(healthy(60), 1, entropy=4.56)
    assert not [f for f in check(flat_high) if f.name.startswith("entropy")]


def test_kl_blowup_on_kl_old_and_on_kl_ref_jump() -> None:
    h = set_from(healthy(40), 36, kl__old=0.3)
    f = only(check(h), "kl_blowup")
    assert (f.severity, f.action) == ("critical", "rollback") and "kl_old" in f.evidence
    h = set_from(healthy(60), 56, kl__ref=0.5)
    f = only(check(h), "kl_blowup")
    assert f.evidence["ratio"] > 10
    # a KL-penalised run's first 15 steps (kl/ref as measured, algo.kl_coef = 0.1): 19x its start, but growth
    # from exactly 0, not a blow-up; a jump past 10x ref_floor still is
    measured = [
        0,
        6e-4,
        0.0012,
        0.0018,
        0.0026,
        0.0035,
        0.0044,
        0.01,
        0.02,
        0.0356,
        0.05,
        0.07,
        0.089,
        0.05,
        0.03,
    ]
    h = [r for r in healthy(15, eval_every=100) if "kl/ref" in r]
    for rec, kl in zip(h, measured):
        rec["kl/ref"] = kl
    assert not [x for x in check(h) if x.name == "kl_blowup"]
    h[-1]["kl/ref"] = h[-2]["kl/ref"] = 0.6
    f = only(check(h), "kl_blowup")
    # the preceding median (0.004) is below ref_floor: the evidence reports the ratio judged, against 0.01
    assert f.evidence["ratio"] == pytest.approx(f.evidence["kl_ref"] / 0.01)


def test_mismatch_warning_and_critical() -> None:
    assert severity(set_from(healthy(40), 36, mismatch__kl=0.03), "mismatch") == "warning"
    f = only(check(set_from(healthy(40), 36, mismatch__kl=0.2, mismatch__max_abs=12.0)), "mismatch")
    assert f.severity == "critical" and f.evidence["max_abs_logprob_gap"] == 12.0


def test_mismatch_on_stale_batches_uses_the_stale_thresholds() -> None:
    """A stale batch's gap includes the policy's movement: 0.03 is healthy at k >= 1 (healthy runs <= 0.025 in
    5-step means), 0.3 is the collapsing run's level."""
    h = set_from(healthy(40), 1, async__staleness_max=2.0)
    assert not [f for f in check(set_from(h, 36, mismatch__kl=0.03)) if f.name == "mismatch"]
    assert severity(set_from(h, 36, mismatch__kl=0.08), "mismatch") == "warning"
    f = only(check(set_from(h, 36, mismatch__kl=0.3)), "mismatch")
    assert f.severity == "critical" and f.evidence["staleness_max"] == 2.0 and "overshoot" in f.message


def test_off_policy_ess_warning_critical_and_cause() -> None:
    h = set_from(healthy(40), 1, behaviour__ess=0.95)
    assert not [f for f in check(h) if f.name == "off_policy_ess"]
    stale = set_from(set_from(h, 1, async__staleness_mean=2.0), 36, behaviour__ess=0.2)
    f = only(check(stale), "off_policy_ess")
    assert f.severity == "warning" and f.evidence["staleness"] == 2.0 and "max_staleness" in f.suggestion
    f = only(check(set_from(h, 36, behaviour__ess=0.05)), "off_policy_ess")
    assert f.severity == "critical" and "sampler's log-probs differ" in f.message
    assert not [f for f in check(set_from(h, 38, behaviour__ess=0.05)) if f.name == "off_policy_ess"]  # 3 < 5


def test_length_explosion_only_without_accuracy_gain() -> None:
    flat = set_from(healthy(60), 1, accuracy=0.3)
    h = set_from(flat, 41, response_length__mean=320.0)
    f = only(check(h), "length_explosion")
    assert f.severity == "warning" and f.evidence["factor"] == pytest.approx(3.2, rel=0.1)
    learning = set_from(healthy(60), 41, response_length__mean=320.0, accuracy=0.8)
    assert not [f for f in check(learning) if f.name == "length_explosion"]


def test_length_collapse_warning_and_critical() -> None:
    assert severity(set_from(healthy(60), 41, response_length__mean=20.0), "length_collapse") == "warning"
    assert severity(set_from(healthy(60), 41, response_length__mean=1.0), "length_collapse") == "critical"


def test_truncation_surge_levels() -> None:
    f = only(check(set_from(healthy(60), 41, response_length__truncated_frac=0.95)), "truncation_surge")
    assert f.severity == "critical"
    assert (
        severity(set_from(healthy(60), 41, response_length__truncated_frac=0.6), "truncation_surge")
        == "warning"
    )
    high_from_start = set_from(healthy(60), 1, response_length__truncated_frac=0.85)
    assert only(check(high_from_start), "truncation_surge").severity == "info"


def test_a_surge_of_completions_cut_after_their_answer_is_a_warning_that_says_so() -> None:
    """As in configs/selfplay_countdown.toml's run: every completion cut, each after a complete, paid answer."""
    cut = set_from(healthy(60), 41, response_length__truncated_frac=1.0)
    paid = only(check(set_from(cut, 41, response_length__truncated_formatted_frac=0.97)), "truncation_surge")
    assert paid.severity == "warning" and "97% of them hold a well-formed answer" in paid.message
    assert "earn no reward" not in paid.message and "ending its turn" in paid.message
    lost = only(check(set_from(cut, 41, response_length__truncated_formatted_frac=0.1)), "truncation_surge")
    assert lost.severity == "critical" and "cut answers earn no reward" in lost.message


def test_repetition_levels() -> None:
    assert severity(set_from(healthy(40), 31, repetition__frac=0.7), "repetition") == "critical"
    assert severity(set_from(healthy(40), 31, repetition__frac=0.3), "repetition") == "warning"


def test_reward_collapse_after_a_gain() -> None:
    def rise_then(level: float):
        return lambda s: 0.2 + 0.5 * min(s, 50) / 50 if s <= 60 else level

    h = set_from(healthy(80), 1, reward__mean=rise_then(0.15))
    f = only(check(h), "reward_collapse")
    assert (f.severity, f.action) == ("critical", "rollback")
    assert f.evidence["best_reward"] == pytest.approx(0.7, abs=0.02)
    h = set_from(healthy(80), 1, reward__mean=rise_then(0.4))
    assert only(check(h), "reward_collapse").severity == "warning"
    # a flat run never gained anything, so it cannot collapse
    assert not [f for f in check(set_from(healthy(80), 1, reward__mean=0.3)) if f.name == "reward_collapse"]


def test_no_signal_levels_and_reason() -> None:
    assert severity(set_from(healthy(30), 1, groups__no_signal_frac=0.85), "no_signal") == "warning"
    f = only(check(set_from(healthy(30), 1, groups__no_signal_frac=1.0, reward__mean=0.0)), "no_signal")
    assert f.severity == "critical" and f.action == "warn" and "too hard" in f.message
    assert "rollout.group_size" in f.suggestion


def test_reward_hacking_reward_up_eval_down() -> None:
    h = healthy(100)
    for rec in h:
        s = rec["step"]
        if "reward/mean" in rec:
            rec["reward/mean"] = 0.2 + 0.7 * min(s, 60) / 60
        if "eval/accuracy" in rec:
            rec["eval/accuracy"] = 0.5 if s <= 60 else 0.3
    f = only(check(h), "reward_hacking")
    assert f.severity == "critical"
    assert f.evidence["eval_accuracy_best"] == pytest.approx(0.5)
    assert f.evidence["eval_accuracy"] == pytest.approx(0.3)
    assert f.steps == (60, 100)
    # the same eval drop while the reward falls back (still above its start) is a collapse, not hacking
    for rec in h:
        if "reward/mean" in rec and rec["step"] > 60:
            rec["reward/mean"] = 0.45
    assert not [f for f in check(h) if f.name == "reward_hacking"]


def test_reward_hacking_watches_the_learned_reward() -> None:
    """reward.model: the learned score (reward/model) rises while the verifier's held-out accuracy falls. The
    combined reward/mean stays flat here (the verifier's share falls as the learned one rises): the rule must
    read reward/model, and say the reward is learned."""
    h = healthy(100)
    for rec in h:
        s = rec["step"]
        if "reward/mean" in rec:
            rec["reward/mean"] = 0.3
            rec["reward/model"] = 0.5 + 4.0 * min(s, 60) / 60
        if "eval/accuracy" in rec:
            rec["eval/accuracy"] = 0.45 if s <= 60 else 0.1
    f = only(check(h), "reward_hacking")
    assert f.evidence["reward_now"] == pytest.approx(4.5) and f.evidence["reward_start"] < 1.0
    assert "learned reward (reward/model)" in f.message and "reward model" in f.suggestion
    # exploited from the first steps: the best eval is the initial one (step 0, before any reward was logged)
    h0 = healthy(60)
    for rec in h0:
        if "reward/mean" in rec:
            rec["reward/model"] = -0.5 + 2.0 * min(rec["step"], 30) / 30
        if "eval/accuracy" in rec:
            rec["eval/accuracy"] = 0.3 if rec["step"] == 0 else 0.05
    f0 = only(check(h0), "reward_hacking")
    assert f0.evidence["eval_accuracy_best"] == pytest.approx(0.3) and f0.steps[0] == 0
    # the learned reward flat while accuracy falls: not hacking (eval_regression's case)
    for rec in h:
        if "reward/model" in rec:
            rec["reward/model"] = 0.5
    assert not [x for x in check(h) if x.name == "reward_hacking"]


def test_reward_hacking_falls_back_to_train_accuracy_without_evals() -> None:
    h = [r for r in healthy(60) if "reward/mean" in r]
    for r in h:
        r.pop("eval/accuracy", None)
        r["reward/mean"] = 0.2 + 0.6 * r["step"] / 60
        r["accuracy"] = 0.5 - 0.4 * r["step"] / 60
    f = only(check(h), "reward_hacking")
    assert "accuracy_start" in f.evidence


def test_eval_regression_without_reward_rise() -> None:
    h = set_from(healthy(100), 1, reward__mean=lambda s: 0.3 + 0.01 * (s % 3))
    for rec in h:
        if "eval/accuracy" in rec and rec["step"] > 70:
            rec["eval/accuracy"] = 0.2
    found = check(h)
    f = only(found, "eval_regression")
    assert f.severity == "warning" and f.evidence["drop"] > 0.1
    assert not [x for x in found if x.name == "reward_hacking"]  # the reward did not rise
    # losing half of the best accuracy is critical (the rule's action, rollback, then applies)
    h3 = set_from(healthy(100), 1, reward__mean=lambda s: 0.3 + 0.01 * (s % 3))
    best = max(r["eval/accuracy"] for r in h3 if "eval/accuracy" in r)
    for rec in h3:
        if "eval/accuracy" in rec and rec["step"] > 70:
            rec["eval/accuracy"] = 0.4 * best
    f3 = only(check(h3), "eval_regression")
    assert f3.severity == "critical" and f3.action == "rollback"
    assert f.evidence["eval_accuracy"] > 0.5 * f.evidence["eval_accuracy_best"]  # the case above: a warning
    # one low eval is noise
    h2 = healthy(100)
    h2[-1]["eval/accuracy"] = 0.1
    assert not [x for x in check(h2) if x.name == "eval_regression"]


def test_throughput_drop() -> None:
    f = only(check(set_from(healthy(100), 81, throughput__tokens_per_s=300.0)), "throughput_drop")
    assert f.severity == "warning" and f.evidence["ratio"] == pytest.approx(0.3, abs=0.03)


def test_stalled_needs_running_state_and_long_silence() -> None:
    h = healthy(30)
    last = h[-1]["time"]
    t = CFG.stalled
    f = stalled(h, t, now=last + 600, last_write=last, state="running")
    assert f is not None and f.severity == "critical" and f.evidence["silent_s"] == pytest.approx(600, abs=1)
    assert stalled(h, t, now=last + 600, last_write=last, state="finished") is None
    assert stalled(h, t, now=last + 30, last_write=last, state="running") is None  # 15 steps of 2 s
    assert stalled(h, t, now=last + 600, last_write=last + 590, state="running") is None  # heartbeat


# ------------------------------------------------------------------------- engine and config


def test_scan_reports_step_ranges_and_ongoing() -> None:
    h = set_from(healthy(100), 41, entropy=0.05)
    h = [dict(r, entropy=0.85) if r["step"] > 70 and "entropy" in r else r for r in h]
    f = only(scan(h), "entropy_collapse")
    # the range covers the windows that showed it: from the first window mostly after step 41 to the last
    # one mostly before step 71 (window = 10 steps)
    assert 31 <= f.steps[0] <= 41 and 70 <= f.steps[1] <= 80 and not f.ongoing
    f = only(scan(set_from(healthy(100), 41, entropy=0.05)), "entropy_collapse")
    assert f.ongoing and f.steps[1] == 100


def test_scan_agrees_with_live_check_at_the_end() -> None:
    h = set_from(healthy(80), 61, entropy=0.05, repetition__frac=0.8, groups__no_signal_frac=1.0)
    live = {f.name for f in check(h)}
    ongoing = {f.name for f in scan(h) if f.ongoing}
    assert live == ongoing == {"entropy_collapse", "repetition", "no_signal"}


def test_transient_incident_that_ended_is_downgraded() -> None:
    h = healthy(60)
    h[30]["grad_norm"] = 5.0
    f = only(scan(h), "grad_spike")
    assert f.severity == "warning" and f.steps == (30, 30) and not f.ongoing


def test_findings_sorted_most_severe_first() -> None:
    h = set_from(healthy(60), 41, entropy=0.18, groups__no_signal_frac=1.0)
    sev = [f.severity for f in scan(h)]
    assert sev == sorted(sev, key=lambda s: -SEVERITY_RANK[s])


def test_disabled_rule_and_custom_thresholds() -> None:
    h = set_from(healthy(40), 31, repetition__frac=0.3)
    cfg = GuardsConfig.model_validate({"repetition": {"enabled": False}})
    assert not [f for f in check(h, cfg) if f.name == "repetition"]
    cfg = GuardsConfig.model_validate({"repetition": {"critical_frac": 0.25, "action": "rollback"}})
    f = only(check(h, cfg), "repetition")
    assert (f.severity, f.action) == ("critical", "rollback")


def test_warnings_never_carry_a_drastic_action() -> None:
    cfg = GuardsConfig.model_validate({"entropy_collapse": {"action": "stop"}})
    h = set_from(healthy(60), 41, entropy=0.18)
    f = only(check(h, cfg), "entropy_collapse")
    assert f.severity == "warning" and f.action == "warn"
    assert strongest_action([f]) == "warn"
    h = set_from(healthy(60), 41, entropy=0.05)
    assert strongest_action(check(h, cfg)) == "stop"
    assert strongest_action([]) == "warn"


def test_config_rejects_unknown_keys_and_bad_actions() -> None:
    with pytest.raises(ValidationError):
        GuardsConfig.model_validate({"entropy_colapse": {}})
    with pytest.raises(ValidationError):
        GuardsConfig.model_validate({"kl_blowup": {"max_kl_ol": 1.0}})
    with pytest.raises(ValidationError):
        GuardsConfig.model_validate({"kl_blowup": {"action": "explode"}})


def test_every_rule_has_a_documented_config_section() -> None:
    # one name per rule: its registry key, its [guards] section, its function, its findings
    assert all(rule.__name__ == name for name, rule in RULES.items())
    rules = set(RULES) | {"stalled", "ratio_outlier"}
    assert rules <= set(GuardsConfig.model_fields)  # the trainer may add its own [guards] settings
    for name, fld in GuardsConfig.model_fields.items():
        assert fld.description, f"guards.{name} has no description"
    for name in rules:
        section = type(getattr(CFG, name))
        for sub, subfield in section.model_fields.items():
            assert subfield.description, f"guards.{name}.{sub} has no description"
        assert {"enabled", "action"} <= set(section.model_fields)


def test_finding_json_is_plain() -> None:
    h = healthy(30)
    h[-1]["grad_norm"] = "inf"
    d = only(check(h), "nonfinite").to_json()
    assert d["steps"] == [30, 30] and d["severity"] == "critical" and isinstance(d["evidence"], dict)


def test_zero_gradient_is_skipped_only_when_advantages_are_not_zero() -> None:
    from keelrl.guards.step import check_update

    cfg = GuardsConfig()
    # every group all-right or all-wrong: rewards vary across the batch, advantages are all 0, and so is the
    # gradient -- a correct update, not a broken one
    assert check_update([], 5, 0.0, 0.0, 1.0, 0.0, cfg) is None
    f = check_update([], 5, 0.0, 0.0, 1.0, 0.4, cfg)
    assert f is not None and (f.name, f.action) == ("exact_zero", "skip")


# -------------------------------------------------------------------------------- multi-turn episodes


def episodes(
    history: list[dict[str, Any]], error_rate: float = 0.05, out_of_turns: float = 0.1
) -> list[dict[str, Any]]:
    """A healthy run of an environment: a few failed tool calls, a few episodes out of turns."""
    return set_from(history, 1, episode__tool_error_rate=error_rate, episode__end__turns=out_of_turns)


def test_healthy_episodes_are_quiet_and_single_turn_runs_have_no_episode_findings() -> None:
    h = episodes(healthy())
    assert check(h) == [] and scan(h) == []


def test_tool_error_surge() -> None:
    h = episodes(healthy())
    surge = set_from(h, 90, episode__tool_error_rate=0.6)
    f = only(check(surge), "tool_error_surge")
    assert f.severity == "warning" and f.evidence["tool_error_rate"] == pytest.approx(0.6)
    assert severity(set_from(h, 90, episode__tool_error_rate=0.95), "tool_error_surge") == "critical"
    # high from the start: the model never learned the call format (info, not a surge)
    assert severity(episodes(healthy(), error_rate=0.7), "tool_error_surge") == "info"
    assert all(f.name != "tool_error_surge" for f in check(set_from(h, 90, episode__tool_error_rate=0.45)))


def test_turn_budget() -> None:
    h = episodes(healthy())
    f = only(check(set_from(h, 110, episode__end__turns=0.95)), "turn_budget")
    assert f.severity == "warning" and f.evidence["turns_frac"] == pytest.approx(0.95)
    assert all(f.name != "turn_budget" for f in check(set_from(h, 110, episode__end__turns=0.85)))


def test_grad_spike_leaves_sft_runs_to_loss_spike() -> None:
    """An SFT record (it has loss/nll) with a 30x gradient norm and a flat loss: no grad_spike finding."""
    h = [{**r, "grad_norm": 0.07} for r in sft_history(40)]
    spiked = [*h, {"step": 41, "loss/nll": h[-1]["loss/nll"], "grad_norm": 2.2}]
    assert grad_spike(spiked, CFG.grad_spike) is None
    rl = [{k: v for k, v in r.items() if k != "loss/nll"} for r in spiked]
    assert grad_spike(rl, CFG.grad_spike) is not None  # the same numbers in an RL run do fire


def test_spike_rules_leave_reward_model_steps_alone() -> None:
    """A reward model's pair loss and gradient norm are heavy-tailed near convergence (measured: robust z up
    to 15.5 in healthy runs): check_update with pair_nll skips neither rule's way; nonfinite still fires."""
    from keelrl.guards.rules import GuardsConfig
    from keelrl.guards.step import check_update

    history = [
        {"step": s, "loss/pair_nll": 0.05 + 0.001 * (s % 3), "grad_norm": 0.3 + 0.01 * (s % 3)}
        for s in range(30)
    ]
    cfg = GuardsConfig()
    assert check_update(history, 30, 0.5, 6.0, 0.0, 1.0, cfg, pair_nll=0.5) is None
    f = check_update(history, 30, 0.5, 6.0, 0.0, 1.0, cfg)  # the same step as an RL record: a gradient spike
    assert f is not None and f.name == "grad_spike"
    f = check_update(history, 30, float("nan"), 6.0, 0.0, 1.0, cfg, pair_nll=float("nan"))
    assert f is not None and f.name == "nonfinite"


# -------------------------------------------------------------------------------- self-play's proposer


def selfplay(
    history: list[dict[str, Any]], valid: float = 0.4, dup: float = 0.05, solve: float = 0.5
) -> list[dict[str, Any]]:
    """A healthy self-play run: many valid proposals, few duplicates, new problems solved about half the time."""
    return set_from(
        history, 1, selfplay__valid_frac=valid, selfplay__duplicate_frac=dup, selfplay__new_solve_rate=solve
    )


def test_healthy_selfplay_is_quiet_and_other_runs_have_no_proposer_findings() -> None:
    h = selfplay(healthy())
    assert check(h) == [] and scan(h) == []
    assert all(f.name not in ("proposer_collapse", "proposal_difficulty") for f in check(healthy()))


def test_proposer_collapse() -> None:
    h = selfplay(healthy())
    f = only(check(set_from(h, 100, selfplay__duplicate_frac=0.36)), "proposer_collapse")  # 0.36 / 0.4 = 90%
    assert f.severity == "warning" and f.evidence["duplicate_share"] == pytest.approx(0.9)
    assert all(
        f.name != "proposer_collapse" for f in check(set_from(h, 100, selfplay__duplicate_frac=0.28))
    )  # 70%
    # nearly nothing valid: duplicates of nothing are not a collapse (no finding from this rule)
    rare = set_from(h, 100, selfplay__valid_frac=0.02, selfplay__duplicate_frac=0.02)
    assert all(f.name != "proposer_collapse" for f in check(rare))


def test_proposal_difficulty_trivial_and_hopeless() -> None:
    h = selfplay(healthy())
    trivial = only(check(set_from(h, 100, selfplay__new_solve_rate=0.97)), "proposal_difficulty")
    assert "trivial" in trivial.message and trivial.evidence["new_solve_rate"] == pytest.approx(0.97)
    hopeless = only(check(set_from(h, 100, selfplay__new_solve_rate=0.02)), "proposal_difficulty")
    assert "too hard" in hopeless.message
    assert all(f.name != "proposal_difficulty" for f in check(set_from(h, 100, selfplay__new_solve_rate=0.9)))
