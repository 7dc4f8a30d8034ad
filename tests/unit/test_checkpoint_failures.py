"""A checkpoint write that fails (a full disk, whatever library raises it) leaves the previous checkpoints
valid, no partial directory, and an error the trainer sees, from the main thread and from the async writer;
`CheckpointPolicy` says how far behind the newest good checkpoint is and when to give up."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from keelrl.run import checkpoint as ckpt
from keelrl.run.state import TrainState

ENOSPC_SAFETENSORS = "Error while serializing: I/O error: No space left on device (os error 28)"


def _snap(model: torch.nn.Module, tokenizer, step: int) -> ckpt.Snapshot:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    state = TrainState(step=step, policy=model, optimizer=optimizer, scheduler=scheduler)
    return ckpt.snapshot(state, tokenizer, {}, {})


def _assert_only_previous(checkpoints: Path) -> None:
    assert [p.name for p in ckpt.committed(checkpoints)] == ["step_00000001"]
    assert ckpt.verify(checkpoints / "step_00000001") is None
    assert (checkpoints / ckpt.LATEST).resolve().name == "step_00000001"
    assert not list(checkpoints.glob(".tmp-*")), "the partial directory must be removed"


def test_a_safetensors_error_is_a_checkpoint_error_and_keeps_the_previous(
    tiny_model, char_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints = tmp_path / "checkpoints"
    ckpt.write_snapshot(_snap(tiny_model, char_tokenizer, 1), checkpoints)

    def full_disk(*_args, **_kwargs) -> None:  # what safetensors raises on ENOSPC (not an OSError)
        raise SafetensorError(ENOSPC_SAFETENSORS)

    monkeypatch.setattr(ckpt, "save_file", full_disk)
    with pytest.raises(ckpt.CheckpointError, match=r"No space left on device.*MB free.*previous checkpoints"):
        ckpt.write_snapshot(_snap(tiny_model, char_tokenizer, 2), checkpoints)
    _assert_only_previous(checkpoints)


@pytest.mark.parametrize(
    ("at_file", "error"),
    [
        (
            ckpt.TRAINER_STATE,
            RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
        ),
        (ckpt.STATE_JSON, OSError(errno.ENOSPC, "No space left on device")),
        ("tokenizer_config.json", OSError(errno.EDQUOT, "Disk quota exceeded")),
    ],
)
def test_any_write_failure_keeps_the_previous(
    tiny_model, char_tokenizer, tmp_path: Path, at_file: str, error: Exception
) -> None:
    checkpoints = tmp_path / "checkpoints"
    ckpt.write_snapshot(_snap(tiny_model, char_tokenizer, 1), checkpoints)

    def fail(fname: str) -> None:
        if fname == at_file:
            raise error

    with pytest.raises(ckpt.CheckpointError, match=type(error).__name__):
        ckpt.write_snapshot(_snap(tiny_model, char_tokenizer, 2), checkpoints, on_file=fail)
    _assert_only_previous(checkpoints)


@pytest.mark.parametrize("error", [SafetensorError(ENOSPC_SAFETENSORS), ValueError("a bug in a writer")])
def test_a_failed_background_save_reaches_the_trainer(
    tiny_model, char_tokenizer, tmp_path: Path, error: Exception
) -> None:
    checkpoints = tmp_path / "checkpoints"
    results: list[tuple[Path | None, BaseException | None, ckpt.Snapshot]] = []
    saver = ckpt.AsyncCheckpointer(lambda *result: results.append(result))
    saver.submit(_snap(tiny_model, char_tokenizer, 1), checkpoints, True)

    def fail(fname: str) -> None:
        if fname == ckpt.WEIGHTS:
            raise error

    saver.submit(_snap(tiny_model, char_tokenizer, 2), checkpoints, True, on_file=fail)
    saver.wait()
    assert [(r[0] is not None, r[2].step) for r in results] == [(True, 1), (False, 2)]
    assert str(error) in str(results[1][1])
    _assert_only_previous(checkpoints)


def test_policy_counts_failures_and_gives_up_at_the_bound() -> None:
    policy = ckpt.CheckpointPolicy(2, 0.0, False, 3600.0, max_failed_saves=2, step=10)
    assert policy.behind(12) == {} and policy.give_up() is None  # a healthy run logs nothing new
    policy.record_failure("disk full")
    assert policy.behind(12)["checkpoint/steps_since_good"] == 2 and policy.give_up() is None
    policy.record_failure("disk full")
    assert "2 checkpoint saves in a row failed (checkpoint.max_failed_saves=2)" in (policy.give_up() or "")
    policy.record_save(0.1, 16, time.time())
    assert policy.give_up() is None
    assert policy.behind(17) == {
        "checkpoint/steps_since_good": 1.0,
        "checkpoint/minutes_since_good": pytest.approx(0.0, abs=0.01),
        "checkpoint/failed_saves": 2.0,
    }


def test_policy_gives_up_on_unsaved_minutes_only_after_a_failure() -> None:
    policy = ckpt.CheckpointPolicy(0, 30.0, False, 3600.0, max_failed_saves=0, max_unsaved_minutes=60.0)
    policy.good_time = time.time() - 90 * 60  # the newest good checkpoint is 90 minutes old
    assert policy.give_up() is None  # no save failed: that gap is the configured cadence
    policy.record_failure("disk full")
    assert "checkpoint.max_unsaved_minutes=60" in (policy.give_up() or "")
    assert not policy.due(5)  # a failed save is retried one interval later, not at every step
