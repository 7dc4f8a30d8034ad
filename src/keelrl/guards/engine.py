"""The rule engine: the trainer calls `check(history, cfg)` every step and acts on what it returns through a
`Guardian`; `keelrl doctor` calls `scan(history, cfg)` on a run's metrics.jsonl for the same findings with
the step ranges where they held.

Severity and action: a rule reports "info", "warning" (logged) or "critical"; only a critical finding
carries the rule's configured `action`, the others carry "warn". After each step `Guardian.after_step`
runs every rule -> warn / rollback / stop ("skip" only warns there: the update is already applied; step.py
did the skipping). Too many skips within guards.skip_window escalate to a rollback. The guardian's memory
is a JSON dict in TrainState.guards, so it survives restarts and rollbacks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

from keelrl.guards.base import ACTION_RANK, SEVERITY_RANK, Action, Finding, Record, RuleThresholds, step_of
from keelrl.guards.rules import POINTWISE, RULES, TRANSIENT, GuardsConfig, RuleFn

# Stretches of one rule separated by at most this many steps are reported as one.
MERGE_GAP = 5


def check(history: Sequence[Record], cfg: GuardsConfig | None = None) -> list[Finding]:
    """Live use, once per step: every enabled rule on the latest window of `history`; most severe first."""
    cfg = cfg or GuardsConfig()
    found = [f for name, rule, t in _enabled(cfg) if (f := rule(history, t)) is not None]
    return sorted(found, key=lambda f: -SEVERITY_RANK[f.severity])


def _enabled(cfg: GuardsConfig) -> list[tuple[str, RuleFn, RuleThresholds]]:
    return [(name, rule, t) for name, rule in RULES.items() if (t := getattr(cfg, name)).enabled]


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


@dataclass
class _Open:
    worst: Finding
    last_step: int
    first_step: int
    last_point: int
    hits: int = 1


def scan(history: Sequence[Record], cfg: GuardsConfig | None = None, max_points: int = 500) -> list[Finding]:
    """Doctor use: replay the rules over a whole history; one finding per stretch where a rule held (evidence
    and message from its worst point, the latest among equals). Windowed rules are judged at most
    `max_points` times (evenly spaced), pointwise ones at every record. An ended stretch of a TRANSIENT rule
    is reported one severity lower. Most severe first."""
    cfg = cfg or GuardsConfig()
    records = list(history)
    n = len(records)
    if n == 0:
        return []
    stride = max(1, math.ceil(n / max_points))
    open_: dict[str, _Open] = {}
    done: list[Finding] = []
    rules = _enabled(cfg)
    for end in range(1, n + 1):
        judged = end == n or (end - 1) % stride == stride - 1
        point = end - 1
        view = _Prefix(records, end)
        for name, rule, t in rules:
            if name not in POINTWISE and not judged:
                continue
            f = rule(view, t)
            cur = open_.get(name)
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
                done.append(_close(cur, n))
            open_[name] = _Open(worst=f, last_step=f.steps[1], first_step=f.steps[0], last_point=point)
    done += [_close(cur, n) for cur in open_.values()]
    last_step = step_of(records[-1], n - 1)
    done = [replace(f, ongoing=f.steps[1] >= last_step and f.ongoing) for f in done]
    return sorted(done, key=lambda f: (-SEVERITY_RANK[f.severity], not f.ongoing, f.steps[0]))


def _close(cur: _Open, n: int) -> Finding:
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


class Guardian:
    """Turns findings into decisions and remembers what it decided (state: a JSON dict)."""

    def __init__(self, cfg: GuardsConfig, state: dict[str, Any]) -> None:
        self.cfg = cfg
        self.state = state
        fresh = {"skipped_steps": 0, "recent_skips": [], "rollbacks": 0, "lr_scale": 1.0, "active": {}}
        for key, value in fresh.items():
            state.setdefault(key, value)

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
        return ("warn" if action == "skip" else action), changed, findings

    @property
    def healthy(self) -> bool:
        """No rollback or stop is called for: a checkpoint now is a valid rollback target (warnings and
        applied skips do not make it unhealthy)."""
        return not any(action in ("rollback", "stop") for _, action in self.state["active"].values())

    def can_roll_back(self) -> bool:
        return self.state["rollbacks"] < self.cfg.max_rollbacks
