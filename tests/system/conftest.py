"""Shared pieces of the fault drills: a tiny config, runs through the real CLI, and exact comparison."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keelrl.config import Config, load_config

# A tiny run from the format-trained model (rewards vary, so every update changes the weights): 8 steps,
# a checkpoint every 2, an eval every 4. One thread, so results are bit-reproducible whatever else runs.
DRILL_SETTINGS = [
    "train.steps=8",
    "eval.every_steps=4",
    "eval.problems=8",
    "checkpoint.every_steps=2",
    "checkpoint.keep_last=3",
    "supervisor.backoff_s=0.2",
]
# what depends on the machine's speed; async/batches_ready is a queue depth (test_async_quick.py says why)
TIMING_PREFIXES = ("time", "throughput/", "eval/time", "eval/problems_per_s", "async/batches_ready")

_STARTED: list[subprocess.Popen] = []


@dataclass
class Drill:
    """Runs of the drill config through the real CLI (`keelrl train`, supervised unless asked otherwise)."""

    base: list[str]  # the format_run overrides (model path, task)

    def settings(self, *extra: str) -> list[str]:
        return [*self.base, *DRILL_SETTINGS, *extra]

    def argv(self, run_dir: Path, *extra: str, supervised: bool = True) -> list[str]:
        argv = [sys.executable, "-m", "keelrl", "train", "configs/smoke.toml", "--run-dir", str(run_dir)]
        for item in self.settings(*extra):
            argv += ["--set", item]
        return argv + ([] if supervised else ["--no-supervisor"])

    def run(
        self, run_dir: Path, *extra: str, supervised: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(run_dir, *extra, supervised=supervised), capture_output=True, text=True, timeout=timeout
        )

    def start(self, run_dir: Path, *extra: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            self.argv(run_dir, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        _STARTED.append(proc)
        return proc

    def config(self, *extra: str) -> Config:
        return load_config("configs/smoke.toml", self.settings(*extra))


@pytest.fixture(scope="session")
def drill(format_run: list[str]) -> Drill:
    return Drill(format_run)


@pytest.fixture(autouse=True)
def _stop_what_we_started():
    """A failing drill must not leave its supervisor running (its worker dies with it: PDEATHSIG)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def comparable_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without timing fields (the only thing allowed to differ between two runs)."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if not k.startswith(TIMING_PREFIXES)})
    return out


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in recs if kind is None or e["kind"] == kind]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def worker_pid(run_dir: Path) -> int | None:
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    pid = status.get("worker_pid")
    return int(pid) if pid else None


def kill(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def reference_run(drill: Drill, tmp_path_factory) -> Path:
    """The uninterrupted run every drill must reproduce exactly."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    done = drill.run(run_dir, supervised=False)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = comparable_metrics(run_dir)
    assert any(m.get("grad_norm", 0) > 0 for m in metrics), "the drill run must really train"
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert summary(run_dir)["weights_sha256"] == summary(reference)["weights_sha256"]
    assert comparable_metrics(run_dir) == comparable_metrics(reference)
