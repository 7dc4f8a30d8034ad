"""`keelrl report RUN_DIR [-o report.html] [--compare RUN2 ...]`: one self-contained, interactive HTML page.

At the top, the headline and the doctor's findings; then the config (with --compare, the settings in which the
runs differ); then one panel per metric family (reward, policy, optimisation, samples, speed, environment
episodes, asynchronous sampling, self-play, reward model, SFT, critic, curriculum, evaluation), each a row of
Plotly plots (monitor/plots.py: hover values, zoom, log axes, smoothing) with restarts, resumes, rollbacks,
skips and faults marked at their step. Every metric the run logged is drawn: one without a place in `PLOTS`
gets a plot of its key prefix, in its family's panel or under "Other metrics". Last, sampled rollouts as transcripts: the prompt, the
completion (or a multi-turn episode turn by turn), its reward and status, and which text was trained. With
--compare every plot overlays the runs. Every string from a run is HTML-escaped.
"""

from __future__ import annotations

import fnmatch
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keelrl.guards.base import metric_value
from keelrl.monitor.doctor import Diagnosis, RunData, diagnose, load_run
from keelrl.monitor.plots import DASHES, EVENT_COLORS, RUN_COLORS, Series, esc, figure, page
from keelrl.monitor.run_dir import atomic_write_text
from keelrl.monitor.traces import thin_evenly
from keelrl.monitor.trackers import flatten

