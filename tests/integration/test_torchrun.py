"""Several processes (torchrun, gloo on CPU) give the update of one process with the whole batch.

A 2-process run and a 1-process run of the same config (same global batch) must agree step by step: the
same rollouts and rewards (problems are sharded by rank, sampling seeds are per row), losses within 1e-6,
and final weights within 1e-6. Weights are compared rather than hashed: the ranks' partial sums add up in
another order than one process's sum, and AdamW turns those last-bit gradient differences into weight
differences of about lr x 1e-3 (measured), so the runs use a small learning rate for a clear bound.
Killing one rank mid-run makes the group fail; the supervisor restarts all of it from the newest checkpoint,
and the resumed run is bit-identical to the uninterrupted 2-process run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SETTINGS = [
    "train.steps=4",
    "eval.every_steps=0",
    "eval.problems=8",
    "checkpoint.every_steps=2",
    "checkpoint.keep_last=3",
    "algo.lr=1e-4",
    "supervisor.backoff_s=0.2",
]
LOSSES = ("loss/total", "loss/policy", "entropy", "kl/old")


def _argv(
    run_dir: Path, format_run: list[str], *extra: str, nproc: int = 1, supervised: bool = False
) -> list[str]:
    argv = [sys.executable, "-m", "keelrl", "train", "configs/smoke.toml", "--run-dir", str(run_dir)]
    for item in [*format_run, *SETTINGS, *extra]:
        argv += ["--set", item]
    if supervised:
        return [*argv, "--nproc-per-node", str(nproc)]
    if nproc > 1:  # torchrun directly, as a user on a cluster would
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
        ]
        return [*launcher, "-m", "keelrl", *argv[3:]]
    return [*argv, "--no-supervisor"]


def _run(argv: list[str], timeout: float = 300) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same_update(single: Path, multi: Path, initial: dict[str, torch.Tensor]) -> None:
    ms, mm = _metrics(single), _metrics(multi)
    assert [m["step"] for m in ms] == [m["step"] for m in mm] == list(range(5))
    for a, b in zip(ms[1:], mm[1:]):
        assert a["reward/mean"] == b["reward/mean"] and a["tokens/generated"] == b["tokens/generated"]
        for key in LOSSES:
            assert abs(a[key] - b[key]) <= 1e-6, (a["step"], key, a[key], b[key])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * max(1.0, a["grad_norm"])
    ws, wm = _weights(single), _weights(multi)
    assert _max_diff(ws, initial) > 1e-4  # the runs really trained
    assert _max_diff(ws, wm) <= 1e-6


@pytest.fixture(scope="module")
def initial(format_model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(format_model_dir / "model.safetensors"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_processes_equal_one(
    strategy: str, format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # fsdp2 trains with the plain padded forward (distributed.py says why): so does its reference
    extra = [f'distributed.strategy="{strategy}"'] + (
        ["train.share_prefix=false"] if strategy == "fsdp2" else []
    )
    _run(_argv(tmp_path / "single", format_run, *extra))
    _run(_argv(tmp_path / "multi", format_run, *extra, nproc=2))
    _assert_same_update(tmp_path / "single", tmp_path / "multi", initial)
    cfg = json.loads((tmp_path / "multi" / "config.json").read_text())
    assert cfg["distributed"]["strategy"] == strategy


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    psutil = pytest.importorskip("psutil")
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "worker" in cmd and str(run_dir) in cmd:
            try:
                if proc.environ().get("RANK") == str(rank):
                    return proc.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return None


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_killed_rank_restarts_the_group_and_resumes_exactly(
    strategy: str, format_run: list[str], tmp_path: Path
) -> None:
    settings = ["train.steps=10", f'distributed.strategy="{strategy}"']
    reference = tmp_path / "reference"
    _run(_argv(reference, format_run, *settings, nproc=2, supervised=True))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = _argv(run, format_run, *settings, nproc=2, supervised=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline, killed = time.time() + 240, None
        while time.time() < deadline and killed is None:
            metrics = _metrics(run) if (run / "metrics.jsonl").exists() else []
            if metrics and metrics[-1]["step"] >= 3:  # past the step-2 checkpoint
                pid = _rank_pid(run, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed = metrics[-1]["step"]
            time.sleep(0.05)
        assert killed is not None, "rank 1 was never seen running"
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["kind"] == "restart"]
    assert restarts, [e["kind"] for e in events]
    resumed = [e for e in events if e["kind"] == "resume"]
    assert resumed and resumed[0]["step"] <= killed  # the whole group came back from a checkpoint
    summary = lambda r: json.loads((r / "summary.json").read_text())  # noqa: E731
    assert summary(run)["weights_sha256"] == summary(reference)["weights_sha256"]
    assert [m["step"] for m in _metrics(run)] == list(range(11))


def test_guard_rollback_happens_on_every_rank(
    format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # a NaN gradient at step 3 with a one-skip budget: skip, then roll back to the step-2 checkpoint. Every
    # rank must decide the same (rank 0's history is broadcast), or the group deadlocks or diverges.
    extra = ["faults.nan_grad_at_step=3", "guards.max_skips_in_window=1"]
    _run(_argv(tmp_path / "single", format_run, *extra))
    _run(_argv(tmp_path / "multi", format_run, *extra, nproc=2))
    for run in ("single", "multi"):
        events = [json.loads(x) for x in (tmp_path / run / "events.jsonl").read_text().splitlines()]
        rollbacks = [e for e in events if e["kind"] == "rollback"]
        assert [(e["step"], e["to_step"], e["rule"]) for e in rollbacks] == [(3, 2, "too_many_skips")]
    _assert_same_update(tmp_path / "single", tmp_path / "multi", initial)
