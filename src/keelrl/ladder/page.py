"""OUT/ladder.html: one self-contained page per ladder, drawn like the report (monitor/plots.py: interactive
Plotly plots, offline): the fitted curves with their bands over the measured points, the ranking by A with
intervals, the size laws, the prediction against the validation run, and every run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from keelrl.ladder.scaling import sigmoid_curve
from keelrl.monitor.plots import RUN_COLORS, Series, figure, page
from keelrl.monitor.plots import esc as _e
from keelrl.monitor.run_dir import atomic_write_text


def _ci(pair: list[float], fmt: str = ".3f") -> str:
    return f"[{pair[0]:{fmt}}, {pair[1]:{fmt}}]"


def _rl_plots(result: dict[str, Any]) -> list[str]:
    series = []
    for i, f in enumerate(sorted(result["fits"], key=lambda f: f["parameters"])):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        compute, mean = np.array(f["compute"]), np.array(f["accuracy"]).mean(0)
        grid = np.geomspace(compute[1], compute[-1] * 4, 40)
        fitted = sigmoid_curve(grid, f["r0"], f["a"], f["b"], f["c_mid"])
        series += [
            Series(
                f"{f['label']} (mean of {f['seeds']})", list(zip(compute[1:], mean[1:])), color, dots=True
            ),
            Series(f"fit: A {f['a']:.2f}, B {f['b']:.2f}", list(zip(grid, fitted)), color, "dash"),
        ]
    if p := result.get("prediction"):
        c = p["curve"]
        series.append(Series(
            f"predicted target ({p['level']:.0%} band)", list(zip(c["compute"], c["mid"], strict=True)), "#444", "dot",
            band=list(zip(c["compute"], c["lo"], c["hi"], strict=True)),
        ))  # fmt: skip
    if (v := result.get("validation")) and "compute" in v:
        mean = np.array(v["accuracy"]).mean(0)
        label = f"target measured (mean of {len(v['accuracy'])})"
        series.append(Series(label, list(zip(v["compute"][1:], mean[1:])), "#000", dots=True))
    plots = [
        figure(
            "Held-out pass rate against training compute", series, "pass rate", (), "training FLOPs (estimated)",
            log_x=True, size=(760, 380),
        )
    ]  # fmt: skip
    for f in result["fits"]:
        seeds = [
            Series(f"seed {k}", list(zip(f["steps"], row, strict=True)), RUN_COLORS[k % len(RUN_COLORS)])
            for k, row in enumerate(f["accuracy"])
        ]
        title = f"rank {f['rank_by_a']} (N = {f['parameters']:,}): every seed"
        plots.append(figure(title, seeds, "pass rate", size=(450, 300)))
    return plots


def _rl_tables(result: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{f['rank_by_a']}</td><td>{_e(f['label'])}</td><td>{f['parameters']:,}</td><td>{f['r0']:.3f}</td>"
        f"<td><b>{f['a']:.3f}</b> {_ci(f['a_ci'])}</td><td>{f['b']:.2f} {_ci(f['b_ci'], '.2f')}</td>"
        f"<td>{f['c_mid']:.3g} {_ci(f['c_mid_ci'], '.2g')}</td><td>{f['final_mean']:.3f} ± {f['final_sd']:.3f}</td><td>{f['points_fitted']}</td></tr>"
        for f in result["fits"]
    )
    out = (
        "<h2>Fits, ranked by the ceiling A</h2><table><tr><th>rank</th><th>point</th><th>parameters</th><th>R0</th>"
        "<th>A (ceiling)</th><th>B (efficiency)</th><th>C_mid (FLOPs)</th><th>final pass rate, mean ± sd over seeds</th>"
        f"<th>points fitted</th></tr>{rows}</table>"
    )
    if law := result.get("size_law"):
        out += (
            f"<h2>Size law (one fit over every size)</h2><p>{_e(law['form'])}, x_ref = {law['x_ref']:.2f}: "
            f"a0 {law['a0']:.3f}, a1 {law['a1']:.3f} {_ci(law['a1_ci'])}; c0 {law['c0']:.2f}, c1 {law['c1']:.3f} "
            f"{_ci(law['c1_ci'])}; B {law['b']:.2f} {_ci(law['b_ci'], '.2f')}; R0 = {law['r0_line'][0]:.3f} + "
            f"{law['r0_line'][1]:.3f} ln N. Sizes: {', '.join(f'{n:,}' for n in law['sizes'])}.</p>"
        )
    return out


def _verdict(v: dict[str, Any], fmt: str) -> str:
    return "inside the interval" if v["inside_interval"] else f"outside the interval by {v['miss']:{fmt}}"


def _prediction_html(result: dict[str, Any]) -> str:
    p, v = result.get("prediction"), result.get("validation")
    if not p:
        return ""
    if result["kind"] == "pretrain":
        text = (
            f"<p>Predicted held-out loss of N = {p['parameters']:,.0f}, D = {p['tokens']:,.0f} tokens: <b>{p['loss']:.4f}</b> "
            f"{_ci(p['interval'], '.4f')} ({p['level']:.0%})."
        )
        if v:
            text += f" Measured: <b>{v['loss']:.4f}</b>, <b>{_verdict(v, '+.4f')}</b>."
        return f"<h2>Prediction and validation</h2>{text}</p>"
    text = (
        f"<p>Made at {_e(p.get('made_at', '?'))}, before the target ran ({_e(p['method'])}): N = {p['parameters']:,}, "
        f"planned compute {p['planned_compute']:.3g} FLOPs; predicted curve R0 {p['r0']:.3f}, A {p['a']:.3f}, B {p['b']:.2f}, "
        f"C_mid {p['c_mid']:.3g}. Final pass rate (mean over the target's seeds, measurement noise included): "
        f"<b>{p['final']:.3f}</b> {_ci(p['final_interval'])} ({p['level']:.0%}; the fits alone: {_ci(p['final_fit_interval'])})."
    )
    if v:
        text += (
            f" Measured: <b>{v['final_mean']:.3f}</b> (seeds {', '.join(f'{x:.3f}' for x in v['final_per_seed'])}), "
            f"<b>{_verdict(v, '+.3f')}</b>; the predicted curve at the compute it used ({v['final_compute']:.3g}) is {v['predicted_at_final_compute']:.3f}."
        )
    return f"<h2>Prediction and validation</h2>{text}</p>"


def _pretrain_html(result: dict[str, Any]) -> tuple[list[str], str]:
    ch = result["chinchilla"]
    f = ch["fit"]
    sizes = sorted({p["parameters"] for p in ch["points"]})
    series = []
    for i, n in enumerate(sizes):
        pts = sorted((p["tokens"], p["loss"]) for p in ch["points"] if p["parameters"] == n)
        color = RUN_COLORS[i % len(RUN_COLORS)]
        series.append(Series(f"N = {n:,}", pts, color, dots=True))
        grid = np.geomspace(pts[0][0] / 2, pts[-1][0] * 4, 30)
        loss = f["e"] + f["a"] * float(n) ** -f["alpha"] + f["b"] * grid ** -f["beta"]
        series.append(Series(f"fit N = {n:,}", list(zip(grid, loss, strict=True)), color, "dash"))
    if v := result.get("validation"):
        p = ch["prediction"]
        band = [(p["tokens"] * 0.97, *p["interval"]), (p["tokens"] * 1.03, *p["interval"])]
        series += [
            Series("target: predicted (interval)", [(p["tokens"], p["loss"])], "#444", dots=True, band=band),
            Series("target: measured", [(v["tokens"], v["loss"])], "#000", dots=True),
        ]
    plot = figure(
        "Held-out loss against tokens, per model size", series, "nats / token", (), "training tokens", log_x=True,
        size=(760, 380),
    )  # fmt: skip
    if ch["params_exponent"] is not None:
        split = f"compute-optimal parameters grow as C^{ch['params_exponent']:.2f}"
    else:
        dropped = (
            "size term (A = 0: at these token counts no larger model lowered the loss)"
            if f["a"] <= 0
            else "data term (B = 0)"
        )
        split = f"the fit has no {dropped}, so it names no compute-optimal split"
    rows = "".join(
        f"<tr><td>{_e(p['label'])}</td><td>{p['parameters']:,}</td><td>{p['tokens']:,.0f}</td><td>{p['loss']:.4f}</td></tr>"
        for p in ch["points"]
    )
    text = (
        f"<h2>Chinchilla fit</h2><p>{_e(ch['form'])}: E {f['e']:.3f}, A {f['a']:.3g}, alpha {f['alpha']:.3f}, "
        f"B {f['b']:.3g}, beta {f['beta']:.3f}; {split}.</p>"
        f"<table><tr><th>point</th><th>parameters</th><th>tokens</th><th>held-out loss</th></tr>{rows}</table>"
    )
    return [plot], text


def render_page(result: dict[str, Any]) -> str:
    if result["kind"] == "rl":
        plots, tables = _rl_plots(result), _rl_tables(result)
    else:
        plots, tables = _pretrain_html(result)
    runs = "".join(
        f"<tr><td>{_e(r['name'])}</td><td>{_e(r['role'])}</td><td>{r['parameters']:,}</td>"
        f"<td>{r['compute'][-1] if isinstance(r['compute'], list) else r['compute']:.3g}</td>"
        f"<td>{'' if r.get('cpu_seconds_complete', True) else '&ge; '}{r['cpu_seconds']:.0f}</td>"
        f"<td>{r['wall_seconds']:.0f}</td></tr>"
        for r in result["runs"]
    )
    cost = result.get("cost", {})
    return page(
        "keelrl ladder",
        f"<h1>Scaling ladder ({_e(result['kind'])})</h1><p>config {_e(result['plan']['config'])}, "
        f"overrides {_e(' '.join(result['plan']['overrides']) or 'none')}; CPU time {cost.get('cpu_seconds', 0) / 60:.1f} min.</p>"
        f"{_prediction_html(result)}<div class='grid-plots'>{''.join(plots)}</div>{tables}"
        f"<h2>Runs</h2><table><tr><th>run</th><th>role</th><th>parameters</th><th>final compute (FLOPs)</th>"
        f"<th>CPU s</th><th>wall s</th></tr>{runs}</table>",
    )


def write_page(result: dict[str, Any], path: Path) -> Path:
    atomic_write_text(path, render_page(result))
    return path
