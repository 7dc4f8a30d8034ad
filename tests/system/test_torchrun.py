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
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keelrl.run.distributed import FRESH_STORE_ENV, _attempt_store

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


def _assert_same_update(single: Path, multi: Path, initial: dict[str, torch.Tensor], steps: int = 4) -> None:
    ms, mm = _metrics(single), _metrics(multi)
    assert [m["step"] for m in ms] == [m["step"] for m in mm] == list(range(steps + 1))
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
    # fsdp2 trains with the plain padded forward (run/distributed.py says why): so does its reference
    extra = [f'distributed.strategy="{strategy}"'] + (
        ["train.share_prefix=false"] if strategy == "fsdp2" else []
    )
    _run(_argv(tmp_path / "single", format_run, *extra))
    _run(_argv(tmp_path / "multi", format_run, *extra, nproc=2))
    _assert_same_update(tmp_path / "single", tmp_path / "multi", initial)
    cfg = json.loads((tmp_path / "multi" / "config.json").read_text())
    assert cfg["distributed"]["strategy"] == strategy
    if strategy == "fsdp2":
        _assert_sharded_checkpoints(tmp_path / "multi")


@pytest.mark.slow  # 25 s: the one-rank group of benchmarks/gpu_check.sh, here with gloo
def test_one_rank_torchrun_group_with_fsdp2_equals_one_process(
    format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """`keelrl train --torchrun` with one process: a process group of one rank, so FSDP2 shards (as the GPU
    check needs on one GPU), and the update is the plain process's."""
    extra = ['distributed.strategy="fsdp2"', "train.share_prefix=false"]
    _run(_argv(tmp_path / "single", format_run, *extra))
    _run([*_argv(tmp_path / "group", format_run, *extra, supervised=True), "--torchrun"])
    _assert_same_update(tmp_path / "single", tmp_path / "group", initial)
    _assert_sharded_checkpoints(tmp_path / "group", ranks=1)


@pytest.mark.slow  # 40 s: three processes on two cores
def test_sft_two_processes_equal_one(
    format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """SFT under torchrun (ddp): each rank takes every second example of a step, the loss weights use the
    global token count, so two processes make the update of one."""
    data = tmp_path / "products.jsonl"
    rows = [
        {"problem": {"a": a, "b": b}, "completion": f"<answer>{a * b}</answer>"}
        for a in range(1, 10)
        for b in range(1, 10)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft = ['train.stage="sft"', f'data.path="{data}"', "data.batch_size=16", "data.packing=true"]
    _run(_argv(tmp_path / "single", format_run, *sft))
    _run(_argv(tmp_path / "multi", format_run, *sft, nproc=2))
    ms, mm = _metrics(tmp_path / "single"), _metrics(tmp_path / "multi")
    assert (
        [m["step"] for m in ms if "loss/nll" in m]
        == [m["step"] for m in mm if "loss/nll" in m]
        == [1, 2, 3, 4]
    )
    for a, b in zip(ms, mm):
        for key in ("loss/total", "loss/nll", "tokens/trained"):
            if key in a:
                assert abs(a[key] - b[key]) <= 1e-6, (a["step"], key, a[key], b[key])
    ws, wm = _weights(tmp_path / "single"), _weights(tmp_path / "multi")
    assert _max_diff(ws, initial) > 1e-4 and _max_diff(ws, wm) <= 1e-6


@pytest.mark.slow  # 90 s: four processes on two cores
def test_two_processes_equal_one_asynchronously(
    format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """rollout.max_staleness = 1 under torchrun: each rank's pipeline samples its shard in a process of its own;
    the update equals one process's. A 2-rank run stopped at step 2 and continued to 4 (its checkpoint holds
    both ranks' queued batches) ends bit-identical to the uninterrupted 2-rank run."""
    k1 = "rollout.max_staleness=1"
    _run(_argv(tmp_path / "single", format_run, k1))
    _run(_argv(tmp_path / "multi", format_run, k1, nproc=2))
    _assert_same_update(tmp_path / "single", tmp_path / "multi", initial)
    assert [m["async/staleness_max"] for m in _metrics(tmp_path / "multi")[1:]] == [0.0, 1.0, 1.0, 1.0]
    _run(_argv(tmp_path / "resumed", format_run, k1, "train.steps=2", nproc=2))
    _run(_argv(tmp_path / "resumed", format_run, k1, nproc=2))
    assert _max_diff(_weights(tmp_path / "resumed"), _weights(tmp_path / "multi")) == 0.0


def _assert_sharded_checkpoints(run: Path, ranks: int = 2) -> None:
    """An FSDP2 run's checkpoints hold each rank's shards (torch.distributed.checkpoint), covered by the
    manifest like every other file, next to an HF copy of the whole weights; a damaged shard is caught."""
    from keelrl.run.checkpoint import committed, read_manifest, verify

    ckpts = committed(run / "checkpoints")
    assert [p.name for p in ckpts][:2] == ["step_00000004", "step_00000002"]
    latest = ckpts[0]
    shards = sorted(p.name for p in (latest / "sharded").iterdir())
    assert shards == [".metadata", *(f"__{r}_0.distcp" for r in range(ranks))]
    listed = read_manifest(latest)["files"]
    assert {f"sharded/{name}" for name in shards} <= listed.keys() and "model.safetensors" in listed
    saved = load_file(str(latest / "model.safetensors"))
    assert _max_diff(saved, _weights(run)) == 0.0  # the HF copy is the trained policy
    assert verify(latest) is None
    shard = latest / "sharded" / f"__{ranks - 1}_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert f"sharded/__{ranks - 1}_0.distcp" in (verify(latest) or "")


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The training process of global rank `rank` (not a torchrun agent, whose environment has no RANK)."""
    psutil = pytest.importorskip("psutil")
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "keelrl" in cmd and "torch.distributed.run" not in cmd and str(run_dir) in cmd:
            try:
                if proc.environ().get("RANK") == str(rank):
                    return proc.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return None


def _kill_rank_after(
    run: Path, rank: int, step: int, procs: list[subprocess.Popen], sig: int = signal.SIGKILL
) -> int:
    """Send `sig` (SIGKILL: dead; SIGSTOP: hung) to the training process of `rank` once the run has logged
    `step`; returns the step seen then."""
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            metrics = _metrics(run) if (run / "metrics.jsonl").exists() else []
            if metrics and metrics[-1]["step"] >= step:
                pid = _rank_pid(run, rank)
                if pid is not None:
                    os.kill(pid, sig)
                    return metrics[-1]["step"]
            time.sleep(0.05)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    for p in procs:
        p.kill()
    raise AssertionError(f"rank {rank} was never seen running past step {step}")


# kill-and-restart is also covered, against one process, by the torchrun-restart test below: slow here (35 s)
@pytest.mark.slow
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
    killed = _kill_rank_after(run, rank=1, step=3, procs=[proc])
    _wait_all([proc])
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["kind"] == "restart"]
    assert restarts, [e["kind"] for e in events]
    resumed = [e for e in events if e["kind"] == "resume"]
    assert resumed and resumed[0]["step"] <= killed  # the whole group came back from a checkpoint
    summary = lambda r: json.loads((r / "summary.json").read_text())  # noqa: E731
    assert summary(run)["weights_sha256"] == summary(reference)["weights_sha256"]
    assert [m["step"] for m in _metrics(run)] == list(range(11))


# ddp's rollback runs the same code path as fsdp2's without the sharded checkpoint: slow (14 s)
@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp2"])
def test_guard_rollback_happens_on_every_rank(
    strategy: str, format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # a NaN gradient at step 3 with a one-skip budget: skip, then roll back to the step-2 checkpoint. Every
    # rank must decide the same (rank 0's history is broadcast), or the group deadlocks or diverges. With
    # fsdp2 the rollback reads the sharded checkpoint in the middle of a run.
    extra = [
        "faults.nan_grad_at_step=3",
        "guards.max_skips_in_window=1",
        f'distributed.strategy="{strategy}"',
    ]
    if strategy == "fsdp2":
        extra.append("train.share_prefix=false")
    _run(_argv(tmp_path / "single", format_run, *extra))
    _run(_argv(tmp_path / "multi", format_run, *extra, nproc=2))
    for run in ("single", "multi"):
        events = [json.loads(x) for x in (tmp_path / run / "events.jsonl").read_text().splitlines()]
        rollbacks = [e for e in events if e["kind"] == "rollback"]
        assert [(e["step"], e["to_step"], e["rule"]) for e in rollbacks] == [(3, 2, "too_many_skips")]
    _assert_same_update(tmp_path / "single", tmp_path / "multi", initial)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(run: Path, format_run: list[str], *settings: str, launch: list[str]) -> list[str]:
    """`torchrun LAUNCH... -m keelrl train ...` as a user on a cluster types it (no keelrl supervisor)."""
    worker = _argv(run, format_run, *settings)[3:]
    return [sys.executable, "-m", "torch.distributed.run", *launch, "-m", "keelrl", *worker]


def _wait_all(procs: list[subprocess.Popen], timeout: float = 300) -> None:
    try:
        errs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(e[-3000:] for e in errs)


def _torchrun_kill_and_compare(
    format_run: list[str],
    initial: dict[str, torch.Tensor],
    tmp_path: Path,
    launch: list[str],
    nodes: int,
    env: dict[str, str],
    sig: int = signal.SIGKILL,
) -> None:
    """Start `nodes` torchrun agents with `launch`, kill (or stop) rank 1 past the step-2 checkpoint, and
    check that torchrun restarted the group from a checkpoint and the run still equals one process."""
    # a hung rank is found by the collective timeout: short for that case. It also bounds how long a restarted
    # group waits for its slowest process to start, so a dead rank (noticed at once) keeps the default.
    settings = ["train.steps=8"] + (["distributed.timeout_s=20"] if sig == signal.SIGSTOP else [])
    _run(_argv(tmp_path / "single", format_run, *settings))
    run = tmp_path / "multi"
    argv = _torchrun(run, format_run, *settings, launch=launch)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(nodes)
    ]
    killed = _kill_rank_after(run, rank=1, step=3, procs=procs, sig=sig)
    _wait_all(procs)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e["kind"] == "resume"]
    assert resumed and resumed[0]["step"] <= killed  # the whole group came back from a checkpoint
    _assert_same_update(tmp_path / "single", run, initial, steps=8)


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGKILL, marks=pytest.mark.slow),
        pytest.param(signal.SIGSTOP, marks=pytest.mark.slow),
    ],
    ids=["dead", "hung"],
)
def test_torchrun_max_restarts_restarts_the_group(
    sig: int, format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # torchrun itself as the restarter (--max-restarts, no keelrl supervisor), one node: the restarted
    # group joins under its own store prefix (distributed._attempt_store). A hung rank (SIGSTOP) is found
    # by the collective timeout (distributed.timeout_s=20): rank 0 fails, torchrun kills the stopped
    # process (after its 30 s SIGTERM grace) and restarts the group.
    launch = ["--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    _torchrun_kill_and_compare(format_run, initial, tmp_path, launch, nodes=1, env={}, sig=sig)


@pytest.mark.slow  # 18 s; the one-node restart test stays in the default tier
def test_two_nodes_rendezvous_and_torchrun_restarts(
    format_run: list[str], initial: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # Two "nodes" on this machine, one process each, joined by torchrun's c10d rendezvous as on a cluster:
    # every node runs the same command, and the run directory stands in for the shared file system.
    # torchrun restarts both nodes' workers with a fresh store per attempt (FRESH_STORE_ENV, as the error
    # message of a multi-node restart without it asks).
    launch = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        "--rdzv-id=keelrl-two-nodes",
        "--max-restarts=1",
    ]
    _torchrun_kill_and_compare(format_run, initial, tmp_path, launch, nodes=2, env={FRESH_STORE_ENV: "1"})


def test_multi_node_restart_on_a_shared_store_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=f"{FRESH_STORE_ENV}=1"):
        _attempt_store(rank=1, world_size=2, timeout_s=1.0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # a first attempt uses torch's own rendezvous
    assert _attempt_store(rank=1, world_size=2, timeout_s=1.0) is None
