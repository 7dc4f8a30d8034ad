"""Rules on the run as a process: throughput falling, and a run that has stalled (doctor only: it needs the
clock and status.json)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from pydantic import Field

from keelrl.guards.base import Finding, Record, RuleThresholds, finding, span, tail

RUNNING_STATES = ("running", "restarting")  # status.json states of a run that should still be writing


class ThroughputDropThresholds(RuleThresholds):
    """Tokens per second fell well below the run's earlier level."""

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


def throughput_drop(history: Sequence[Record], t: ThroughputDropThresholds) -> Finding | None:
    """Median tokens/s of the last `window` steps below a fraction of the `reference` steps before."""
    series = tail(history, "throughput/tokens_per_s", t.window + t.reference)
    if len(series) < t.window + max(5, t.reference // 2):
        return None
    cur, ref = series[-t.window :], series[: -t.window]
    now, before = statistics.median(v for _, v in cur), statistics.median(v for _, v in ref)
    if before <= 0 or now >= t.min_ratio * before:
        return None
    return finding(
        "throughput_drop",
        "warning",
        span(cur),
        {"tokens_per_s": now, "tokens_per_s_before": before, "ratio": now / before},
        f"Throughput fell to {now:.4g} tokens/s over steps {cur[0][0]}-{cur[-1][0]}, {now / before:.0%} of the earlier "
        f"{before:.4g}.",
        "Check for other jobs on the machine, memory pressure or swapping, and a slower sampler "
        "(time/gen_s vs time/train_s); rollout.chunk_size and train.micro_batch_size trade memory for speed.",
        t.action,
    )


class StalledThresholds(RuleThresholds):
    """A running run has written no metrics for far longer than a step takes (doctor only)."""

    # Measured: the longest healthy gap between metric lines was 9.9x the median of the recent gaps (eval
    # steps and CPU contention included), so 20x leaves margin.
    factor: float = Field(
        20.0,
        gt=1.0,
        description="Stalled when silent for this many times the recent median gap between steps.",
    )
    min_seconds: float = Field(120.0, ge=0.0, description="And silent for at least this many seconds.")


def stalled(
    history: Sequence[Record], t: StalledThresholds, *, now: float, last_write: float, state: str | None
) -> Finding | None:
    """A running run silent since `last_write` for `factor` times its recent median step gap. Doctor only."""
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
    return finding(
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
