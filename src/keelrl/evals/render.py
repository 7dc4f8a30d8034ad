"""Display: rich renderables for eval summaries, perplexity results and comparisons."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 1000 else f"{x:.1f}"


def _interval(metric: Mapping[str, Any]) -> str:
    lo, hi = metric["ci95"]
    return f"[{_fmt(lo)}, {_fmt(hi)}]"


def _table(title: str, columns: Sequence[str], left: Sequence[str] = ()) -> Any:
    """A rich table of `columns`: the first (and those in `left`) aligned left, the numbers right."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col in left else "right")
    return table


def problems_text(summary: Mapping[str, Any]) -> str:
    """`500 problems`, or `500 problems (151 distinct)` when some were drawn more than once (docs/eval.md)."""
    n, distinct = summary.get("problems"), summary.get("distinct_problems", summary.get("problems"))
    return f"{n} problems" + (f" ({distinct} distinct)" if distinct != n else "")


def render_summary(summary: Mapping[str, Any]) -> list[Any]:
    """Rich renderables for an eval summary (or perplexity result): metric table, difficulty breakdown."""
    s = summary.get("settings", {})
    if summary.get("mode") == "perplexity":
        title = f"perplexity on {summary.get('source', '')}: {summary.get('texts')} texts, {summary.get('tokens')} tokens"
    else:
        passes = ["greedy"] if s.get("greedy") else []
        passes += [f"{s['samples']} samples at T={s.get('temperature')}"] if s.get("samples") else []
        title = (
            f"{s.get('model', '')} on {s.get('task', '')}: {problems_text(summary)} "
            f"({' + '.join(passes)}), {summary.get('problems_per_s', 0.0):.2f} problems/s"
        )
    table = _table(title, ("metric", "value", "95% CI"))
    for name, m in summary.get("metrics", {}).items():
        table.add_row(name, _fmt(m["value"]), _interval(m))
    out: list[Any] = [table]
    buckets = summary.get("by_difficulty", {})
    if len(buckets) > 1:
        names = [n for n in summary["metrics"] if n == "accuracy" or n.startswith(("pass@", "maj@"))]
        names = names[:1] + ([n for n in names if n.startswith("pass@")][-1:] if len(names) > 1 else [])
        by = _table("by difficulty", ["bucket", "problems", *(f"{n} [95% CI]" for n in names)])
        for bucket, b in buckets.items():
            cells = (f"{_fmt(b['metrics'][n]['value'])} {_interval(b['metrics'][n])}" for n in names)
            by.add_row(bucket, str(b["problems"]), *cells)
        out.append(by)
    if summary.get("score_errors"):
        from rich.text import Text

        out.append(
            Text(
                f"{summary['score_errors']} completion(s) scored 0 because the task's checker raised; "
                f"the first: {summary.get('first_score_error', '?')}",
                style="yellow",
            )
        )
    return out


def render_comparison(comparison: Mapping[str, Any], name_a: str = "A", name_b: str = "B") -> list[Any]:
    """Rich renderables for a `compare_results` dict: one row per metric with the verdict word."""
    level = comparison["level"]
    title = (
        f"B = {name_b} vs A = {name_a}: paired over {comparison['problems']} problems, {level:.0%} intervals"
    )
    table = _table(title, ("metric", "A", "B", "B - A", "CI", "verdict"), left=("verdict",))
    colours = {"better": "green", "worse": "red"}
    for name, m in comparison["metrics"].items():
        lo, hi = m["ci"]
        word = m["verdict"]
        table.add_row(
            name, _fmt(m["a"]), _fmt(m["b"]), f"{m['diff']:+.4f}", f"[{lo:+.3f}, {hi:+.3f}]",
            f"[{colours[word]}]{word}[/]" if word in colours else word,
        )  # fmt: skip
    out: list[Any] = [table]
    if comparison.get("only_in_a") or comparison.get("only_in_b"):
        out.append(
            f"not compared (only in one result): {', '.join(comparison.get('only_in_a', []) + comparison.get('only_in_b', []))}"
        )
    for key, (va, vb) in comparison.get("setting_differences", {}).items():
        out.append(f"settings differ: {key} = {va!r} (A) vs {vb!r} (B)")
    return out
