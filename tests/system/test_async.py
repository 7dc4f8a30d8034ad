"""Asynchronous training (rollout.max_staleness = k): the batch of step t is sampled by version t - k exactly, in
a process of its own; runs are reproducible, and a SIGKILLed worker or a killed sampling process changes
nothing. Runs of the drill config (8 steps, a checkpoint every 2) through the real CLI, compared like the
crash drills: final weights (sha256) and every per-step metric but timing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from .conftest import Drill, assert_same_run, comparable_metrics, events, kill, summary, wait_for, worker_pid


def staleness(k: int) -> str:
    return f"rollout.max_staleness={k}"


class AsyncRuns:
    """Uninterrupted runs (no supervisor) for each k, made when first asked for."""

    def __init__(self, drill: Drill, root: Path) -> None:
        self.drill, self.root, self.runs = drill, root, {}

    def __getitem__(self, k: int) -> Path:
        if k not in self.runs:
            run_dir = self.root / f"k{k}"
            done = self.drill.run(run_dir, staleness(k), supervised=False)
            assert done.returncode == 0, done.stderr[-2000:]
            self.runs[k] = run_dir
        return self.runs[k]


@pytest.fixture(scope="module")
def async_runs(drill: Drill, tmp_path_factory) -> AsyncRuns:
    return AsyncRuns(drill, tmp_path_factory.mktemp("async"))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_the_batch_of_step_t_was_sampled_by_version_t_minus_k(async_runs: AsyncRuns, k: int) -> None:
    with gzip.open(async_runs[k] / "rollouts.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f]
    by_step: dict[int, set[int]] = {}
    for r in records:  # a rollout trained at step t (0-based) is logged under step t + 1
        by_step.setdefault(r["step"] - 1, set()).add(r["policy_version"])
    assert sorted(by_step) == list(range(8))
    assert by_step == {t: {max(t - k, 0)} for t in range(8)}
    train = [m for m in metrics(async_runs[k]) if "async/staleness_max" in m]
    assert [m["async/staleness_max"] for m in train] == [min(t, k) for t in range(8)]
    assert all(0.0 < m["behaviour/ess"] <= 1.0 for m in train)
    # the policy moves, so stale batches are off-policy: behaviour ratios differ from 1 after the first update
    assert any(m["behaviour/ratio_max"] > 1.0 + 1e-4 for m in train[k + 1 :])
    assert any(m["grad_norm"] > 0 for m in train), "the run must really train"


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_a_second_run_is_bit_identical(drill: Drill, tmp_path: Path, async_runs: AsyncRuns, k: int) -> None:
    done = drill.run(tmp_path / "again", staleness(k), supervised=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(tmp_path / "again", async_runs[k])


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_sigkill_and_resume_equals_the_uninterrupted_run(
    drill: Drill, tmp_path: Path, async_runs: AsyncRuns, k: int
) -> None:
    """Killed after its third step's metrics (between checkpoints 2 and 4, with batches in flight): the
    restarted worker resumes from step 2's checkpoint and its queued batches."""
    run_dir = tmp_path / "run"
    proc = drill.start(run_dir, staleness(k))
    metrics_file = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 4, 240, "step 3")
    pid = worker_pid(run_dir)
    assert pid is not None and kill(pid)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert events(run_dir, "restart") and events(run_dir, "resume")
    assert_same_run(run_dir, async_runs[k])


@pytest.mark.slow  # 23 s
def test_a_killed_sampling_process_is_replaced_and_changes_nothing(
    drill: Drill, tmp_path: Path, async_runs: AsyncRuns
) -> None:
    run_dir = tmp_path / "run"
    done = drill.run(run_dir, staleness(2), "faults.kill_engine_at_step=3", supervised=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert events(run_dir, "fault") and events(run_dir, "sampler_worker_replaced")
    assert summary(run_dir)["weights_sha256"] == summary(async_runs[2])["weights_sha256"]

    def without_replacements(run: Path) -> list[dict]:  # the one metric that must differ
        return [
            {k: v for k, v in m.items() if k != "sampler/replaced_workers"} for m in comparable_metrics(run)
        ]

    assert without_replacements(run_dir) == without_replacements(async_runs[2])
    assert max(m.get("sampler/replaced_workers", 0) for m in metrics(run_dir)) == 1


@pytest.mark.slow  # 35 s
def test_a_run_resumed_from_its_first_checkpoint_equals_the_uninterrupted_run(
    drill: Drill, tmp_path: Path, async_runs: AsyncRuns
) -> None:
    """train.steps = 0 leaves a checkpoint of step 0 whose queue holds the first k + 1 batches (drawn before
    any step); continued to 8 steps, the run is the uninterrupted one: the problem source's cursor was saved
    after those draws, so the next batch draws the next problems."""
    run_dir = tmp_path / "run"
    for steps in (0, 8):
        done = drill.run(run_dir, staleness(2), f"train.steps={steps}", supervised=False)
        assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(run_dir, async_runs[2])
