"""keelrl report rendered by a real browser: a real tiny run's report opens in headless Chromium without
console errors, draws its plots (the DOM Chromium built holds one <svg> per plot with drawn polylines),
marks the run's resume on the step axis, and a screenshot is saved to test-artifacts/report.png.

Needs Debian's `chromium` (apt-get install -y chromium); skipped without it."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from keelrl.config import load_config
from keelrl.monitor.report import PLOTS, run_report
from keelrl.monitor.run_dir import read_jsonl
from keelrl.trainer import train

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing outside the file can load
)


def chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def console_messages(stderr: str) -> list[str]:
    """Everything the page wrote to the JS console (uncaught errors included), from Chromium's log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


class PlotCounter(HTMLParser):
    """Counts <svg class="plot"> elements and, per plot, polylines with points and event markers."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: list[dict[str, int | str]] = []
        self.depth = 0
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("src") or (a.get("href") and tag != "a"):
            self.external.append(f"{tag} {a}")
        if tag == "svg" and a.get("class") == "plot":
            self.plots.append({"title": a.get("data-title") or "", "lines": 0, "dots": 0, "events": 0})
            self.depth = 1
        elif self.depth and tag == "svg":
            self.depth += 1
        if not self.depth or not self.plots:
            return
        plot = self.plots[-1]
        if tag == "polyline" and len((a.get("points") or "").split()) >= 2:
            plot["lines"] = int(plot["lines"]) + 1
        if tag == "circle":
            plot["dots"] = int(plot["dots"]) + 1
        if tag == "line" and a.get("data-kind") == "resume":
            plot["events"] = int(plot["events"]) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg" and self.depth:
            self.depth -= 1


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real smoke run trained 2 steps, then resumed to 3 (so events.jsonl has a resume to mark)."""
    run = tmp_path_factory.mktemp("report") / "smoke"
    # one torch thread: several times faster on a shared 2-core machine; restored afterwards
    overrides = ["train.threads=1", "log.progress=false", "log.tensorboard=false"]
    threads = torch.get_num_threads()
    try:
        train(load_config(ROOT / "configs" / "smoke.toml", ["train.steps=2", *overrides]), run)
        train(load_config(ROOT / "configs" / "smoke.toml", ["train.steps=3", *overrides]), run)
    finally:
        torch.set_num_threads(threads)
    assert any(e["kind"] == "resume" for e in read_jsonl(run / "events.jsonl"))
    return run


def test_console_check_catches_a_broken_page(tmp_path: Path) -> None:
    """Control: the console check below is not vacuous."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>throw new Error('boom')</script></body></html>")
    done = chromium(["--dump-dom", page.as_uri()], tmp_path / "profile")
    assert any("boom" in m for m in console_messages(done.stderr))


def test_report_renders_in_chromium(resumed_run: Path, tmp_path: Path) -> None:
    report = run_report([resumed_run], tmp_path / "report.html")
    done = chromium(["--dump-dom", report.as_uri()], tmp_path / "profile")
    assert console_messages(done.stderr) == []
    dom = PlotCounter()
    dom.feed(done.stdout)
    assert dom.external == []
    assert len(dom.plots) == len(PLOTS)
    metrics = list(read_jsonl(resumed_run / "metrics.jsonl"))
    logged = {k for m in metrics for k in m}
    for plot, (title, keys, _) in zip(dom.plots, PLOTS):
        assert plot["title"] == title
        if any(k in logged for k in keys):
            assert int(plot["lines"]) + int(plot["dots"]) > 0, f"plot {title!r} has data but draws nothing"
            assert plot["events"] == 1, f"plot {title!r} does not mark the resume"
    assert sum(int(p["lines"]) > 0 for p in dom.plots) >= 10
    assert "Sample rollouts" in done.stdout and "Findings" in done.stdout

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    chromium(["--window-size=1500,2400", f"--screenshot={shot}", report.as_uri()], tmp_path / "profile2")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_compare_report_renders_in_chromium(resumed_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "smoke_copy"
    shutil.copytree(resumed_run, other, ignore=shutil.ignore_patterns("checkpoints", "final", "tb"))
    report = run_report([resumed_run, other], tmp_path / "compare.html")
    done = chromium(["--dump-dom", report.as_uri()], tmp_path / "profile")
    assert console_messages(done.stderr) == []
    dom = PlotCounter()
    dom.feed(done.stdout)
    reward = next(p for p in dom.plots if p["title"] == "Reward")
    assert reward["lines"] == 2  # one line per run