# (panel, title, keys, y-axis label), in page order. A key with `*` stands for every logged key it matches
# that no plot names exactly. A plot is drawn when its first key is logged.
PLOTS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("Reward", "Reward", ("reward/mean", "reward/std", "eval/reward/mean"), "reward"),
    ("Reward", "Accuracy", ("accuracy", "format_rate", "eval/accuracy", "eval/format_rate"), "fraction"),
    ("Reward", "No-signal groups", ("groups/no_signal_frac",), "fraction of groups"),
    ("Reward", "Scoring errors", ("reward/errors", "eval/reward/errors"), "completions"),
    ("Reward", "Reward functions (task dataset)", ("reward/fn/*",), "reward"),
    ("Policy", "Entropy", ("entropy",), "nats / token"),
    ("Policy", "KL", ("kl/old", "kl/ref", "mismatch/kl"), "nats / token"),
    ("Policy", "Clip fractions", ("clipfrac/*",), "fraction of tokens"),
    ("Policy", "Losses", ("loss/total", "loss/policy"), "loss"),
    ("Policy", "Advantages and ratios", ("advantage/*", "ratio/max"), "advantage / ratio"),
    ("Optimisation", "Gradient norm", ("grad_norm", "grad_norm/max"), "L2 norm (before clipping)"),
    ("Optimisation", "Learning rate", ("lr",), "lr"),
    ("Optimisation", "Guards", ("guard/*",), "steps / updates"),
    ("Samples", "Response length", ("response_length/mean", "response_length/max", "eval/length/mean"), "tokens"),
    ("Samples", "Truncation and repetition",
     ("response_length/truncated_frac", "repetition/frac", "eval/truncated_frac"), "fraction"),
    ("Speed", "Step time", ("time/*",), "seconds"),
    ("Speed", "Throughput", ("throughput/tokens_per_s",), "generated tokens / s"),
    ("Speed", "Tokens", ("tokens/*",), "tokens per step"),
    ("Environment episodes", "Episodes without a reward",
     ("episode/error_frac", "episode/verifier_errors", "episode/agent_errors", "episode/timeouts"),
     "fraction / episodes per step"),
    ("Environment episodes", "Turns and tool calls",
     ("episode/turns", "episode/tool_calls", "episode/tool_errors", "eval/turns/mean", "eval/tool_calls/mean",
      "eval/tool_errors/mean"), "per episode"),
    ("Environment episodes", "Tool error rate", ("episode/tool_error_rate",), "fraction of tool calls"),
    ("Environment episodes", "Actions that did not parse", ("episode/action_errors",), "turns per episode"),
    ("Environment episodes", "Time in a box", ("episode/container_s", "episode/verifier_s"), "seconds"),
    ("Environment episodes", "How episodes ended", ("episode/end/*",), "fraction of episodes"),
    ("Environment episodes", "Episode length", ("episode/length",), "tokens"),
    ("Asynchronous sampling", "Staleness", ("async/staleness_mean", "async/staleness_max"), "policy versions"),
    ("Asynchronous sampling", "Queue: sampled batches ready", ("async/batches_ready",), "batches"),
    ("Asynchronous sampling", "Waits", ("time/trainer_wait_s", "time/sampler_wait_s"), "seconds per step"),
    ("Asynchronous sampling", "Off-policy correction", ("behaviour/*",), "weight / fraction"),
    ("Asynchronous sampling", "Sampler-trainer mismatch", ("mismatch/max_abs", "mismatch/kl"), "log-prob gap"),
    ("Self-play", "Proposals", ("selfplay/valid_frac", "selfplay/new_frac", "selfplay/duplicate_frac",
     "selfplay/distinct_frac", "selfplay/learnable_frac"), "fraction of proposals"),
    ("Self-play", "Proposer reward and new problems' solve rate",
     ("selfplay/proposer_reward", "selfplay/new_solve_rate"), "reward / fraction"),
    ("Self-play", "Problem buffer", ("selfplay/buffer_size",), "problems"),
    ("Self-play", "Refused proposals, by reason", ("selfplay/refused/*",), "fraction of proposals"),
    ("Self-play", "Proposer policy (selfplay.policies = 'two')", ("proposer/*",), "value"),
    ("Reward model", "Learned reward (reward.model) and the verifier's held-out accuracy",
     ("reward/model", "reward/verifier", "eval/accuracy"), "raw score / reward / fraction"),
    ("Reward model", "Pair loss (train.stage = rm)", ("loss/pair_nll", "eval/loss"), "nats / pair"),
    ("Reward model", "Pair accuracy", ("rm/accuracy", "eval/accuracy"), "fraction of pairs"),
    ("Reward model", "Score margin", ("rm/margin", "eval/margin"), "chosen minus rejected score"),
    ("Supervised fine-tuning", "Supervised loss (train.stage = sft)", ("loss/nll", "eval/loss"), "nats / token"),
    ("Supervised fine-tuning", "Packing", ("sft/fill",), "fraction of row slots"),
    ("Critic (algo.advantage = gae)", "Value loss and fit",
     ("critic/value_loss", "critic/explained_variance", "critic/clipfrac"), "loss / fraction"),
    ("Critic (algo.advantage = gae)", "Values and returns", ("critic/value_mean", "critic/return_mean"), "return"),
    ("Curriculum", "Estimated pass rate per bucket", ("curriculum/pass_rate/*",), "pass rate (posterior mean)"),
    ("Curriculum", "Sampling weight per bucket", ("curriculum/weight/*",), "share of prompts"),
    ("Curriculum", "Accuracy per bucket", ("curriculum/accuracy/*",), "fraction"),
    ("Curriculum", "Task mixture: accuracy per task", ("task/*/accuracy",), "fraction"),
    ("Curriculum", "Task mixture: share of prompts", ("task/*/share",), "fraction of prompts"),
    ("Evaluation", "Held-out accuracy", ("eval/accuracy", "eval/format_rate"), "fraction"),
    ("Evaluation", "Search behaviour on held-out evals (task.behaviour)", ("eval/search/*",), "mean per completion"),
)  # fmt: skip
EXACT = {k for _, _, keys, _ in PLOTS for k in keys if "*" not in k}
# schedules and counters: drawn as logged, never smoothed
UNSMOOTHED = ("lr", "*/lr", "guard/*", "*/epoch", "selfplay/buffer_size")
SEVERITY_COLORS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
# the report's own CSS, beside this file
STYLE = (Path(__file__).parent / "report.css").read_text(encoding="utf-8")


def _logged(runs: Sequence[tuple[str, RunData]]) -> set[str]:
    """Every metric key with a number (NaN and inf included) in some run's metrics.jsonl."""
    return {
        k
        for _, run in runs
        for m in run.metrics
        for k in m
        if k not in ("step", "time") and metric_value(m, k) is not None
    }


