"""What every guard rule is built from: the metric records it reads (tolerantly: missing keys, eval-only
records and "nan"/"inf" strings), the `Finding` it returns, and the base of its thresholds model."""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["info", "warning", "critical"]
Action = Literal["warn", "skip", "rollback", "stop"]
Record = Mapping[str, Any]

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}
ACTION_RANK: dict[str, int] = {"warn": 0, "skip": 1, "rollback": 2, "stop": 3}

# Records a rule looks back over at most (rules needing "the best so far", e.g. reward_collapse). Bounds the
# cost of one call on a very long run; 5,000 steps is longer than any eval interval or collapse we know of.
MAX_LOOKBACK = 5000

TRAIN_KEYS = ("loss/total", "loss/policy", "grad_norm", "reward/mean")


@dataclass(frozen=True)
class Finding:
    """One diagnosis. `steps`: (first, last) step of the evidence (numbers only); `action`: what the live
    trainer should do; `samples`: rollouts the doctor quotes; `ongoing`: still holds at the last record."""

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
        """As JSON data: lists for the tuples, a non-finite evidence number as a string ("inf")."""
        return {
            **asdict(self),
            "steps": list(self.steps),
            "evidence": {k: v if math.isfinite(v) else str(v) for k, v in self.evidence.items()},
            "samples": list(self.samples),
        }


def metric_value(record: Record, key: str) -> float | None:
    """The record's value for `key` as a float (run_dir's "nan", "inf", "-inf" too); None if not a number."""
    v = record.get(key)
    if isinstance(v, (int, float)):  # bools too
        return float(v)
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return float(v)  # accepts "nan", "inf", "-inf", "Infinity"
    return None


def num(x: Any, default: float = 0.0) -> float:
    """x as a float when it is a number (not a bool), else default."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else default


def step_of(record: Record, default: int) -> int:
    """The record's step (a whole number), else `default`."""
    return int(num(record.get("step"), default))


def is_train_record(record: Record) -> bool:
    """A record of a training step (not an eval-only record such as step 0's initial eval)."""
    return any(k in record for k in TRAIN_KEYS)


def tail(history: Sequence[Record], key: str, n: int, limit: int | None = None) -> list[tuple[int, float]]:
    """The last `n` finite (step, value) pairs of `key`, oldest first, within `limit` records (4n + 20)."""
    limit = 4 * n + 20 if limit is None else limit
    return _finite(history, key, n, range(len(history) - 1, max(-1, len(history) - 1 - limit), -1))[::-1]


def head(history: Sequence[Record], key: str, n: int) -> list[tuple[int, float]]:
    """The first `n` finite (step, value) pairs of `key` (a run's starting level), within 4n + 20 records."""
    return _finite(history, key, n, range(min(len(history), 4 * n + 20)))


def _finite(history: Sequence[Record], key: str, n: int, indices: range) -> list[tuple[int, float]]:
    """The first `n` finite (step, value) pairs of `key` over the records at `indices`, in that order."""
    out: list[tuple[int, float]] = []
    for i in indices:
        v = metric_value(history[i], key)
        if v is not None and math.isfinite(v):
            out.append((step_of(history[i], i), v))
            if len(out) == n:
                break
    return out


def mean_value(pairs: Sequence[tuple[int, float]]) -> float:
    return sum(v for _, v in pairs) / len(pairs)


def span(pairs: Sequence[tuple[int, float]]) -> tuple[int, int]:
    return (pairs[0][0], pairs[-1][0])


def robust_z(value: float, window: Sequence[float]) -> float:
    """(value - median) / (1.4826 * MAD) of `window`: a z-score few outliers do not inflate (1.4826 makes
    the MAD estimate a normal std). A zero MAD is floored at 1e-3 of the median (repeats stay finite)."""
    med = statistics.median(window)
    mad = statistics.median(abs(x - med) for x in window)
    scale = 1.4826 * max(mad, 1e-3 * abs(med), 1e-12)
    return (value - med) / scale


def _r(x: float, digits: int = 4) -> float:
    """Round for evidence: 4 significant digits."""
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))


ACTION_DOC = (
    "What the trainer does when this rule reports a critical finding: warn (log an event), skip (drop this "
    "step's update), rollback (return to the newest healthy checkpoint), stop (end the run). Warnings are "
    "only logged."
)


class RuleThresholds(BaseModel):
    """A rule's [guards.<name>] section: `enabled`, `action` (default "warn"), then the rule's thresholds."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(True, description="Evaluate this rule (live in the trainer and in keelrl doctor).")
    action: Action = Field("warn", description=ACTION_DOC)


def finding(
    name: str,
    severity: Severity,
    steps: tuple[int, int],
    evidence: dict[str, float],
    message: str,
    suggestion: str,
    action: Action,
) -> Finding:
    """A rule's Finding: evidence rounded to 4 significant digits, and `action` kept only when critical."""
    return Finding(
        name=name,
        severity=severity,
        steps=steps,
        evidence={k: _r(float(v)) for k, v in evidence.items()},
        message=message,
        suggestion=suggestion,
        action=action if severity == "critical" else "warn",
    )


def start_and_now(
    history: Sequence[Record], key: str, baseline_steps: int, window: int
) -> tuple[float, float, list[tuple[int, float]]] | None:
    """(mean of the first `baseline_steps` values of `key`, of the last `window`, those pairs); None until
    both are full and do not overlap."""
    base = head(history, key, baseline_steps)
    cur = tail(history, key, window)
    if len(base) < baseline_steps or len(cur) < window or cur[0][0] <= base[-1][0]:
        return None
    return mean_value(base), mean_value(cur), cur


@dataclass(frozen=True)
class Rise:
    """A rule on a level that matters once it has risen: the mean of `key` over the thresholds' last `window`
    steps is at least their `levels[0]` field and `min_rise` above the mean of their first `baseline_steps`, a
    warning, critical from the `levels[1]` field on. A level that high without the rise is `flat`'s info
    finding, or none. `message` and `flat` are str.format templates of start, now, first and last (the
    window's steps); `evidence` names the mean now, and prefixed with start_ the starting mean."""

    name: str
    key: str
    levels: tuple[str, str]
    evidence: str
    message: str
    suggestion: str
    flat: str | None = None

    @property
    def __name__(self) -> str:  # as a rule function's: its name in RULES and in its findings
        return self.name

    def __call__(self, history: Sequence[Record], t: Any) -> Finding | None:
        if (got := start_and_now(history, self.key, t.baseline_steps, t.window)) is None:
            return None
        start, now, cur = got
        warn, critical = (getattr(t, level) for level in self.levels)
        risen = now - start >= t.min_rise
        template = self.message if risen else self.flat
        if now < warn or template is None:
            return None
        severity: Severity = ("critical" if now >= critical else "warning") if risen else "info"
        message = template.format(start=start, now=now, first=cur[0][0], last=cur[-1][0])
        evidence = {self.evidence: now, f"start_{self.evidence}": start}
        return finding(self.name, severity, span(cur), evidence, message, self.suggestion, t.action)
