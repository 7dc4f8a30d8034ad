"""Per-step checks: `check_update` judges one update before the optimizer applies it (a non-finite loss or
gradient, a gradient-norm or SFT loss spike, an exactly-zero gradient while advantages are not, an
importance ratio far outside the trust region): the windowed rules of rules/numerics.py, applied to the
update about to happen.
"""

from __future__ import annotations

from collections.abc import Sequence

from keelrl.guards.base import Finding, Record, finding
from keelrl.guards.rules import GuardsConfig
from keelrl.guards.rules.episode import unscored_episodes
from keelrl.guards.rules.numerics import grad_spike, loss_spike, nonfinite, ratio_outlier


def check_batch(history: Sequence[Record], step: int, metrics: Record, cfg: GuardsConfig) -> Finding | None:
    """Judged on a scored batch before its update: a finding when the update must not be made, because most of
    the batch's episodes have no reward (`unscored_episodes`, any action but warn) or none has one (always)."""
    found = None
    if cfg.enabled and cfg.unscored_episodes.enabled:
        found = unscored_episodes([*history, {"step": step, **metrics}], cfg.unscored_episodes)
    if found is not None and found.action != "warn":
        return found
    if metrics.get("episode/error_frac") == 1.0:
        return found or unscored_episodes(
            [{"step": step, **metrics}], cfg.unscored_episodes.model_copy(update={"max_frac": 0.0})
        )
    return None


def check_update(
    history: Sequence[Record],
    step: int,
    loss: float,
    grad_norm: float,
    ratio_max: float,
    advantage_abs_mean: float,
    cfg: GuardsConfig,
    nll: float | None = None,
    pair_nll: float | None = None,
    grad_key: str = "grad_norm",
) -> Finding | None:
    """The finding that says to skip this update, or None (always, with guards off). `nll`: SFT's per-token
    loss, judged by loss_spike; `pair_nll`: a reward model's per-pair loss (neither spike rule judges it);
    `grad_key`: the history's norm that `grad_norm` is like ("grad_norm/max" for one of a step's mini-batches)."""
    if not cfg.enabled:
        return None
    rec = {"step": step, "loss/total": loss, grad_key: grad_norm}
    if nll is not None:
        rec["loss/nll"] = nll
    if pair_nll is not None:
        rec["loss/pair_nll"] = pair_nll
    # Both rules report critical findings only.
    if cfg.nonfinite.enabled and (f := nonfinite([rec], cfg.nonfinite)) is not None:
        return f
    if cfg.grad_spike.enabled and (f := grad_spike([*history, rec], cfg.grad_spike, grad_key)) is not None:
        return f
    if cfg.loss_spike.enabled and (f := loss_spike([*history, rec], cfg.loss_spike)) is not None:
        return f
    # Judged on the advantages, not on the batch's rewards: groups that are each all-right or all-wrong make
    # rewards vary across the batch with every advantage 0, and a zero gradient is then correct (measured:
    # judging reward/std skipped such SmolLM2 steps and escalated them to a pointless rollback).
    if cfg.exact_zero.enabled and grad_norm == 0.0 and advantage_abs_mean > 1e-9:
        return finding(
            "exact_zero",
            "critical",
            (step, step),
            {"grad_norm": 0.0, "advantage_abs_mean": advantage_abs_mean},
            "the gradient is exactly zero although advantages are not: the update computes nothing",
            "check that the policy is trainable (requires_grad) and that advantages reach the loss",
            "skip",
        )
    return ratio_outlier(step, ratio_max, cfg.ratio_outlier) if cfg.ratio_outlier.enabled else None
