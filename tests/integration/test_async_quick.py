"""The asynchronous pipeline's guarantees on short in-process runs (the default suite; tests/system/test_async.py
has the longer drills through the CLI): k = 0 is the synchronous loop and k = 1 starts from what it samples,
k = 1 is reproducible bit for bit, staleness is bounded by k (every batch of step t sampled by version
max(t - k, 0)), and after a rollback the batches queued before it are dropped, not trained on.

Runs of the format model (rewards vary, so every update moves the weights), 4 steps of 16 completions, one
torch thread in the trainer and in the sampling process (rollout.sampler_threads): results are bit-comparable.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from keelrl.config import load_config
from keelrl.loop.trainer import train

# what depends on the machine's speed: times, rates, and how many later batches the sampler had ready when the
# trainer took its own (a queue depth; a loaded machine changed it at step 4 of a fresh-clone `make test`)
TIMING = ("time", "throughput/", "async/batches_ready")
QUICK = [
    "train.steps=4",
    "eval.every_steps=0",
    "eval.at_start=false",
    "checkpoint.every_steps=2",
    "log.rollouts_per_step=16",
    "supervisor.enabled=false",
]


def run(format_run: list[str], run_dir: Path, k: int, *extra: str) -> dict:
    cfg = load_config("configs/smoke.toml", [*format_run, *QUICK, f"rollout.max_staleness={k}", *extra])
    return train(cfg, run_dir)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in metrics(run_dir)]


def rollouts(run_dir: Path) -> dict[int, list[dict]]:
    """Logged rollouts by the step that trained on them (0-based: a rollout of step t is logged under t + 1)."""
    with gzip.open(run_dir / "rollouts.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f]
    by_step: dict[int, list[dict]] = {}
    for r in records:
        by_step.setdefault(r["step"] - 1, []).append(r)
    return by_step


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


@pytest.fixture(scope="module")
def k1(format_run: list[str], tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("k1") / "run"
    assert run(format_run, run_dir, 1)["state"] == "finished"
    return run_dir


def test_staleness_is_bounded_by_k(k1: Path) -> None:
    """Every rollout trained at step t was sampled by version max(t - 1, 0), and the logged staleness says so."""
    by_step = rollouts(k1)
    assert sorted(by_step) == [0, 1, 2, 3] and all(len(v) == 16 for v in by_step.values())
    assert {t: {r["policy_version"] for r in rs} for t, rs in by_step.items()} == {
        t: {max(t - 1, 0)} for t in range(4)
    }
    train_metrics = [m for m in metrics(k1) if "async/staleness_max" in m]
    assert [m["async/staleness_max"] for m in train_metrics] == [0.0, 1.0, 1.0, 1.0]
    assert [m["async/staleness_mean"] for m in train_metrics] == [0.0, 1.0, 1.0, 1.0]
    assert any(m["grad_norm"] > 0 for m in train_metrics), "the run must really train"


def test_k1_is_reproducible_bit_for_bit(format_run: list[str], k1: Path, tmp_path: Path) -> None:
    again = run(format_run, tmp_path / "again", 1)
    assert again["weights_sha256"] == json.loads((k1 / "summary.json").read_text())["weights_sha256"]
    assert comparable(tmp_path / "again") == comparable(k1)


def test_k0_is_the_synchronous_loop_and_k1_starts_from_its_samples(
    format_run: list[str], k1: Path, tmp_path: Path
) -> None:
    """k = 0: no pipeline, and the loss takes the sampler's log-probs as they are (no recompute, no correction):
    the default correction changes nothing (bit-identical to correction "off"). k = 1's first batch is sampled
    by version 0 in another process: the synchronous loop's first batch (texts, lengths, rewards, advantages), its
    log-probs the trainer's, and its first update (on recomputed log-probs) matches to float rounding."""
    k0 = run(format_run, tmp_path / "k0", 0)
    off = run(format_run, tmp_path / "off", 0, 'algo.correction="off"')
    assert k0["weights_sha256"] == off["weights_sha256"]
    assert comparable(tmp_path / "k0") == comparable(tmp_path / "off")
    assert not any("async/staleness_max" in m or "behaviour/ess" in m for m in metrics(tmp_path / "k0"))
    keys = ("problem_index", "text", "completion_tokens", "policy_version", "reward", "advantage")
    first_sync, first_async = rollouts(tmp_path / "k0")[0], rollouts(k1)[0]
    assert [[r[k] for k in keys] for r in first_sync] == [[r[k] for k in keys] for r in first_async]
    sync_step, async_step = metrics(tmp_path / "k0")[0], metrics(k1)[0]
    # the sampling process's log-probs are the trainer's (version 0 on both sides)
    assert async_step["mismatch/max_abs"] < 1e-5 and async_step["behaviour/ess"] == pytest.approx(
        1.0, abs=1e-9
    )
    assert async_step["loss/policy"] == pytest.approx(sync_step["loss/policy"], rel=1e-4, abs=1e-7)


def test_a_rollback_drops_the_batches_queued_before_it(
    format_run: list[str], k1: Path, tmp_path: Path
) -> None:
    """A NaN gradient at step 3 with max_skips_in_window 1 rolls the run back to step 2's checkpoint, whose queue
    holds the batches of steps 2 and 3 (0-based), sampled before the trouble by versions 1 and 2. They are
    dropped: the batches of steps 2 and 3 are drawn again (other seeds) and sampled by the restored version 2.
    A crash after the rollback, resumed from the rollback's checkpoint (whose queue starts at version 2), ends
    with the same weights."""
    settings = ["faults.nan_grad_at_step=3", "guards.max_skips_in_window=1", "train.steps=5"]
    rolled = tmp_path / "rolled"
    assert run(format_run, rolled, 1, *settings)["state"] == "finished"
    rollbacks = events(rolled, "rollback")
    assert [(e["step"], e["to_step"]) for e in rollbacks] == [(3, 2)]
    by_step = rollouts(rolled)
    assert [m["step"] for m in metrics(rolled)] == [1, 2, 3, 4, 5]
    assert {r["policy_version"] for r in by_step[2]} == {2}  # fresh: not the stored batch of version 1
    assert {r["policy_version"] for r in by_step[3]} == {2}
    before = rollouts(k1)  # the uninterrupted run's batches of these steps, the ones the checkpoint stored
    assert {r["policy_version"] for r in before[2]} == {1}
    assert [r["text"] for r in by_step[2]] != [r["text"] for r in before[2]]
    assert [m["async/staleness_max"] for m in metrics(rolled)][2:4] == [0.0, 1.0]

    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="injected fault"):
        run(format_run, crashed, 1, *settings, "faults.crash_at_step=4")
    resumed = run(format_run, crashed, 1, *settings, "faults.crash_at_step=4")
    assert resumed["weights_sha256"] == json.loads((rolled / "summary.json").read_text())["weights_sha256"]
