"""`keelrl report RUN_DIR [-o report.html] [--compare RUN2 ...]`: one self-contained HTML page per run.

It opens offline: inline SVG plots drawn here (no plotting library, no JavaScript), inline styles. At the
top, the doctor's findings; then plots of the shared metric names (DESIGN.md) with restarts, resumes,
rollbacks, skips and faults marked at their step; then sampled rollouts by step. With --compare every plot
overlays the runs, each with its own findings and headline. Every string from a run is HTML-escaped.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keelrl.guards.base import metric_value
from keelrl.monitor.doctor import Diagnosis, RunData, diagnose, load_run

# (title, metric keys, y-axis label). The order is the page order.
PLOTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Reward", ("reward/mean",), "mean reward"),
    ("Accuracy", ("accuracy", "eval/accuracy", "format_rate"), "fraction"),
    ("Entropy", ("entropy",), "nats / token"),
    ("KL", ("kl/old", "kl/ref", "mismatch/kl"), "nats / token"),
    ("Clip fractions", ("clipfrac/low", "clipfrac/high"), "fraction of tokens"),
    ("Gradient norm", ("grad_norm",), "L2 norm (before clipping)"),
    ("Response length", ("response_length/mean", "response_length/max"), "tokens"),
    ("Truncation and repetition", ("response_length/truncated_frac", "repetition/frac"), "fraction"),
    ("No-signal groups", ("groups/no_signal_frac",), "fraction of groups"),
    ("Throughput", ("throughput/tokens_per_s",), "generated tokens / s"),
    ("Step time", ("time/gen_s", "time/score_s", "time/train_s", "time/step_s"), "seconds"),
    ("Learning rate", ("lr",), "lr"),
)

# Shown only when a run logs their first key (the others may be shared, e.g. eval/accuracy).
OPTIONAL_PLOTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Critic (algo.advantage = gae)", ("critic/value_loss", "critic/explained_variance"), "loss / fraction"),
    ("Off-policy correction", ("behaviour/ess", "behaviour/cut_frac"), "fraction"),
    ("Asynchronous sampling: waits", ("time/trainer_wait_s", "time/sampler_wait_s"), "seconds per step"),
    ("Asynchronous sampling: staleness", ("async/staleness_mean", "async/staleness_max"), "policy versions"),
    ("Supervised loss (train.stage = sft)", ("loss/nll", "eval/loss"), "nats / token"),
    ("Reward model (train.stage = rm): pair loss", ("loss/pair_nll", "eval/loss"), "nats / pair"),
    ("Reward model (train.stage = rm): pair accuracy", ("rm/accuracy", "eval/accuracy"), "fraction of pairs"),
    # reward.model: the learned reward beside the verifier's held-out accuracy (what reward_hacking compares)
    (
        "Learned reward (reward.model) and the verifier's held-out accuracy",
        ("reward/model", "reward/verifier", "eval/accuracy"),
        "raw score / reward / fraction",
    ),
)

# Run-dependent metric families (title, key prefix, key suffix, y-axis label): after PLOTS, a series per key.
FAMILY_PLOTS: tuple[tuple[str, str, str, str], ...] = (
    ("Curriculum: estimated pass rate per bucket", "curriculum/pass_rate/", "", "pass rate (posterior mean)"),
    ("Curriculum: sampling weight per bucket", "curriculum/weight/", "", "share of prompts"),
    ("Task mixture: accuracy per task", "task/", "/accuracy", "fraction"),
    ("Search behaviour on held-out evals (task.behaviour)", "eval/search/", "", "mean per completion"),
)

# Event kinds drawn on the step axis, with their colour.
EVENT_COLORS = {
    "restart": "#d62728",
    "resume": "#9467bd",
    "rollback": "#ff7f0e",
    "skip": "#8c564b",
    "fault": "#e377c2",
    "guard": "#bcbd22",
    "checkpoint_failed": "#7f7f7f",
}
RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
DASHES = ("", "6 3", "2 2", "8 3 2 3")
MAX_POINTS = 1500  # per series; longer series keep each bucket's min and max
SEVERITY_COLORS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (step, value); non-finite values break the line
    color: str
    dash: str = ""
    dots: bool = False
    band: list[tuple[float, float, float]] = field(default_factory=list)  # (x, lo, hi): a shaded interval


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _tick_label(v: float, step: float) -> str:
    """A tick value with just enough decimals to tell neighbouring ticks `step` apart."""
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.2g}"
    decimals = next((d for d in range(10) if abs(round(step, d) - step) <= abs(step) * 1e-6), 10)
    return f"{v:.{decimals}f}"


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most ~MAX_POINTS points: each bucket keeps its min and max (spikes stay visible)."""
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        finite = [p for p in bucket if math.isfinite(p[1])]
        if len(finite) < len(bucket):
            out.append(next(p for p in bucket if not math.isfinite(p[1])))
        if finite:
            lo, hi = min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1])
            out.extend(sorted({lo, hi}))
    return out