def plan_plots(logged: set[str]) -> list[tuple[str, str, list[str], str]]:
    """(panel, title, keys, y label) of every plot the page draws for these logged keys, panel by panel:
    `PLOTS` whose first key is logged, then one plot per key prefix of the keys no plot drew."""
    out, drawn = [], set()
    for panel, title, patterns, y_label in PLOTS:
        keys = [
            k
            for p in patterns
            for k in ([p] if "*" not in p else sorted(set(fnmatch.filter(logged, p)) - EXACT))
            if k in logged
        ]
        if keys and keys[0] in fnmatch.filter(logged, patterns[0]):
            out.append((panel, title, list(dict.fromkeys(keys)), y_label))
            drawn |= set(keys)
    for prefix in sorted({k.split("/")[0] for k in logged - drawn}):  # in its family's panel
        rest = sorted(k for k in logged - drawn if k.split("/")[0] == prefix)
        panel = next((p for p, _, keys, _ in PLOTS if keys[0].split("/")[0] == prefix), "Other metrics")
        out.append((panel, f"{prefix}/*" if "/" in rest[0] else prefix, rest, "value"))
    panels = list(dict.fromkeys(p for p, *_ in out))
    return sorted(out, key=lambda plot: panels.index(plot[0]))


def _points(metrics: Sequence[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [
        (float(r["step"]), v)
        for r in metrics
        if (v := metric_value(r, key)) is not None and isinstance(r.get("step"), (int, float))
    ]


def _events(run: RunData, tag: str) -> list[tuple[float, str, str]]:
    """(step, kind, text) of the run's restarts, resumes, rollbacks, skipped updates, faults and guard events."""
    out = []
    for e in run.events:
        kind, step = str(e.get("kind", "")), e.get("step")
        if kind in EVENT_COLORS and isinstance(step, (int, float)) and step >= 0:
            detail = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "step", "kind"))
            out.append(
                (float(step), kind, f"{tag}{kind} at step {step:g}" + (f": {detail}" if detail else ""))
            )
    prev = 0.0
    for r in run.metrics:
        v = metric_value(r, "guard/skipped_steps")
        if v is not None and math.isfinite(v) and v > prev and isinstance(r.get("step"), (int, float)):
            text = f"{tag}skipped update at step {r['step']} (guard/skipped_steps={v:g})"
            out.append((float(r["step"]), "skip", text))
            prev = v
    return out


def _plots_html(runs: Sequence[tuple[str, RunData]]) -> str:
    compare = len(runs) > 1
    plans = plan_plots(_logged(runs))
    if not plans:
        return "<p>no metrics logged yet.</p>"
    events = [e for name, run in runs for e in _events(run, f"{name}: " if compare else "")]
    html, panel = [], None
    for p, title, keys, y_label in plans:
        if p != panel:
            html.append(("</div></details>" if panel else "") + f'<details open class="panel"><summary><h3 style="display:inline">'
                        f'{esc(p)}</h3></summary><div class="grid-plots">')  # fmt: skip
            panel = p
        series = []
        for ri, (name, run) in enumerate(runs):
            for ki, key in enumerate(keys):
                if pts := _points(run.metrics, key):
                    dots = key.startswith("eval/") or len(pts) < 3
                    smooth = not dots and not any(fnmatch.fnmatch(key, u) for u in UNSMOOTHED)
                    series.append(Series(
                        f"{name}: {key}" if compare else key, pts, RUN_COLORS[ri % len(RUN_COLORS)] if compare else None,
                        DASHES[ki % len(DASHES)] if compare else "solid", dots, smooth=smooth,
                    ))  # fmt: skip
        html.append(figure(title, series, y_label, events))
    return "".join(html) + "</div></details>"


