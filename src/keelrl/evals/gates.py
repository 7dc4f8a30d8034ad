"""Gates: pass/fail thresholds on eval results (`keelrl eval --gate`, `keelrl gate`); see `parse_gate`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from keelrl.config import ConfigError


class GateError(ConfigError):
    """A --gate expression cannot be parsed or refers to something the results do not have."""


GateOp = Literal[">=", ">", "<=", "<", "=="]
_GATE_RE = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][\w@/]*?)(?:\.(?P<bound>lo|hi))?\s*(?P<op>>=|<=|==|>|<)\s*(?P<rhs>[^<>=\s].*?)\s*$"
)
_UNSIGNED = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_RHS_RE = re.compile(rf"^(?:(?P<const>[+-]?{_UNSIGNED})|base(?:(?P<sign>[+-])(?P<offset>{_UNSIGNED}))?)$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda v, t: v >= t,
    ">": lambda v, t: v > t,
    "<=": lambda v, t: v <= t,
    "<": lambda v, t: v < t,
    "==": lambda v, t: math.isclose(v, t, rel_tol=0.0, abs_tol=1e-9),
}


@dataclass(frozen=True)
class Gate:
    """`metric[.lo|.hi] OP (NUMBER | base | base+NUMBER | base-NUMBER)`."""

    text: str
    metric: str
    bound: Literal["value", "lo", "hi"]
    op: GateOp
    number: float  # the threshold, or the offset added to the baseline's value when `relative`
    relative: bool


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    value: float
    threshold: float
    passed: bool

    def describe(self) -> str:
        what = self.gate.metric + ("" if self.gate.bound == "value" else f".{self.gate.bound}")
        return f"{'PASS' if self.passed else 'FAIL'} {self.gate.text}: {what} = {self.value:.4g}, threshold {self.threshold:.4g}"


def parse_gate(expr: str) -> Gate:
    """Parse a gate such as `accuracy>=0.45`, `pass@4>0.6`, `accuracy.lo>=0.4` (95% interval's lower end),
    `accuracy>=base-0.01` (a baseline's value - 0.01). Operators >=, >, <=, <, == (within 1e-9); GateError."""
    m = _GATE_RE.match(expr)
    if m is None:
        raise GateError(
            f"cannot parse gate {expr!r}: write METRIC OP VALUE, e.g. 'accuracy>=0.45', 'pass@4>0.6', "
            "'accuracy.lo>=0.4' or 'accuracy>=base-0.01', with OP one of >=, >, <=, <, == "
            "(quote it in the shell: --gate 'accuracy>=0.45')"
        )
    rhs = _RHS_RE.match(m.group("rhs").replace(" ", ""))
    if rhs is None:
        raise GateError(
            f"gate {expr!r}: the right-hand side {m.group('rhs')!r} must be a number (0.45), 'base', "
            "'base+NUMBER' or 'base-NUMBER'"
        )
    if rhs.group("const") is not None:
        number, relative = float(rhs.group("const")), False
    else:
        offset = float(rhs.group("offset") or 0.0)
        number, relative = (-offset if rhs.group("sign") == "-" else offset), True
    return Gate(expr.strip(), m.group("metric"), m.group("bound") or "value", m.group("op"), number, relative)  # type: ignore[arg-type]


def _metrics_of(results: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = results.get("metrics")
    return inner if isinstance(inner, Mapping) else results


def _metric_number(metrics: Mapping[str, Any], name: str, bound: str, where: str) -> float:
    if name not in metrics:
        available = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float, Mapping))))
        raise GateError(f"gate metric {name!r} is not in {where}; available: {available}")
    entry = metrics[name]
    if bound == "value":
        return float(entry["value"] if isinstance(entry, Mapping) else entry)
    ci = entry.get("ci95", entry.get("ci")) if isinstance(entry, Mapping) else None
    if ci is None:
        raise GateError(f"gate on {name}.{bound}: {where} has no interval for {name}")
    return float(ci[0] if bound == "lo" else ci[1])


def check_gate(
    gate: Gate | str, results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> GateResult:
    """Evaluate a gate against results (an eval summary/JSON with "metrics", or a flat {name: value or
    {"value", "ci95"}} mapping). `base` refers to the same metric's value in `baseline`."""
    g = parse_gate(gate) if isinstance(gate, str) else gate
    value = _metric_number(_metrics_of(results), g.metric, g.bound, "the results")
    if g.relative:
        if baseline is None:
            raise GateError(
                f"gate {g.text!r} compares with 'base' but no baseline was given (--baseline FILE.json)"
            )
        threshold = _metric_number(_metrics_of(baseline), g.metric, "value", "the baseline") + g.number
    else:
        threshold = g.number
    return GateResult(g, value, threshold, _OPS[g.op](value, threshold))


def check_gates(
    gates: Sequence[Gate | str], results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> list[GateResult]:
    return [check_gate(g, results, baseline) for g in gates]