def svg_plot(
    title: str,
    series: Sequence[Series],
    markers: Sequence[tuple[float, str, str]] = (),
    y_label: str = "",
    width: int = 470,
    height: int = 250,
    x_label: str = "step",
    log_x: bool = False,
) -> str:
    """An inline SVG line plot with (step, kind, tooltip) `markers`; non-finite values: red top crosses.
    `log_x`: x drawn on a log10 scale (positive x only), e.g. compute in a scaling ladder."""
    if log_x:
        lg = math.log10
        series = [
            Series(s.label, [(lg(x), y) for x, y in s.points if x > 0], s.color, s.dash, s.dots,
                   [(lg(x), lo, hi) for x, lo, hi in s.band if x > 0])
            for s in series
        ]  # fmt: skip
        markers = [(lg(x), k, t) for x, k, t in markers if x > 0]
    left, right, top, bottom = 62, 12, 28, 40
    pw = width - left - right
    legend, rows = _legend_layout(series, pw)
    height += 14 * rows
    ph = height - top - bottom - 14 * rows
    finite = [(x, y) for s in series for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
    finite += [(x, v) for s in series for x, lo, hi in s.band for v in (lo, hi)]
    drawn = sum(1 for s in series if any(math.isfinite(y) for _, y in s.points))
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-title="{_esc(title)}" data-series="{drawn}" role="img">',
        f"<title>{_esc(title)}</title>",
        f'<text x="{left}" y="17" class="ptitle">{_esc(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>',
    ]
    if not finite:
        parts.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" class="empty" text-anchor="middle">not logged</text>'
        )
        parts.append("</svg>")
        return "".join(parts)
    xs = [x for x, _ in finite] + [m[0] for m in markers]
    ys = [y for _, y in finite]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(ys), max(ys)
    pad = (abs(y0) * 0.1 or 1.0) if y1 == y0 else (y1 - y0) * 0.06
    y0, y1 = y0 - pad, y1 + pad
    if min(ys) >= 0 and y0 < 0:
        y0 = 0.0  # non-negative metrics (fractions, norms, lengths) keep 0 as the floor

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    yticks = nice_ticks(y0, y1)
    ystep = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    for t in yticks:
        y = sy(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 5}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_tick_label(t, ystep)}</text>'
        )
    xticks = nice_ticks(x0, x1, 6)
    xstep = xticks[1] - xticks[0] if len(xticks) > 1 else 1.0
    for t in xticks:
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" class="grid"/>')
        label = f"{10**t:.2g}" if log_x else _tick_label(t, xstep)
        parts.append(
            f'<text x="{x:.1f}" y="{top + ph + 15}" class="tick" text-anchor="middle">{label}</text>'
        )
    parts.append(
        f'<text x="{left + pw / 2}" y="{top + ph + 29}" class="axis" text-anchor="middle">{_esc(x_label)}</text>'
    )
    parts.append(
        f'<text x="12" y="{top + ph / 2}" class="axis" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + ph / 2})">{_esc(y_label)}</text>'
    )
    for step, kind, tip in markers:
        x = sx(step)
        color = EVENT_COLORS.get(kind, "#555")
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="{color}" class="event" '
            f'data-kind="{_esc(kind)}"><title>{_esc(tip)}</title></line>'
        )
    for s in series:
        if s.band:
            outline = [(x, hi) for x, _, hi in s.band] + [(x, lo) for x, lo, _ in reversed(s.band)]
            poly = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in outline)
            parts.append(
                f'<polygon class="band" points="{poly}" fill="{s.color}" fill-opacity="0.18" stroke="none"/>'
            )
        pts = _thin(s.points)
        segment: list[str] = []
        segments: list[list[str]] = []
        for x, y in pts:
            if math.isfinite(y):
                segment.append(f"{sx(x):.1f},{sy(y):.1f}")
            else:
                parts.append(
                    f'<text x="{sx(x):.1f}" y="{top + 9}" class="nonfinite" text-anchor="middle">×'
                    f"<title>{_esc(s.label)} = {_esc(y)} at step {x:g}</title></text>"
                )
                if segment:
                    segments.append(segment)
                segment = []
        if segment:
            segments.append(segment)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        for seg in segments:
            if len(seg) == 1 or s.dots:
                for p in seg:
                    cx, cy = p.split(",")
                    parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.6" fill="{s.color}" class="dot"/>')
            if len(seg) > 1:
                parts.append(
                    f'<polyline class="series" fill="none" stroke="{s.color}" stroke-width="1.6"{dash} '
                    f'points="{" ".join(seg)}"><title>{_esc(s.label)}</title></polyline>'
                )
    base = top + ph + bottom
    for s, (dx, row) in legend:
        lx, ly = left + dx, base + 14 * row
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        parts.append(
            f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 16}" y2="{ly - 4}" stroke="{s.color}" stroke-width="2"{dash}/>'
        )
        parts.append(f'<text x="{lx + 20}" y="{ly}" class="legend">{_esc(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend_layout(series: Sequence[Series], width: int) -> tuple[list[tuple[Series, tuple[int, int]]], int]:
    """Legend entries (series with data) laid out left to right, wrapping at `width`: ((x, row) each, rows)."""
    out: list[tuple[Series, tuple[int, int]]] = []
    x = row = 0
    for s in series:
        if not any(math.isfinite(y) for _, y in s.points):
            continue
        w = 28 + 6 * len(s.label)
        if x and x + w > width:
            x, row = 0, row + 1
        out.append((s, (x, row)))
        x += w
    return out, (row + 1 if out else 0)


def _series_points(metrics: Sequence[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    out = []
    for r in metrics:
        v = metric_value(r, key)
        s = r.get("step")
        if v is not None and isinstance(s, (int, float)):
            out.append((float(s), v))
    return out


def _markers(run: RunData, tag: str) -> list[tuple[float, str, str]]:
    out = []
    for e in run.events:
        kind = str(e.get("kind", ""))
        step = e.get("step")
        if kind in EVENT_COLORS and isinstance(step, (int, float)) and step >= 0:
            detail = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "step", "kind"))
            out.append(
                (float(step), kind, f"{tag}{kind} at step {step:g}" + (f": {detail}" if detail else ""))
            )
    prev = 0.0
    for r in run.metrics:
        v = metric_value(r, "guard/skipped_steps")
        if v is not None and math.isfinite(v) and v > prev and isinstance(r.get("step"), (int, float)):
            out.append(
                (
                    float(r["step"]),
                    "skip",
                    f"{tag}skipped update at step {r['step']} (guard/skipped_steps={v:g})",
                )
            )
            prev = v
    return out


def _plots(runs: Sequence[tuple[str, RunData]]) -> list[str]:
    plots = list(PLOTS)
    logged = {k for _, run in runs for m in run.metrics for k in m}
    plots += [(title, keys, y_label) for title, keys, y_label in OPTIONAL_PLOTS if keys[0] in logged]
    for title, prefix, suffix, y_label in FAMILY_PLOTS:
        keys = sorted(k for k in logged if k.startswith(prefix) and k.endswith(suffix))
        if keys:
            plots.append((title, tuple(keys), y_label))
    out = []
    compare = len(runs) > 1
    for title, keys, y_label in plots:
        series: list[Series] = []
        markers: list[tuple[float, str, str]] = []
        for ri, (name, run) in enumerate(runs):
            color_run = RUN_COLORS[ri % len(RUN_COLORS)]
            for ki, key in enumerate(keys):
                pts = _series_points(run.metrics, key)
                if not pts:
                    continue
                color = color_run if compare else RUN_COLORS[ki % len(RUN_COLORS)]
                dash = DASHES[ki % len(DASHES)] if compare else ""
                label = f"{name}: {key}" if compare else key
                series.append(Series(label, pts, color, dash, dots=key.startswith("eval/") or len(pts) < 3))
            markers += _markers(run, f"{name}: " if compare else "")
        out.append(svg_plot(title, series, markers, y_label))
    return out


def _headline_table(diags: Sequence[tuple[str, Diagnosis]]) -> str:
    def f(x: Any, spec: str = ".3f") -> str:
        return "-" if x is None else format(x, spec) if isinstance(x, float) else _esc(x)

    rows = [
        "<tr><th>run</th><th>verdict</th><th>state</th><th>steps</th><th>reward</th><th>accuracy</th>"
        "<th>eval accuracy (best)</th><th>tokens/s</th><th>restarts</th><th>resumes</th><th>rollbacks</th>"
        "<th>skipped</th></tr>"
    ]
    for name, d in diags:
        h = d.headline
        rows.append(
            f'<tr><td>{_esc(name)}</td><td class="v-{_esc(d.verdict)}">{_esc(d.verdict)}</td><td>{_esc(h["state"])}</td>'
            f"<td>{h['steps']}</td><td>{f(h['reward_start'])} → {f(h['reward_end'])}</td>"
            f"<td>{f(h['accuracy_start'])} → {f(h['accuracy_end'])}</td>"
            f"<td>{f(h['eval_accuracy_first'])} → {f(h['eval_accuracy_last'])} ({f(h['eval_accuracy_best'])})</td>"
            f"<td>{f(h['tokens_per_s'], '.4g')}</td><td>{h['restarts']}</td><td>{h['resumes']}</td>"
            f"<td>{h['rollbacks']}</td><td>{h['skipped_steps']}</td></tr>"
        )
    return '<table class="headline">' + "".join(rows) + "</table>"


def _findings_html(name: str, d: Diagnosis, compare: bool) -> str:
    title = f"Findings: {_esc(name)}" if compare else "Findings"
    if not d.findings:
        return f'<h2>{title}</h2><p class="healthy">healthy: no findings.</p>'
    parts = [f"<h2>{title}</h2>"]
    for f in d.findings:
        span = f"step {f.steps[0]}" if f.steps[0] == f.steps[1] else f"steps {f.steps[0]}–{f.steps[1]}"
        ev = ", ".join(f"{_esc(k)}={v:.4g}" for k, v in f.evidence.items())
        samples = "".join(f"<li><code>{_esc(s)}</code></li>" for s in f.samples)
        parts.append(
            f'<div class="finding sev-{f.severity}" data-name="{_esc(f.name)}">'
            f'<div class="fhead"><span class="sev" style="background:{SEVERITY_COLORS[f.severity]}">{f.severity}</span> '
            f'<b>{_esc(f.name)}</b> <span class="span">{span}{", ongoing" if f.ongoing else ""}'
            f"{', live action: ' + _esc(f.action) if f.action != 'warn' else ''}</span></div>"
            f'<div>{_esc(f.message)}</div><div class="ev">evidence: {ev}</div>'
            f'<div class="sug">suggestion: {_esc(f.suggestion)}</div>'
            + (
                f'<details><summary>{len(f.samples)} quoted rollouts</summary><ul class="samples">{samples}</ul></details>'
                if samples
                else ""
            )
            + "</div>"
        )
    return "".join(parts)


def _sample_rows(run: RunData, per_step: int = 3, steps: int = 8) -> list[dict[str, Any]]:
    """Up to `per_step` rollouts from up to `steps` logged steps spread over the run (first and last kept)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in run.rollouts:
        s = r.get("step")
        if isinstance(s, (int, float)):
            by_step.setdefault(int(s), []).append(r)
    keys = sorted(by_step)
    if len(keys) > steps:
        keys = sorted({keys[round(i * (len(keys) - 1) / (steps - 1))] for i in range(steps)})
    return [r for k in keys for r in by_step[k][:per_step]]


def _samples_html(name: str, run: RunData, compare: bool) -> str:
    rows = _sample_rows(run)
    title = f"Sample rollouts: {_esc(name)}" if compare else "Sample rollouts"
    if not rows:
        return f"<h2>{title}</h2><p>no rollouts.jsonl.gz records.</p>"
    out = [
        f'<h2>{title}</h2><table class="samples"><tr><th>step</th><th>problem</th><th>reward</th><th>correct</th>'
        "<th>reason</th><th>finish</th><th>tokens</th><th>completion</th></tr>"
    ]
    for r in rows:
        info = r.get("info") if isinstance(r.get("info"), dict) else {}
        text = str(r.get("text", ""))
        if len(text) > 600:
            text = text[:599] + "…"
        reward = r.get("reward")
        reward_s = f"{reward:.3g}" if isinstance(reward, (int, float)) else "-"
        out.append(
            f"<tr><td>{_esc(r.get('step'))}</td><td><code>{_esc(_short(r.get('problem')))}</code></td>"
            f"<td>{reward_s}</td><td>{'yes' if r.get('correct') else 'no'}</td><td>{_esc(info.get('reason', ''))}</td>"
            f"<td>{_esc(r.get('finish_reason', ''))}</td><td>{_esc(r.get('completion_tokens', ''))}</td>"
            f"<td>{_transcript_html(info.get('transcript')) or f'<pre class=text>{_esc(text)}</pre>'}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _transcript_html(turns: Any, max_turns: int = 40, max_chars: int = 500) -> str:
    """A multi-turn episode turn by turn: who spoke, whether its tokens were trained (the model's turns) or
    context (the environment's), and what was said; "" for a single-turn rollout."""
    if not isinstance(turns, list) or not turns:
        return ""
    out = []
    for t in turns[:max_turns]:
        if not isinstance(t, dict):
            continue
        trained = bool(t.get("trained"))
        content = str(t.get("content", ""))
        if len(content) > max_chars:
            content = content[: max_chars - 1] + "…"
        label = (
            f"{t.get('role', '?')} · {t.get('tokens', '?')} tokens · {'trained' if trained else 'context'}"
        )
        out.append(
            f'<div class="turn {"trained" if trained else "context"}"><div class="role">{_esc(label)}</div>'
            f'<pre class="text">{_esc(content)}</pre></div>'
        )
    if len(turns) > max_turns:
        out.append(f'<div class="role">… {len(turns) - max_turns} more turns</div>')
    return "".join(out)


def _short(x: Any, n: int = 80) -> str:
    s = str(x) if x is not None else ""
    return s if len(s) <= n else s[: n - 1] + "…"


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:3px 7px;vertical-align:top;text-align:left}
th{background:#f4f4f4}
.v-critical{color:#c62828;font-weight:bold}.v-warning{color:#ef6c00;font-weight:bold}.v-healthy{color:#2e7d32;font-weight:bold}
.finding{border-left:4px solid #999;background:#fafafa;margin:8px 0;padding:6px 10px;font-size:13px}
.finding.sev-critical{border-color:#c62828}.finding.sev-warning{border-color:#ef6c00}.finding.sev-info{border-color:#1565c0}
.sev{color:#fff;border-radius:3px;padding:0 5px;font-size:11px;text-transform:uppercase}
.span,.ev{color:#555}.sug{color:#1b5e20}.samples code{white-space:pre-wrap;word-break:break-all}
.healthy{color:#2e7d32} details summary{cursor:pointer;color:#555;font-size:12px}
.turn{margin:2px 0;padding-left:6px}.turn.trained{border-left:3px solid #2e7d32}.turn.context{border-left:3px solid #bbb;color:#555}
.turn .role{font-size:11px;color:#777}.turn pre{margin:0}
.grid-plots{display:flex;flex-wrap:wrap;gap:10px}
svg.plot{background:#fff;border:1px solid #e3e3e3}
svg .frame{fill:none;stroke:#bbb} svg .grid{stroke:#eee} svg .tick{font-size:10px;fill:#666}
svg .axis{font-size:11px;fill:#444} svg .ptitle{font-size:13px;font-weight:600;fill:#222}
svg .legend{font-size:10px;fill:#333} svg .empty{font-size:12px;fill:#999} svg .nonfinite{font-size:12px;fill:#c62828}
svg .event{stroke-width:1.2;stroke-dasharray:4 3;opacity:.85}
pre.text{margin:0;white-space:pre-wrap;word-break:break-all;max-width:700px;font-size:12px}
.legend-events span{display:inline-block;margin-right:12px;font-size:12px}
"""


def render_report(run_dirs: Sequence[str | Path]) -> str:
    """The HTML text of the report for one run, or several overlaid (the first is the main one)."""
    if not run_dirs:
        raise ValueError("render_report needs at least one run directory")
    loaded = [(_run_name(Path(p), run_dirs), load_run(p)) for p in run_dirs]
    diags = [(name, diagnose(run)) for name, run in loaded]
    compare = len(loaded) > 1
    names = ", ".join(name for name, _ in loaded)
    events_legend = "".join(
        f'<span><svg width="18" height="10"><line x1="0" y1="5" x2="18" y2="5" stroke="{c}" stroke-width="2" '
        f'stroke-dasharray="4 3"/></svg> {_esc(k)}</span>'
        for k, c in EVENT_COLORS.items()
    )
    body = [
        f"<h1>keelrl report: {_esc(names)}</h1>",
        f'<div class="meta">generated {_esc(time.strftime("%Y-%m-%d %H:%M:%S"))} from '
        + ", ".join(f"<code>{_esc(run.path)}</code>" for _, run in loaded)
        + "</div>",
        _headline_table(diags),
    ]
    body += [_findings_html(name, d, compare) for name, d in diags]
    body.append("<h2>Curves</h2>")
    body.append(f'<div class="legend-events">events: {events_legend}</div>')
    body.append('<div class="grid-plots">' + "".join(_plots(loaded)) + "</div>")
    body += [_samples_html(name, run, compare) for name, run in loaded]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>keelrl report: {_esc(names)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def _run_name(p: Path, all_paths: Sequence[str | Path]) -> str:
    """The directory name, or more of the path when two runs share a name."""
    names = [Path(q).resolve().name for q in all_paths]
    name = p.resolve().name
    if names.count(name) > 1:
        return str(p)
    return name


def run_report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """CLI entry: write the report of `run_dirs` (others overlaid on the first) to `out`; returns its path."""
    text = render_report(run_dirs)
    path = Path(out) if out else Path(run_dirs[0]) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