def _headline_table(diags: Sequence[tuple[str, Diagnosis]]) -> str:
    def f(x: Any, spec: str = ".3f") -> str:
        return "-" if x is None else format(x, spec) if isinstance(x, float) else esc(x)

    rows = [
        "<tr><th>run</th><th>verdict</th><th>state</th><th>steps</th><th>reward</th><th>accuracy</th>"
        "<th>eval accuracy (best)</th><th>tokens/s</th><th>restarts</th><th>resumes</th><th>rollbacks</th>"
        "<th>skipped</th></tr>"
    ]
    for name, d in diags:
        h = d.headline
        rows.append(
            f'<tr><td>{esc(name)}</td><td class="v-{esc(d.verdict)}">{esc(d.verdict)}</td><td>{esc(h["state"])}</td>'
            f"<td>{h['steps']}</td><td>{f(h['reward_start'])} → {f(h['reward_end'])}</td>"
            f"<td>{f(h['accuracy_start'])} → {f(h['accuracy_end'])}</td>"
            f"<td>{f(h['eval_accuracy_first'])} → {f(h['eval_accuracy_last'])} ({f(h['eval_accuracy_best'])})</td>"
            f"<td>{f(h['tokens_per_s'], '.4g')}</td><td>{h['restarts']}</td><td>{h['resumes']}</td>"
            f"<td>{h['rollbacks']}</td><td>{h['skipped_steps']}</td></tr>"
        )
    return '<table class="headline">' + "".join(rows) + "</table>"


def _findings_html(name: str, d: Diagnosis, compare: bool) -> str:
    title = f"Findings: {esc(name)}" if compare else "Findings"
    if not d.findings:
        return f'<h2>{title}</h2><p class="healthy">healthy: no findings.</p>'
    parts = [f"<h2>{title}</h2>"]
    for f in d.findings:
        span = f"step {f.steps[0]}" if f.steps[0] == f.steps[1] else f"steps {f.steps[0]}–{f.steps[1]}"
        ev = ", ".join(f"{esc(k)}={v:.4g}" for k, v in f.evidence.items())
        samples = "".join(f"<li><code>{esc(s)}</code></li>" for s in f.samples)
        quoted = f"<details><summary>{len(f.samples)} quoted rollouts</summary><ul class=samples>{samples}</ul></details>"
        parts.append(
            f'<div class="finding sev-{f.severity}" data-name="{esc(f.name)}"><div class="fhead"><span class="sev" '
            f'style="background:{SEVERITY_COLORS[f.severity]}">{f.severity}</span> <b>{esc(f.name)}</b> <span class="span">'
            f"{span}{', ongoing' if f.ongoing else ''}{', live action: ' + esc(f.action) if f.action != 'warn' else ''}"
            f'</span></div><div>{esc(f.message)}</div><div class="ev">evidence: {ev}</div>'
            f'<div class="sug">suggestion: {esc(f.suggestion)}</div>{quoted if samples else ""}</div>'
        )
    return "".join(parts)


def _config_html(runs: Sequence[tuple[str, RunData]]) -> str:
    """The resolved config (config.json): with one run, all of it, folded; with several, the keys that differ."""
    flat = [dict(flatten(run.config)) for _, run in runs]
    keys = sorted(set().union(*flat))
    if len(runs) > 1:
        keys = [k for k in keys if len({f.get(k) for f in flat}) > 1]
    head = "".join(f"<th>{esc(name)}</th>" for name, _ in runs)
    rows = "".join(
        f"<tr><td><code>{esc(k)}</code></td>"
        + "".join(f"<td>{esc(f.get(k, '(not set)'))}</td>" for f in flat)
        + "</tr>"
        for k in keys
    )
    table = f'<table id="config-table"><tr><th>setting</th>{head}</tr>{rows}</table>'
    if len(runs) == 1:
        return f"<details><summary><h2 style='display:inline'>Config</h2></summary>{table}</details>"
    if not keys:
        return '<h2>Config differences</h2><p id="config-table">the runs\' configs are identical.</p>'
    return f"<h2>Config differences</h2>{table}"


