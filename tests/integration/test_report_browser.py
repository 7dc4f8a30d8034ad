"""keelrl report in a real browser: a real tiny run's report (trained 2 steps, then resumed to 3) opened from
its file in headless Chromium, driven over the DevTools protocol with real mouse events. The page requests
nothing but itself (offline), logs nothing to the console, draws every plot; hovering a plot shows the
logged value at that step, the smoothing slider smooths (and the hover then shows the raw value too), the
log button switches the axis, a drag zooms; the resume is marked; rollouts render as transcripts (prompt,
trained completion). With --compare, the config differences are a table and each run a line. Screenshot:
test-artifacts/report.png.

Needs Debian's `chromium` (apt-get install -y chromium); skipped without it."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from cdp_browser import CHROMIUM, DevTools, open_browser

from keelrl.config import load_config
from keelrl.loop.trainer import train
from keelrl.monitor.report import run_report
from keelrl.monitor.run_dir import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real smoke run trained 2 steps, then resumed to 3 (so events.jsonl has a resume to mark)."""
    run = tmp_path_factory.mktemp("report") / "smoke"
    # one torch thread: several times faster on a shared 2-core machine; restored afterwards
    overrides = ["train.threads=1", "log.progress=false", "log.tensorboard=false", "eval.every_steps=1"]
    threads = torch.get_num_threads()
    try:
        train(load_config(ROOT / "configs" / "smoke.toml", ["train.steps=2", *overrides]), run)
        train(load_config(ROOT / "configs" / "smoke.toml", ["train.steps=3", *overrides]), run)
    finally:
        torch.set_num_threads(threads)
    assert any(e["kind"] == "resume" for e in read_jsonl(run / "events.jsonl"))
    return run


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Callable[[], DevTools]]:
    with open_browser(tmp_path, "1500,1100") as connect:
        yield connect


def open_page(cdp: DevTools, page: Path) -> None:
    for domain in ("Runtime", "Page", "Log", "Network"):
        cdp.call(f"{domain}.enable")
    cdp.call("Page.navigate", url=page.as_uri())
    cdp.wait("document.body.dataset.plots === 'ready'", timeout=90)


def plot(title: str) -> str:
    """JavaScript for the plot's div."""
    return f"[...document.querySelectorAll('div.plot')].find(d => d.dataset.title === {json.dumps(title)})"


def point(cdp: DevTools, title: str, trace: str, i: int) -> tuple[float, float]:
    """Viewport pixels of point i of the plot's trace named `trace` (scrolled into view first)."""
    cdp.js(f"{plot(title)}.scrollIntoView({{block: 'center'}})")
    return tuple(
        cdp.js(f"""(() => {{
        const gd = {plot(title)}, L = gd._fullLayout, box = gd.getBoundingClientRect();
        const t = gd.data.find(t => t.name === {json.dumps(trace)});
        return [box.left + L._size.l + L.xaxis.l2p(t.x[{i}]), box.top + L._size.t + L.yaxis.l2p(t.y[{i}])];
    }})()""")
    )


def hover_text(cdp: DevTools, title: str) -> str:
    return cdp.wait(f"{plot(title)}.querySelector('.hoverlayer').textContent")


