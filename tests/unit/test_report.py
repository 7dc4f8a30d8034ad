"""keelrl report on synthetic run directories: the page is one file with nothing fetched, every string from the
run escaped, a plot (Plotly figure JSON) for every logged metric in its family's panel with the run's events
and non-finite values marked, the config differences of compared runs, and rollouts as transcripts. What a
browser does with the page: tests/integration/test_report_browser.py."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from test_doctor import make_run, metrics_stream, rollout

from keelrl.monitor.report import PLOTS, plan_plots, render_report, run_report, transcript_html


def figures(page: str) -> dict[str, dict[str, Any]]:
    """Each plot's title -> its figure ({"data": traces, "layout"}), as the page's script reads them."""
    found = re.findall(
        r'<div class="plot" data-title="([^"]*)"><script type="application/json">(.*?)</script></div>',
        page,
        re.S,
    )
    return {html.unescape(title): json.loads(spec) for title, spec in found}


def names(fig: dict[str, Any]) -> list[str]:
    return [t["name"] for t in fig["data"] if "name" in t]


def test_report_is_one_escaped_file_with_a_plot_for_every_logged_metric(tmp_path: Path) -> None:
    evil = "<script>alert('x')</script> & <b>bold</b>"
    rs = [rollout(s, evil if s == 1 else "fine <answer>1</answer>", 0.5) for s in range(1, 11)]
    m = metrics_stream(40)
    m[12]["grad_norm"] = float("nan")
    m[5].update({"episode/error_frac": 0.1, "episode/verifier_errors": 2.0, "selfplay/odd_new_metric": 0.5})
    events = [("restart", 12), ("rollback", 20), ("checkpoint", 10)]
    path = run_report([make_run(tmp_path / "run", m, events=events, rollouts=rs)])
    assert path == tmp_path / "run" / "report.html"
    page = path.read_text()
    assert evil not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert not re.search(r"\b(?:src|href)\s*=", page) and not re.search(r"https?://", page)  # nothing fetched
    assert 1_000_000 < len(page) < 3_000_000  # plotly.js inlined, gzipped: ~2 MB
    figs = figures(page)
    logged = {k for r in m for k in r} - {"step", "time"}
    drawn = {n for f in figs.values() for n in names(f)}
    assert logged <= drawn  # every metric the run logged, selfplay/odd_new_metric (in no plot) too
    assert "Clip fractions" not in figs  # not logged: no empty plot
    assert names(figs["Episodes without a reward"])[:2] == ["episode/error_frac", "episode/verifier_errors"]
    for title, fig in figs.items():  # the restart and the rollback on every plot; the checkpoint is no event
        assert {"restart", "rollback"} <= set(names(fig)) and "checkpoint" not in names(fig), title
    rollback = next(t for t in figs["Reward"]["data"] if t.get("name") == "rollback")
    assert rollback["x"][:2] == [20, 20] and "rollback at step 20" in rollback["text"][0]
    # the NaN gradient norm: a gap in the line and a mark at its step, not silently dropped
    grad = figs["Gradient norm"]["data"]
    line = next(t for t in grad if t.get("name") == "grad_norm")
    assert line["y"][line["x"].index(12)] is None and line["meta"] == "smooth"
    assert next(t for t in grad if t.get("name") == "non-finite")["text"][0] == "grad_norm = nan at step 12"
    lr = next(t for t in figs["Learning rate"]["data"] if t.get("name") == "lr")
    assert "meta" not in lr  # a schedule is drawn as logged, never smoothed
    evals = next(t for t in figs["Accuracy"]["data"] if t.get("name") == "eval/accuracy")
    assert evals["mode"] == "markers" and "meta" not in evals


def test_plots_go_to_their_family_panels(tmp_path: Path) -> None:
    logged = {"reward/mean", "time/gen_s", "time/trainer_wait_s", "async/staleness_mean", "episode/turns",
              "selfplay/valid_frac", "selfplay/new_thing", "critic/value_loss", "zzz/unknown", "rm/accuracy"}  # fmt: skip
    plans = {title: (panel, keys) for panel, title, keys, _ in plan_plots(logged)}
    assert plans["Step time"] == ("Speed", ["time/gen_s"])  # the waits have a plot of their own
    assert plans["Waits"] == ("Asynchronous sampling", ["time/trainer_wait_s"])
    assert plans["Turns and tool calls"][0] == "Environment episodes"
    assert plans["selfplay/*"] == ("Self-play", ["selfplay/new_thing"])
    assert plans["zzz/*"] == ("Other metrics", ["zzz/unknown"])
    assert plans["Value loss and fit"][0] == "Critic (algo.advantage = gae)"
    panels = [panel for panel, *_ in plan_plots(logged)]
    assert panels == sorted(panels, key=panels.index) and len(set(panels)) == 8  # each panel's plots together
    assert (
        "Learned reward (reward.model) and the verifier's held-out accuracy" not in plans
    )  # reward/model absent
    assert all(title in {t for _, t, _, _ in PLOTS} or title.endswith("/*") for title in plans)


def test_compare_overlays_the_runs_and_tables_their_config_differences(tmp_path: Path) -> None:
    config = {"algo": {"lr": 3e-4, "clip_high": 0.28}, "task": {"name": "countdown"}, "train": {"steps": 30}}
    a = make_run(tmp_path / "lr_small", metrics_stream(30), config=config)
    big = {**config, "algo": {"lr": 3e-3, "clip_high": 0.28}, "log": {"wandb_tags": ["x"]}}
    b = make_run(tmp_path / "lr_big", metrics_stream(30, entropy=0.05), config=big)
    page = run_report([a, b], tmp_path / "out" / "cmp.html").read_text()
    assert "Findings: lr_small" in page and "Findings: lr_big" in page and "entropy_collapse" in page
    reward = figures(page)["Reward"]["data"]
    lines = [t for t in reward if t.get("name") in ("lr_small: reward/mean", "lr_big: reward/mean")]
    assert len(lines) == 2 and lines[0]["line"]["color"] != lines[1]["line"]["color"]
    table = re.search(r'<h2>Config differences</h2><table id="config-table">(.*?)</table>', page, re.S)
    assert table is not None
    rows = re.findall(
        r"<tr><td><code>([^<]*)</code></td><td>([^<]*)</td><td>([^<]*)</td></tr>", table.group(1)
    )
    assert rows == [("algo.lr", "0.0003", "0.003"), ("log.wandb_tags", "(not set)", html.escape('["x"]'))]
    same = make_run(tmp_path / "same", metrics_stream(30), config=config)
    assert "configs are identical." in render_report([a, same])
    single = render_report([a])  # one run: its whole config, folded
    assert "<details><summary><h2 style='display:inline'>Config</h2>" in single and "algo.clip_high" in single


def test_a_report_of_an_empty_run_still_renders(tmp_path: Path) -> None:
    page = render_report([make_run(tmp_path / "run", [], status={"state": "running", "step": 0})])
    assert "no metrics logged yet" in page and figures(page) == {}


def test_the_learned_reward_is_plotted_beside_held_out_accuracy(tmp_path: Path) -> None:
    """reward.model runs: one plot holds reward/model, reward/verifier and eval/accuracy (what reward_hacking
    compares); runs without a learned reward do not get it."""
    m = metrics_stream(30)
    for rec in m:
        if "reward/mean" in rec:
            rec["reward/model"], rec["reward/verifier"] = 0.1 * rec["step"], 0.5
    title = "Learned reward (reward.model) and the verifier's held-out accuracy"
    fig = figures(run_report([make_run(tmp_path / "learned", m)]).read_text())[title]
    assert names(fig) == ["reward/model", "reward/verifier", "eval/accuracy"]
    assert title not in figures(run_report([make_run(tmp_path / "plain", metrics_stream(30))]).read_text())


def test_rollouts_read_as_transcripts() -> None:
    single = {
        **rollout(3, "<answer>36</answer>", 1.0, True, reason="correct"),
        "prompt": "12 3 -> 36",
        "status": "ok",
    }
    out = transcript_html(single)
    assert "12 3 -&gt; 36" in out and "&lt;answer&gt;36&lt;/answer&gt;" in out
    assert out.count('<div class="turn context">') == 1 and out.count('<div class="turn trained">') == 1
    assert "reward <b>1</b>" in out and "status <span" in out and ">ok</span>" in out
    assert html.escape('{"a": 12, "b": 3}') in out and "{'a': 12" not in out  # JSON, not a Python repr
    failed = {**single, "status": "verifier_error", "info": {"reason": "score_error", "error": "boom"}}
    out = transcript_html(failed)
    assert 'class="status-bad"' in out and "error boom" in out
    assert '<div class="turn trained">' not in out  # a rollout without a reward trains nothing
    turns = [
        {"role": "assistant", "content": "calc(6*4)", "tokens": 9, "trained": True},
        {"role": "tool", "content": "24", "tokens": 2, "trained": False},
        {"role": "assistant", "content": "<answer>6*4</answer>", "tokens": 13, "trained": True},
    ]
    out = transcript_html({**single, "info": {"transcript": turns, "turns": 2}})
    roles = re.findall(r'<div class="turn (trained|context)"><div class="role">([^<]*)</div>', out)
    assert roles == [
        ("context", "prompt · context, not trained"),
        ("trained", "assistant · 9 tokens · trained"),
        ("context", "tool · 2 tokens · context, not trained"),
        ("trained", "assistant · 13 tokens · trained"),
    ]
