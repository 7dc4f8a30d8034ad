"""The asynchronous pipeline's schedule and bookkeeping (rollout/pipeline.py) with a scripted sampler, and the
sampling process (rollout/process.py) against the in-process sampler."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from keelrl.config import load_config
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import Generation, SamplingSettings
from keelrl.rollout.episodes import Episode, Prompter
from keelrl.rollout.hf import HFSampler
from keelrl.rollout.pipeline import Pipeline, PipelineError, scheduled_version
from keelrl.rollout.process import ProcessSampler, SamplerProcessError
from keelrl.tasks import get_task

SETTINGS = SamplingSettings(max_new_tokens=4)


class Scripted:
    """Completion = [version, seed % 7]; records the order of its calls; `gate` holds generation back."""

    def __init__(self) -> None:
        self.policy_version = -1
        self.calls: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.generating = threading.Event()  # set once a `generate` call has started
        self.fail = False

    def update_weights(self, weights, version: int) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("push", version))
        self.policy_version = version

    def generate(self, prompts, settings, seeds):  # type: ignore[no-untyped-def]
        self.generating.set()
        self.gate.wait()
        if self.fail:
            raise RuntimeError("the engine broke")
        self.calls.append(("generate", self.policy_version))
        return [Generation([self.policy_version, s % 7], [-0.5, -0.5], "length") for s in seeds]


@pytest.fixture
def pipe(char_tokenizer):
    task = get_task("countdown")
    sampler = Scripted()
    p = Pipeline(sampler, Prompter(task, char_tokenizer, "compact"), SETTINGS, staleness=2)
    yield p, sampler, task
    p.shutdown()


def episodes(task, step: int) -> list[Episode]:
    return [Episode(step, task.problem("train", step), 0, 100 * step + i) for i in range(2)]


def weights() -> list[tuple[str, torch.Tensor]]:
    return [("w", torch.zeros(1))]


def test_schedule_versions_and_order(pipe) -> None:
    p, sampler, task = pipe
    assert [scheduled_version(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]
    p.push(weights(), 0)
    for step in range(3):
        p.submit(step, episodes(task, step))
    for step in range(6):
        rollouts, metrics = p.take(step)
        assert {r.policy_version for r in rollouts} == {scheduled_version(step, 2)}
        assert [r.completion_ids[0] for r in rollouts] == [scheduled_version(step, 2)] * 2
        assert set(metrics) == {"time/trainer_wait_s", "time/sampler_wait_s", "async/batches_ready"}
        assert metrics["async/batches_ready"] in (0.0, 1.0, 2.0)  # of the 2 later steps submitted
        p.push(weights(), step + 1)  # the update of `step` made version step + 1
        p.submit(step + 3, episodes(task, step + 3))
    # every batch was sampled after the push of its version and before the next one
    assert sampler.calls[:4] == [("push", 0), ("generate", 0), ("generate", 0), ("generate", 0)]
    assert sampler.calls[4:6] == [("push", 1), ("generate", 1)]


def test_a_push_sends_the_weights_as_they_were_when_pushed(pipe) -> None:
    """The worker loads a push later, while the trainer's next update changes the policy in place: the push
    must carry a snapshot, or the sampler would get a later version's weights under this version's number."""
    p, sampler, task = pipe
    received = []
    load = sampler.update_weights

    def recording(weights, version: int) -> None:
        received.append((version, [float(t[0]) for _, t in weights]))
        load(weights, version)

    sampler.update_weights = recording
    sampler.gate.clear()  # the worker is busy sampling: the push waits in the queue
    p.push(weights(), 0)
    p.submit(0, episodes(task, 0))
    live = torch.zeros(1)
    p.push([("w", live)], 1)
    live.add_(5.0)  # the trainer's next update, before the worker reaches the push
    sampler.gate.set()
    p.take(0)
    p.drain()  # waits for the sampled batches, not for the push queued after them: wait for it here
    deadline = time.monotonic() + 30
    while len(received) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received == [(0, [0.0]), (1, [0.0])]


def test_a_batch_sampled_by_another_version_is_refused(pipe) -> None:
    p, sampler, task = pipe
    sampler.update_weights = lambda weights, version: setattr(sampler, "policy_version", 0)  # stuck at 0
    p.push(weights(), 0)
    for step in range(3):
        p.submit(step, episodes(task, step))
    for step in range(3):
        p.take(step)
    p.push(weights(), 1)
    p.submit(3, episodes(task, 3))  # scheduled version 1, sampled by 0 (the engine never moved)
    with pytest.raises(PipelineError, match=r"sampled by versions \[0\], scheduled 1"):
        p.take(3)


def test_out_of_schedule_submissions_are_refused(pipe) -> None:
    p, _, task = pipe
    p.push(weights(), 0)
    with pytest.raises(PipelineError, match="expected step 0"):
        p.submit(1, episodes(task, 1))
    for step in range(3):
        p.submit(step, episodes(task, step))
    with pytest.raises(PipelineError, match="version 1"):
        p.submit(3, episodes(task, 3))  # step 3 needs version 1, but 0 was pushed last
    with pytest.raises(PipelineError, match="no batch was submitted for step 7"):
        p.take(7)


def test_drain_and_restore_round_trip(pipe, char_tokenizer) -> None:
    p, sampler, task = pipe
    sampler.gate.clear()  # nothing is sampled until the drain waits for it
    p.push(weights(), 0)
    for step in range(3):
        p.submit(step, episodes(task, step))
    threading.Timer(0.2, sampler.gate.set).start()
    saved = p.drain()
    assert [d["step"] for d in saved] == [0, 1, 2] and all(d["rollouts"] for d in saved)
    other = Pipeline(Scripted(), Prompter(task, char_tokenizer, "compact"), SETTINGS, staleness=2)
    try:
        other.restore(saved, 0)
        assert other.next_step == 3 and other.pushed_version == -1
        restored, _ = other.take(0)
        original, _ = p.take(0)
        assert [d["step"] for d in p.drain()] == [1, 2]  # a batch taken is no longer queued (nor saved)
        assert [(r.completion_ids, r.sample_logprobs, r.policy_version, r.sampling) for r in restored] == [
            (r.completion_ids, r.sample_logprobs, r.policy_version, r.sampling) for r in original
        ]
        with pytest.raises(PipelineError, match="do not fit the schedule"):
            other.restore(saved, 1)  # a checkpoint of step 1 must start with step 1's batch
    finally:
        other.shutdown()


def test_restored_empty_the_queue_starts_afresh_at_the_step(pipe, char_tokenizer) -> None:
    """After a rollback to step 5 (k = 2) nothing queued is kept: the batches of steps 5, 6, 7 are sampled by the
    restored version 5 (the schedule's floor), then the schedule goes on (step 8: version 6). A checkpoint of
    that queue restores; one whose versions do not follow the schedule from its first batch is refused."""
    p, _, task = pipe
    p.push(weights(), 0)
    for step in range(3):
        p.submit(step, episodes(task, step))
    p.restore([], 5)  # drops steps 0-2
    assert p.batches == {} and p.next_step == 5 and p.pushed_version == -1
    with pytest.raises(PipelineError, match="version 5"):
        p.push(weights(), 3)
        p.submit(5, episodes(task, 5))  # version 3 = 5 - k, but the weights of 3 are gone: 5 is the floor
    p.push(weights(), 5)
    for step in (5, 6, 7):
        p.submit(step, episodes(task, step))
    assert {r.policy_version for r in p.take(5)[0]} == {5}
    p.push(weights(), 6)
    p.submit(8, episodes(task, 8))
    saved = p.drain()
    assert [(d["step"], d["version"]) for d in saved] == [(6, 5), (7, 5), (8, 6)]
    other = Pipeline(Scripted(), Prompter(task, char_tokenizer, "compact"), SETTINGS, staleness=2)
    try:
        other.restore(saved, 6)
        assert other.floor == 5 and other.next_step == 9
        bad = [saved[0], {**saved[1], "version": 6}, saved[2]]  # 5, 6, 6: step 7 is version 5 from floor 5
        with pytest.raises(PipelineError, match="do not fit the schedule"):
            other.restore(bad, 6)
    finally:
        other.shutdown()


def open_the_gate_in_the_next_epoch(p: Pipeline, sampler: Scripted) -> None:
    """Let the job the worker holds go on once `restore` or `shutdown` has begun (started a new epoch)."""
    epoch = p._epoch

    def release() -> None:
        while p._epoch == epoch:
            time.sleep(0.01)
        sampler.gate.set()

    threading.Thread(target=release, daemon=True).start()


def test_a_restore_discards_the_running_job_and_its_error(pipe) -> None:
    """A restore waits for the job the worker is running and discards its result: its error too (the sampler
    broke on weights the restore leaves behind). Jobs queued before the restore never run: none may sample
    without the push it was queued after (a CI run once sampled with no weights at all that way)."""
    p, sampler, task = pipe
    sampler.gate.clear()
    p.push(weights(), 0)
    p.submit(0, episodes(task, 0))  # the worker blocks in it
    p.submit(1, episodes(task, 1))  # queued: never runs
    assert sampler.generating.wait(30)
    sampler.fail = True
    open_the_gate_in_the_next_epoch(p, sampler)
    p.restore([], 5)  # the running job fails after the restore began
    sampler.fail = False
    p.push(weights(), 5)
    p.submit(5, episodes(task, 5))
    assert {r.policy_version for r in p.take(5)[0]} == {5}
    assert sampler.calls == [("push", 0), ("push", 5), ("generate", 5)]


def test_shutdown_waits_for_the_running_job_only(pipe) -> None:
    """A run that ends on an error leaves k + 1 batches queued: shutting down must not sample them first."""
    p, sampler, task = pipe
    sampler.gate.clear()
    p.push(weights(), 0)
    for step in range(3):
        p.submit(step, episodes(task, step))
    assert sampler.generating.wait(30)
    open_the_gate_in_the_next_epoch(p, sampler)
    p.shutdown()
    assert sampler.calls == [("push", 0), ("generate", 0)]


def test_heartbeats_while_waiting_only_while_the_sampler_progresses(pipe) -> None:
    """A hung sampler must stop the trainer's heartbeats (the supervisor then restarts the worker); one that
    decodes keeps them going."""
    p, sampler, task = pipe
    beats = []
    sampler.gate.clear()  # hung: no progress at all
    p.push(weights(), 0)
    deadline = time.monotonic() + 30
    while (sampler.calls != [("push", 0)] or p._busy) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the push has finished (a finished job counts as progress)
    p.submit(0, episodes(task, 0))
    threading.Timer(3.5, sampler.gate.set).start()
    p.take(0, on_wait=lambda: beats.append(1))
    assert len(beats) <= 1  # at most the batch's own completion; nothing while it hung
    ticking = threading.Event()

    def tick() -> None:  # a sampler decoding: progress signals every 0.2 s
        while not ticking.wait(0.2):
            p.progress()

    sampler.gate.clear()
    p.submit(1, episodes(task, 1))
    threading.Thread(target=tick, daemon=True).start()
    threading.Timer(3.5, sampler.gate.set).start()
    beats.clear()
    p.take(1, on_wait=lambda: beats.append(1))
    ticking.set()
    assert len(beats) >= 3  # about one a second


def test_a_sampler_failure_reaches_the_trainer(pipe) -> None:
    p, sampler, task = pipe
    sampler.fail = True
    p.push(weights(), 0)
    p.submit(0, episodes(task, 0))
    with pytest.raises(PipelineError, match="the engine broke"):
        p.take(0)


@contextlib.contextmanager
def torch_threads(n: int):
    """This process's torch threads set to `n` for a while. A matmul's reduction is split by thread count, so
    the same weights give log-probs that differ in the last bit between 1 and 2 threads: a bit-for-bit
    comparison between processes holds only at equal thread counts."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_sampling_process_equals_the_in_process_sampler_and_a_replaced_one_reloads(
    tiny_model, tiny_model_dir: Path, char_tokenizer
) -> None:
    """Bit-identical to the in-process sampler at the same thread count (1 here, in both processes; the child
    is pinned by ProcessSampler's `threads`). The weights pushed differ from model.path's, so a child that is
    killed and replaced must be reloaded with them, or it samples model.path's weights; and with a copy of them
    as pushed, since the trainer changes its tensors in place afterwards."""
    cfg = load_config("configs/smoke.toml", [f'model.path="{tiny_model_dir}"'])
    pushed = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in pushed.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    prompts, seeds = [[5, 6, 7], [8, 9]], [11, 12]
    with torch_threads(1):
        local = HFSampler(pushed, char_tokenizer).generate(prompts, SamplingSettings(8), seeds)
        unpushed = HFSampler(tiny_model, char_tokenizer).generate(prompts, SamplingSettings(8), seeds)
    assert [g.completion_ids for g in local] != [g.completion_ids for g in unpushed]  # the push matters
    sampler = ProcessSampler(cfg, threads=1)
    try:
        with pytest.raises(SamplerProcessError, match="before update_weights"):
            sampler.generate([[1, 2, 3]], SETTINGS, [0])
        sampler.update_weights(untied_state_dict(pushed).items(), 3)
        remote = sampler.generate(prompts, SamplingSettings(8), seeds)
        assert [(g.completion_ids, g.logprobs) for g in remote] == [
            (g.completion_ids, g.logprobs) for g in local
        ]
        assert sampler.policy_version == 3
        with torch.no_grad():  # the trainer's next update changes the pushed tensors in place
            for p in pushed.parameters():
                p.mul_(0.5)
        pid = sampler.engine_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        again = sampler.generate(prompts, SamplingSettings(8), seeds)  # replaced, reloaded, redone
        assert sampler.engine_pid != pid and sampler.take_replaced() == 1
        assert [(g.completion_ids, g.logprobs) for g in again] == [
            (g.completion_ids, g.logprobs) for g in local
        ]
    finally:
        sampler.shutdown()