def _sample_rows(run: RunData, per_step: int = 3, steps: int = 8) -> list[dict[str, Any]]:
    """Up to `per_step` rollouts from up to `steps` logged steps spread over the run (first and last kept)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in run.rollouts:
        if isinstance(r.get("step"), (int, float)):
            by_step.setdefault(int(r["step"]), []).append(r)
    return [r for k in thin_evenly(sorted(by_step), steps) for r in by_step[k][:per_step]]


def _turn(role: str, text: Any, trained: bool, max_chars: int = 2000) -> str:
    text = str(text)
    text = text if len(text) <= max_chars else text[: max_chars - 1] + "…"
    kind = "trained" if trained else "context"
    return (
        f'<div class="turn {kind}"><div class="role">{esc(role)} · {"trained" if trained else "context, not trained"}'
        f'</div><pre class="text">{esc(text)}</pre></div>'
    )


def transcript_html(r: dict[str, Any], max_turns: int = 40) -> str:
    """One logged rollout as people read it: a line of its scores, the prompt, then the completion or the
    episode's turns, each marked trained (the policy's tokens, when the rollout's status is ok) or context."""
    info = r.get("info") if isinstance(r.get("info"), dict) else {}
    status = str(r.get("status", "ok"))
    ok = status == "ok"
    reward = r.get("reward")
    facts = [
        f"step <b>{esc(r.get('step'))}</b>", f"problem {esc(r.get('problem_index', '?'))}",
        f"reward <b>{reward:.4g}</b>" if isinstance(reward, (int, float)) else "reward -",
        "correct" if r.get("correct") else "not correct",
        f'status <span class="{"" if ok else "status-bad"}">{esc(status)}</span>',
        f"finish {esc(r.get('finish_reason', '?'))}", f"{esc(r.get('completion_tokens', '?'))} completion tokens",
    ]  # fmt: skip
    if isinstance(r.get("advantage"), (int, float)):
        facts.append(f"advantage {r['advantage']:+.3g}")
    facts += [f"{esc(k)} {esc(info[k])}" for k in ("reason", "error", "role") if info.get(k)]
    parts = [f'<div class="rollout" data-status="{esc(status)}"><div class="rhead">{" · ".join(facts)}</div>']
    if "prompt" in r:
        parts.append(_turn("prompt", r["prompt"], False))
    turns = info.get("transcript")
    if isinstance(turns, list) and turns:
        parts += [
            _turn(
                f"{t.get('role', '?')} · {t.get('tokens', '?')} tokens",
                t.get("content", ""),
                ok and bool(t.get("trained")),
            )
            for t in turns[:max_turns]
            if isinstance(t, dict)
        ]
        if len(turns) > max_turns:
            parts.append(f'<div class="role">… {len(turns) - max_turns} more turns</div>')
    else:
        parts.append(_turn("completion", r.get("text", ""), ok))
    problem = json.dumps(r.get("problem"), ensure_ascii=False)
    parts.append(f"<details><summary>problem</summary><pre class=text>{esc(problem)}</pre></details></div>")
    return "".join(parts)


def _samples_html(name: str, run: RunData, compare: bool) -> str:
    rows = _sample_rows(run)
    title = f"Sample rollouts: {esc(name)}" if compare else "Sample rollouts"
    if not rows:
        return f"<h2>{title}</h2><p>no rollouts.jsonl.gz records.</p>"
    return f'<h2>{title}</h2><div class="samples">' + "".join(map(transcript_html, rows)) + "</div>"


def render_report(run_dirs: Sequence[str | Path]) -> str:
    """The HTML text of the report for one run, or several overlaid (the first is the main one)."""
    if not run_dirs:
        raise ValueError("render_report needs at least one run directory")
    loaded = [(_run_name(Path(p), run_dirs), load_run(p)) for p in run_dirs]
    diags = [(name, diagnose(run)) for name, run in loaded]
    compare = len(loaded) > 1
    names = ", ".join(name for name, _ in loaded)
    body = [
        f"<h1>keelrl report: {esc(names)}</h1>",
        f'<div class="meta">generated {esc(time.strftime("%Y-%m-%d %H:%M:%S"))} from '
        + ", ".join(f"<code>{esc(run.path)}</code>" for _, run in loaded)
        + "</div>",
        _headline_table(diags),
        *(_findings_html(name, d, compare) for name, d in diags),
        _config_html(loaded),
        "<h2>Curves</h2>",
        _plots_html(loaded),
        *(_samples_html(name, run, compare) for name, run in loaded),
    ]
    return page(f"keelrl report: {names}", "\n".join(body), STYLE, smoothing=True)


def _run_name(p: Path, all_paths: Sequence[str | Path]) -> str:
    """The directory name, or more of the path when two runs share a name."""
    names = [Path(q).resolve().name for q in all_paths]
    name = p.resolve().name
    return str(p) if names.count(name) > 1 else name


def run_report(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """CLI entry: write the report of `run_dirs` (others overlaid on the first) to `out`; returns its path."""
    path = Path(out) if out else Path(run_dirs[0]) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_report(run_dirs))
    return path
