"""The asynchronous pipeline's schedule and bookkeeping (rollout/pipeline.py) with a scripted sampler, and the
sampling process (rollout/process.py) against the in-process sampler."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from keelrl.config import load_config
from keelrl.rollout import Generation, SamplingSettings
from keelrl.rollout.episodes import Episode, Prompter
from keelrl.rollout.hf import HFSampler
from keelrl.rollout.pipeline import Pipeline, PipelineError, scheduled_version
from keelrl.rollout.process import ProcessSampler, SamplerProcessError
from keelrl.rollout.weights import untied_state_dict
from keelrl.tasks import get_task

SETTINGS = SamplingSettings(max_new_tokens=4)


class Scripted:
    """Completion = [version, seed % 7]; records the order of its calls; `gate` holds generation back."""

    def __init__(self) -> None:
        self.policy_version = -1
        self.calls: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def update_weights(self, weights, version: int) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("push", version))
        self.policy_version = version

    def generate(self, prompts, settings, seeds):  # type: ignore[no-untyped-def]
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
        assert set(metrics) == {"time/trainer_wait_s", "time/sampler_wait_s"}
        p.push(weights(), step + 1)  # the update of `step` made version step + 1
        p.submit(step + 3, episodes(task, step + 3))
    # every batch was sampled after the push of its version and before the next one
    assert sampler.calls[:4] == [("push", 0), ("generate", 0), ("generate", 0), ("generate", 0)]
    assert sampler.calls[4:6] == [("push", 1), ("generate", 1)]


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
        assert [(r.completion_ids, r.sample_logprobs, r.policy_version, r.sampling) for r in restored] == [
            (r.completion_ids, r.sample_logprobs, r.policy_version, r.sampling) for r in original
        ]
        with pytest.raises(PipelineError, match="do not fit the schedule"):
            other.restore(saved, 1)  # a checkpoint of step 1 must start with step 1's batch
    finally:
        other.shutdown()


def test_heartbeats_while_waiting_only_while_the_sampler_progresses(pipe) -> None:
    """A hung sampler must stop the trainer's heartbeats (the supervisor then restarts the worker); one that
    decodes keeps them going."""
    p, sampler, task = pipe
    beats = []
    sampler.gate.clear()  # hung: no progress at all
    p.push(weights(), 0)
    time.sleep(0.3)  # the push has finished (a finished job counts as progress)
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


def test_sampling_process_equals_the_in_process_sampler(
    tiny_model, tiny_model_dir: Path, char_tokenizer
) -> None:
    cfg = load_config("configs/smoke.toml", [f'model.path="{tiny_model_dir}"'])
    sampler = ProcessSampler(cfg)
    try:
        with pytest.raises(SamplerProcessError, match="before update_weights"):
            sampler.generate([[1, 2, 3]], SETTINGS, [0])
        sampler.update_weights(untied_state_dict(tiny_model).items(), 3)
        prompts, seeds = [[5, 6, 7], [8, 9]], [11, 12]
        local = HFSampler(tiny_model, char_tokenizer).generate(prompts, SamplingSettings(8), seeds)
        remote = sampler.generate(prompts, SamplingSettings(8), seeds)
        assert [(g.completion_ids, g.logprobs) for g in remote] == [
            (g.completion_ids, g.logprobs) for g in local
        ]
        assert sampler.policy_version == 3
    finally:
        sampler.shutdown()