def test_report_in_chromium(resumed_run: Path, tmp_path: Path, browser: Callable[[], DevTools]) -> None:
    page = run_report([resumed_run], tmp_path / "report.html")
    cdp = browser()
    open_page(cdp, page)
    requested = [
        e["params"]["request"]["url"] for e in cdp.events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requested == [page.as_uri()]  # nothing fetched: the page works offline
    assert cdp.problems() == []
    plots = cdp.js("document.querySelectorAll('div.plot').length")
    assert plots >= 15 and cdp.js("document.querySelectorAll('div.plot .main-svg').length") >= plots
    # every plot with training data marks the resume (a dotted line with its details on hover)
    unmarked = cdp.js("[...document.querySelectorAll('div.plot')].filter(d => d.data.some(t => t.meta === 'smooth')"
                      " && !d.data.some(t => t.name === 'resume')).map(d => d.dataset.title)")  # fmt: skip
    assert unmarked == []

    # hover: the unified label shows the logged value at the hovered step
    records = [r for r in read_jsonl(resumed_run / "metrics.jsonl") if "entropy" in r]
    x, y = point(cdp, "Entropy", "entropy", 1)
    cdp.hover(x, y)
    text = hover_text(cdp, "Entropy")
    assert f"entropy : {records[1]['entropy']:.5g}" in text and text.startswith(str(records[1]["step"]))

    # smoothing: the slider smooths the training curves; the hover then also shows the raw value
    cdp.js(
        "(() => { const s = document.getElementById('smoothing'); s.value = '0.9'; s.dispatchEvent(new Event('input')); })()"
    )
    smoothed = cdp.js(f"{plot('Entropy')}.data.find(t => t.name === 'entropy').y")
    assert smoothed[0] == pytest.approx(records[0]["entropy"]) and smoothed[1] != pytest.approx(
        records[1]["entropy"]
    )
    cdp.hover(1, 1)
    cdp.hover(*point(cdp, "Entropy", "entropy", 1))
    assert f"(raw {records[1]['entropy']:.5g})" in hover_text(cdp, "Entropy")

    # the log button switches the y axis; a drag zooms the x axis
    cdp.js(f"{plot('Entropy')}.scrollIntoView({{block: 'center'}})")
    button = f"[...{plot('Entropy')}.querySelectorAll('.updatemenu-button')]"
    assert cdp.js(f"{button}.map(b => b.textContent)") == ["linear", "log y"]
    box = json.loads(cdp.js(f"JSON.stringify({button}[1].getBoundingClientRect())"))
    cdp.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    cdp.wait(f"{plot('Entropy')}._fullLayout.yaxis.type === 'log'")
    (x0, y0), (x1, _) = point(cdp, "Reward", "reward/mean", 0), point(cdp, "Reward", "reward/mean", 2)
    cdp.drag((x0 + 0.3 * (x1 - x0), y0), (x0 + 0.7 * (x1 - x0), y0 + 5))
    lo, hi = cdp.wait(f"{plot('Reward')}._fullLayout.xaxis.range")
    assert 1.2 < lo < hi < 2.8  # zoomed in between steps 1 and 3

    # rollouts as transcripts: the prompt as context, the completion as trained text, no dict reprs
    assert cdp.js("document.querySelectorAll('.rollout').length") >= 3
    first = cdp.js("document.querySelector('.rollout').innerText")
    assert (
        "prompt · context, not trained" in first and "completion · trained" in first and "status ok" in first
    )
    assert cdp.js("document.querySelector('.rollout .turn.context pre').textContent").strip()
    assert "{'numbers'" not in cdp.js("document.body.innerText")
    assert cdp.problems() == []

    ARTIFACTS.mkdir(exist_ok=True)
    cdp.js("window.scrollTo(0, 0)")
    shot = base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    (ARTIFACTS / "report.png").write_bytes(shot)


def test_compare_report_in_chromium(
    resumed_run: Path, tmp_path: Path, browser: Callable[[], DevTools]
) -> None:
    other = tmp_path / "smoke_lr"
    shutil.copytree(resumed_run, other, ignore=shutil.ignore_patterns("checkpoints", "final", "tb"))
    config = json.loads((other / "config.json").read_text())
    config["algo"]["lr"] = 0.01
    (other / "config.json").write_text(json.dumps(config))
    page = run_report([resumed_run, other], tmp_path / "compare.html")
    cdp = browser()
    open_page(cdp, page)
    assert cdp.problems() == []
    rows = cdp.js("[...document.querySelectorAll('#config-table tr')].map(r => r.innerText.split('\\t'))")
    assert rows == [["setting", "smoke", "smoke_lr"], ["algo.lr", "0.001", "0.01"]]
    lines = cdp.js(f"{plot('Reward')}.data.filter(t => t.name.endsWith(': reward/mean')).map(t => t.name)")
    assert lines == ["smoke: reward/mean", "smoke_lr: reward/mean"]


def test_ladder_page_in_chromium(tmp_path: Path, browser: Callable[[], DevTools]) -> None:
    """The ladder page draws with the same helper: the measured ladders of docs/ladder.json, log-x axes."""
    from keelrl.ladder.page import write_page

    results = json.loads((ROOT / "docs" / "ladder.json").read_text())
    cdp = browser()
    for kind in ("rl", "pretrain"):
        open_page(cdp, write_page(results[kind], tmp_path / f"{kind}.html"))
        first = "document.querySelector('div.plot')"
        assert cdp.js(f"{first}._fullLayout.xaxis.type") == "log"
        assert cdp.js(f"{first}.data.filter(t => t.fill === 'toself').length") == 1  # the prediction's band
    assert cdp.problems() == []
