"""The asynchronous pipeline (`rollout.max_staleness` = k >= 1): the batch that step t trains on is sampled by
policy version max(t - k, 0) exactly, in another process, while the trainer updates.

Schedule. After step t's update the trainer pushes the new weights (version t + 1) and submits the batch of
step t + 1 + k; at the start it pushes version 0 and submits the batches of steps 0..k (`collect.fill_pipeline`
draws their problems and seeds exactly as the synchronous loop would for those steps). One worker thread runs
the jobs in the order given, pushes and batches alike, on a sampler that lives in another process (a
`ProcessSampler`, or a Ray `SamplerPool`), so a batch is always sampled by the last version pushed before it was
submitted. The schedule depends only on the step, never on timing: a run is reproducible, and a resumed run
equals an uninterrupted one.

Checkpoints. A save first waits for every submitted batch (`drain`) and stores them, sampled, with their step,
version and episodes (`TrainState.pipeline`): a restart cannot regenerate them, because the weights of the
versions they need are gone. Nothing half-finished is stored, and a restored batch is checked against the
schedule (its step and version). The pipeline runs k + 1 batches ahead whatever train.steps is, so that a run
extended on resume continues exactly; the last checkpoint therefore samples k + 1 batches no step uses. A killed
sampling process is replaced by the sampler itself, which reloads the last weights pushed (the ones the current
batch needs) and redoes the batch from its start.

Rollbacks. A rollback (a guard's) restores an older checkpoint whose queue holds the batches drawn and sampled
before the trouble: replaying them would train the first k + 1 steps after the rollback on the very samples
(problems and seeds) the rollback exists to leave behind. So they are dropped (`restore` with none), and the
batches of steps s..s + k are drawn afresh (new seeds, the problem source's current cursor) and sampled by the
restored version s, the oldest weights there are: the schedule is max(t - k, floor), with floor = s after a
rollback (0 at the start). Those first batches are fresher than k, never staler.

Metrics (`take`): time/trainer_wait_s, the time the trainer waited for its batch; time/sampler_wait_s, the time
the sampler sat idle since the previous batch was taken, waiting for weights (the next version) to sample with;
async/batches_ready, the batches of later steps already sampled when the trainer took its own (the queue: k
when the sampler is ahead, 0 when the trainer waits on it).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from keelrl.models.weights import NamedTensors
from keelrl.rollout import Rollout, Sampler, SamplingSettings
from keelrl.rollout.episodes import Episode, Prompter, generate


class PipelineError(RuntimeError):
    """The asynchronous pipeline cannot go on (its sampler failed, or a restored batch does not fit)."""


def scheduled_version(step: int, staleness: int, floor: int = 0) -> int:
    """The policy version that samples the batch of `step`: max(step - k, floor), floor being the step the queue
    was last started from empty (0, or a rollback's step)."""
    return max(step - staleness, floor)


@dataclass
class Batch:
    """One submitted batch: the step it is for, the version that samples it, its episodes and, once sampled,
    its (unscored) rollouts."""

    step: int
    version: int
    episodes: list[Episode]
    rollouts: list[Rollout] | None = None

    def to_dict(self) -> dict[str, Any]:
        assert self.rollouts is not None, "only sampled batches are saved"
        return asdict(self)  # the episodes and rollouts as plain dicts too

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Batch:
        rollouts = [Rollout(**{**r, "sampling": SamplingSettings(**r["sampling"])}) for r in d["rollouts"]]
        return Batch(int(d["step"]), int(d["version"]), [Episode(**e) for e in d["episodes"]], rollouts)


class ProgressCount:
    """Counts progress signals: the sampler's (decode steps, finished chunks) and finished jobs. The trainer
    sends heartbeats while it waits only when this count moves, so a hung sampler stops them and the supervisor's
    hang detection restarts the worker, as in the synchronous loop."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


class Pipeline:
    """Batches submitted ahead, sampled in order on `sampler` by one worker thread (see the module docstring).
    `prompter` must be this pipeline's own (its tokenizer is used on the worker thread)."""

    def __init__(
        self,
        sampler: Sampler,
        prompter: Prompter,
        settings: SamplingSettings,
        staleness: int,
        progress: ProgressCount | None = None,
    ) -> None:
        """`progress`: the count `sampler` signals its progress to (its `on_progress`)."""
        self.sampler, self.prompter, self.settings, self.staleness = sampler, prompter, settings, staleness
        self.progress = progress or ProgressCount()
        self.batches: dict[int, Batch] = {}  # step -> batch, submitted and not yet taken
        self.next_step = 0  # the next step to submit
        self.pushed_version = -1
        self.floor = 0  # the oldest version any batch may be sampled by (scheduled_version)
        # jobs are tagged with the epoch they were queued in; `restore` starts a new epoch, and the worker skips
        # the jobs of older ones (their results are discarded, so their errors are too)
        self._jobs: queue.SimpleQueue[tuple[int, Callable[[], None]] | None] = queue.SimpleQueue()
        self._epoch = 0
        self._done = threading.Condition()
        self._error: Exception | None = None
        self._busy = False
        self._idle_s = 0.0  # the worker's idle time since the last take
        self._thread = threading.Thread(target=self._work, name="keelrl-pipeline", daemon=True)
        self._thread.start()

    # --- the worker thread ---
    def _work(self) -> None:
        while True:
            t0 = time.perf_counter()
            item = self._jobs.get()
            if item is None:
                return
            epoch, job = item
            # under the lock `restore` starts a new epoch in: a job either runs whole or not at all
            with self._done:
                self._idle_s += time.perf_counter() - t0
                if epoch != self._epoch:
                    continue
                self._busy = True
            try:
                if self._error is None:  # after a failure the queue is dropped: `take` raises it
                    job()
            except Exception as err:  # handed to the trainer thread: `take` and `drain` raise it
                with self._done:
                    if epoch == self._epoch:  # a job `restore` discarded while it ran fails to no one
                        self._error = err
            self.progress()
            with self._done:
                self._busy = False
                self._done.notify_all()

    def _sample(self, batch: Batch) -> None:
        rollouts = generate(self.sampler, self.prompter, batch.episodes, self.settings)
        versions = {r.policy_version for r in rollouts}
        if versions - {batch.version}:
            raise PipelineError(
                f"the batch of step {batch.step} was sampled by versions {sorted(versions)}, scheduled {batch.version}"
            )
        with self._done:
            batch.rollouts = rollouts

    # --- the trainer thread ---
    def push(self, weights: NamedTensors, version: int) -> None:
        """Sample every batch submitted from now on with `weights` (copied now: the policy keeps changing)."""
        snapshot = [(k, v.detach().to("cpu", copy=True)) for k, v in dict(weights).items()]
        self._jobs.put((self._epoch, lambda: self.sampler.update_weights(snapshot, version)))
        self.pushed_version = version

    def submit(self, step: int, episodes: list[Episode]) -> None:
        """Queue the batch of `step`; it is sampled by the version pushed last, which must be the scheduled one."""
        version = scheduled_version(step, self.staleness, self.floor)
        if step != self.next_step or version != self.pushed_version:
            raise PipelineError(
                f"batch of step {step} submitted out of schedule: expected step {self.next_step}, version {version} "
                f"but version {self.pushed_version} was pushed last"
            )
        batch = Batch(step, version, episodes)
        self.batches[step] = batch
        self.next_step = step + 1
        self._jobs.put((self._epoch, lambda: self._sample(batch)))

    def _wait_for(self, ready: Callable[[], bool], on_wait: Callable[[], None] | None) -> float:
        """Block until `ready()` (checked under the lock) or the worker failed; returns the seconds waited."""
        t0, seen = time.perf_counter(), self.progress.count
        with self._done:
            while not ready() and self._error is None:
                self._done.wait(timeout=1.0)
                if on_wait is not None and self.progress.count != seen:  # only while the sampler progresses
                    seen = self.progress.count
                    on_wait()
        if self._error is not None:
            raise PipelineError(f"asynchronous sampling failed: {self._error}") from self._error
        return time.perf_counter() - t0

    def take(
        self, step: int, on_wait: Callable[[], None] | None = None
    ) -> tuple[list[Rollout], dict[str, float]]:
        """The sampled batch of `step` and the time/*_wait_s metrics. While it waits, `on_wait` (the heartbeat) is
        called about once a second, as long as the sampler makes progress."""
        if step not in self.batches:
            raise PipelineError(f"no batch was submitted for step {step} (submitted: {sorted(self.batches)})")
        batch = self.batches[step]
        waited = self._wait_for(lambda: batch.rollouts is not None, on_wait)
        del self.batches[step]
        with self._done:
            idle, self._idle_s = self._idle_s, 0.0
            ready = sum(b.rollouts is not None for b in self.batches.values())  # the queue: sampled ahead
        assert batch.rollouts is not None
        waits = {"time/trainer_wait_s": waited, "time/sampler_wait_s": idle}
        return batch.rollouts, {**waits, "async/batches_ready": float(ready)}

    def drain(self, on_wait: Callable[[], None] | None = None) -> list[dict[str, Any]]:
        """Wait until every submitted batch is sampled; return them as plain data (for `TrainState.pipeline`)."""
        self._wait_for(lambda: all(b.rollouts is not None for b in self.batches.values()), on_wait)
        return [self.batches[s].to_dict() for s in sorted(self.batches)]

    def restore(self, saved: list[dict[str, Any]], step: int) -> None:
        """Replace what is queued by the sampled batches `saved` (from `drain`, at a checkpoint of `step`): they must
        be the batches of steps step, step + 1, ... with their scheduled versions. None (a start, or a rollback,
        which drops the stored ones): the queue starts afresh at `step` (floor = step). Jobs not started are
        dropped; the worker's current one is waited for (its result, or its error, is discarded)."""
        with self._done:
            self._epoch += 1
        self._wait_for(lambda: not self._busy, None)
        batches = [Batch.from_dict(d) for d in saved]
        expected = list(range(step, step + len(batches)))
        floor = batches[0].version if batches else step
        if (
            [b.step for b in batches] != expected
            or not scheduled_version(step, self.staleness) <= floor <= step
            or any(b.version != scheduled_version(b.step, self.staleness, floor) for b in batches)
        ):
            raise PipelineError(
                f"the checkpoint's queued batches (steps {[b.step for b in batches]}, versions "
                f"{[b.version for b in batches]}) do not fit the schedule of step {step} with max_staleness "
                f"{self.staleness}"
            )
        self.batches = {b.step: b for b in batches}
        self.next_step, self.floor = step + len(batches), floor
        self.pushed_version = -1  # whatever the sampler holds, the next push is needed

    def shutdown(self) -> None:
        """Stop the worker after its current job (the queued ones are dropped), then the sampler."""
        with self._done:
            self._epoch += 1
        self._jobs.put(None)
        self._thread.join(timeout=60)
        if hasattr(self.sampler, "shutdown"):
            self.sampler.shutdown()


def staleness_metrics(
    rollouts: list[Rollout], version: int, gather: Callable[[list[Any]], list[Any]]
) -> dict[str, float]:
    """async/staleness_mean and async/staleness_max: the current policy version minus each rollout's sampling
    version, over the global batch (`gather`: all ranks' lists joined)."""
    lags = torch.tensor(gather([version - r.policy_version for r in rollouts]), dtype=torch.float64)
    if lags.numel() == 0:
        return {}
    return {"async/staleness_mean": float(lags.mean()), "async/staleness_max": float(lags.max())}
