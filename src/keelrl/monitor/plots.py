"""Interactive plots for keelrl's HTML pages (`keelrl report`, the ladder page), drawn by Plotly.

A page is one file that works offline: plotly.js comes from the `plotly` package, gzipped and inlined as base64
(about 2 MB instead of 4.8) and unpacked by the browser (`DecompressionStream`) when the page opens; nothing is
fetched. Each plot is a `div.plot` holding its figure as JSON; the page's script draws them with hover values
(every series at the hovered step), box zoom (double-click resets), a linear / log switch on each plot's y axis
and one smoothing slider for every training curve (TensorBoard's debiased exponential moving average; the
hover then shows the raw value beside the smoothed one). Events (restarts, rollbacks, ...) are dotted vertical
lines with their details on hover (guard findings, often one a step, only once their legend entry is clicked);
a non-finite value is a red line at its step, never silently dropped.
`document.body.dataset.plots` becomes "ready" once every plot is drawn.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
DASHES = ("solid", "dash", "dot", "dashdot")
# Event kinds drawn on the step axis, with their colour ("non-finite": a NaN or inf value of a series).
EVENT_COLORS = {
    "restart": "#d62728",
    "resume": "#9467bd",
    "rollback": "#ff7f0e",
    "skip": "#8c564b",
    "fault": "#e377c2",
    "guard": "#bcbd22",
    "checkpoint_failed": "#7f7f7f",
    "non-finite": "#c62828",
}
HIDDEN_EVENTS = ("guard",)  # every step a rule fires: listed in the legend, drawn when clicked
MAX_POINTS = 1500  # per series; longer series keep each bucket's min and max (spikes stay visible)

# The page's CSS and the script that draws its plots: files beside this one.
STYLE = (Path(__file__).parent / "plots.css").read_text(encoding="utf-8")
SCRIPT = (Path(__file__).parent / "plots.js").read_text(encoding="utf-8")


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y); a non-finite y breaks the line and is marked at its x
    color: str | None = None  # None: Plotly's colour cycle
    dash: str = "solid"  # one of DASHES
    dots: bool = False  # markers, no line
    band: list[tuple[float, float, float]] = field(default_factory=list)  # (x, lo, hi): a shaded interval
    smooth: bool = False  # follows the page's smoothing slider (training curves; not fits, not evals)


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most ~MAX_POINTS points: each bucket keeps its min and max (spikes stay visible) and its non-finite."""
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        finite = [p for p in bucket if math.isfinite(p[1])]
        out += [p for p in bucket if not math.isfinite(p[1])]
        if finite:
            out += sorted({min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1])})
    return sorted(out, key=lambda p: p[0])


def _num(v: float) -> float | None:
    return float(f"{v:.6g}") if math.isfinite(v) else None  # 6 digits: what a hover shows, half the bytes


def _trace(s: Series) -> dict[str, Any]:
    pts = thin(s.points)
    style = {"color": s.color} if s.color else {}
    return {
        "type": "scatter", "name": esc(s.label), "x": [_num(x) for x, _ in pts], "y": [_num(y) for _, y in pts],
        "mode": "markers" if s.dots or len(pts) == 1 else "lines", "line": {**style, "dash": s.dash, "width": 1.6},
        "marker": {**style, "size": 6}, **({"meta": "smooth"} if s.smooth else {}),
    }  # fmt: skip


def _band(s: Series) -> dict[str, Any]:
    xs, lo, hi = zip(*s.band)
    return {"type": "scatter", "x": [*xs, *xs[::-1]], "y": [*hi, *lo[::-1]], "fill": "toself", "opacity": 0.2,
            "line": {"width": 0}, "fillcolor": s.color, "hoverinfo": "skip", "showlegend": False}  # fmt: skip


def _marks(events: list[tuple[float, str, str]]) -> list[dict[str, Any]]:
    """One trace per event kind: a vertical dotted line over the whole plot at each event's x."""
    out = []
    for kind in dict.fromkeys(k for _, k, _ in events):
        xs = [x for x, k, _ in events if k == kind]
        texts = [esc(t) for _, k, t in events if k == kind]
        out.append({
            "type": "scatter", "name": kind, "yaxis": "y2", "mode": "lines", "hovertemplate": "%{text}<extra></extra>",
            "x": [v for x in xs for v in (x, x, None)], "y": [v for _ in xs for v in (0, 1, None)],
            "text": [v for t in texts for v in (t, t, None)],
            "line": {"color": EVENT_COLORS.get(kind, "#555"), "dash": "dot", "width": 1.2},
            **({"visible": "legendonly"} if kind in HIDDEN_EVENTS else {}),
        })  # fmt: skip
    return out


def figure(
    title: str,
    series: list[Series],
    y_label: str = "",
    events: list[tuple[float, str, str]] = (),  # type: ignore[assignment]
    x_label: str = "step",
    log_x: bool = False,
    size: tuple[int, int] = (450, 380),
) -> str:
    """A `div.plot` that the page's script draws: `series` with `events` (x, kind, hover text) marked."""
    events = list(events) + [
        (x, "non-finite", f"{s.label} = {y} at {x_label} {x:g}")
        for s in series
        for x, y in s.points
        if not math.isfinite(y)
    ]
    data = [_band(s) for s in series if s.band] + [_trace(s) for s in series] + _marks(events)
    names = [t["name"] for t in data if "name" in t]  # the legend below the plot: columns of its widest entry
    rows = math.ceil(len(names) / max(1, size[0] // (46 + 6 * max(map(len, names), default=0))))
    layout = {
        "title": {"text": esc(title), "x": 0.02, "y": 0.98, "yanchor": "top", "font": {"size": 13}},
        "width": size[0], "height": size[1] + 18 * rows, "margin": {"l": 60, "r": 12, "t": 58, "b": 50 + 18 * rows},
        "legend": {"orientation": "h", "x": 0, "y": 0, "yref": "container", "yanchor": "bottom", "font": {"size": 10}},
        "xaxis": {"title": {"text": esc(x_label)}, **({"type": "log"} if log_x else {})},
        "yaxis": {"title": {"text": esc(y_label)}},
        "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
    }  # fmt: skip
    spec = json.dumps({"data": data, "layout": layout}, separators=(",", ":")).replace("<", "\\u003c")
    return (
        f'<div class="plot" data-title="{esc(title)}"><script type="application/json">{spec}</script></div>'
    )


@cache
def _plotly_gz() -> str:
    from plotly.offline import get_plotlyjs

    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode()


def page(title: str, body: str, style: str = "", smoothing: bool = False) -> str:
    """A whole HTML page: `body` (holding `figure`s), plotly.js inlined, and the script that draws them;
    `smoothing`: a slider over the page that smooths every `Series(smooth=True)`."""
    controls = (
        '<div class="controls"><label>smoothing <input type="range" id="smoothing" min="0" max="0.99" '
        'step="0.01" value="0"> <span id="smoothing-value">0.00</span></label> · hover a plot for values; drag '
        "to zoom, double-click to reset; click a legend entry to hide it</div>"
        if smoothing
        else ""
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<style>{STYLE}{style}</style></head><body>{controls}{body}<script id="plotly-gz" type="text/plain">'
        f"{_plotly_gz()}</script><script>{SCRIPT}</script></body></html>\n"
    )
