"""Reward scoring on a pool of Ray actors (`distributed.scorer = "ray"`), so a cluster's CPUs score while
the accelerators train.

`ScorerPool` starts a light local Ray (or joins a cluster by address) and `workers` actors. Each actor
builds its own copy of the task with `task_factory(task)`, i.e. `get_task(name, seed=..., **params)` run
inside the actor, so only plain data crosses the process boundary. `pool.score(problems, completions)`
splits the pairs into chunks with stable indices, keeps every actor busy with up to two chunks, and puts
the results back by chunk index.

Guarantees:
- Results equal in-process scoring: an actor scores a chunk with `score_safely`, the function the trainer's
  local path calls (a checker that raises scores 0 with reason `score_error`), and the chunks are joined in
  input order.
- No sample is lost or used twice: a chunk whose actor died (killed, out of memory, node lost) is re-queued
  to a fresh replacement actor, at most `max_retries` times per chunk, then `ScorerPoolError`. Each chunk's
  result is written exactly once (asserted). A re-queued chunk is scored again from its start, so checkers
  must be free of side effects (they are: a score is a pure function of problem and completion).
- Only actor death is retried. Any other failure (a task that cannot be built, a bug) fails the call with
  the actor's error.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keelrl.config import ConfigError
from keelrl.tasks import Task, get_task
from keelrl.tasks.base import Score, score_safely

CHUNKS_PER_WORKER = 4  # chunks per call and actor: enough to balance load, small enough to redo cheaply
START_TIMEOUT_S = 300.0  # for the actors to come up (a cluster may first have to add nodes)
IN_FLIGHT_PER_WORKER = 2  # chunks queued on one actor, so it never waits for the driver between chunks

RAY_MISSING = (
    'distributed.scorer = "ray" needs Ray, which is not installed in this environment. Install it with '
    "pip install 'keelrl[ray]' (or pip install 'ray>=2.9'), or set distributed.scorer = \"local\" to score "
    "rewards in the training process."
)


class ScorerPoolError(RuntimeError):
    """Scoring on Ray cannot go on; the message says why and what to do."""


def import_ray() -> Any:
    """The `ray` module, or a ConfigError (a user error: one paragraph, exit 2) saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def task_factory(task: Task) -> Callable[[], Task]:
    """A picklable recipe that rebuilds `task` in another process: `get_task(name, seed=seed, **params)`."""
    seed, params = getattr(task, "seed", None), getattr(task, "params", None)
    if seed is None or params is None:
        raise ScorerPoolError(
            f"task {task.name!r} cannot be rebuilt in a Ray worker: it has no `seed` and `params` attributes. "
            'Give it both (as the shipped tasks have), or set distributed.scorer = "local".'
        )
    if hasattr(params, "model_dump"):
        params = params.model_dump()
    return functools.partial(get_task, task.name, seed=seed, **dict(params))


@dataclass
class ScoredBatch:
    scores: list[Score]  # in input order
    errors: list[str]  # checker errors (each such sample scored 0 with reason score_error), in input order
    replaced: int  # actors that died during this call and were replaced


class ScoringWorker:
    """One Ray actor: builds the task once, then scores chunks with the trainer's code path."""

    def __init__(self, make_task: Callable[[], Task]) -> None:
        self.task = make_task()

    def pid(self) -> int:
        return os.getpid()

    def score(self, problems: list[dict[str, Any]], completions: list[str]) -> tuple[list[Score], list[str]]:
        return score_safely(self.task, problems, completions)


class ScorerPool:
    """`workers` Ray actors scoring one task; `score` is a drop-in for in-process scoring."""

    def __init__(
        self,
        make_task: Callable[[], Task],
        workers: int,
        max_retries: int = 3,
        address: str = "",
        chunk_size: int = 0,
    ) -> None:
        """`make_task` runs inside each actor (see `task_factory`); `address` empty starts a local Ray with
        `workers` CPUs unless this process already runs one; `chunk_size` 0 picks one per call."""
        ray = import_ray()
        self.max_retries = max_retries
        self.chunk_size = chunk_size
        self.replaced_total = 0
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
            if address:
                ray.init(address=address, **options)
            else:
                # "local": a new instance even where RAY_ADDRESS or a `ray start` cluster would be joined
                ray.init(address="local", num_cpus=workers, include_dashboard=False, **options)
        self._actor = ray.remote(num_cpus=1, max_restarts=0)(ScoringWorker)
        self._make_task = make_task
        self.workers = [self._actor.remote(make_task) for _ in range(workers)]
        try:  # build the tasks now, so a broken task fails here and not in the middle of a step
            ray.get([w.pid.remote() for w in self.workers], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as err:
            free = ray.available_resources().get("CPU", 0.0)
            self.shutdown()
            raise ScorerPoolError(
                f"Ray did not start {workers} scoring actors (1 CPU each) within {START_TIMEOUT_S:.0f} s; the "
                f"cluster has {free:g} CPUs free. Lower distributed.ray_workers or give the cluster more CPUs."
            ) from err
        except ray.exceptions.RayError as err:
            self.shutdown()
            raise ScorerPoolError(
                f"the Ray scoring workers could not start: {err}. Check that the task can be built from its "
                f'name, seed and params in a fresh process, or set distributed.scorer = "local".'
            ) from err

    def score(self, problems: list[dict[str, Any]], completions: list[str]) -> ScoredBatch:
        """Score `completions[i]` against `problems[i]` on the actors; identical to `score_safely` in this
        process. Replaces actors that die and re-queues their chunks (see the module docstring)."""
        ray = import_ray()
        lost_actor = (
            ray.exceptions.RayActorError,
            ray.exceptions.ActorDiedError,
            ray.exceptions.ActorUnavailableError,
        )
        n = len(problems)
        size = self.chunk_size or max(1, math.ceil(n / (len(self.workers) * CHUNKS_PER_WORKER)))
        chunks = [(start, min(start + size, n)) for start in range(0, n, size)]
        results: list[tuple[list[Score], list[str]] | None] = [None] * len(chunks)
        deaths = [0] * len(chunks)
        pending = deque(range(len(chunks)))
        in_flight: dict[Any, tuple[int, int, Any]] = {}  # result ref -> (chunk, worker slot, actor)
        replaced = 0
        while pending or in_flight:
            for slot, actor in enumerate(self.workers):
                queued = sum(1 for _, s, _ in in_flight.values() if s == slot)
                for _ in range(IN_FLIGHT_PER_WORKER - queued):
                    if not pending:
                        break
                    chunk = pending.popleft()
                    start, end = chunks[chunk]
                    ref = actor.score.remote(problems[start:end], completions[start:end])
                    in_flight[ref] = (chunk, slot, actor)
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                chunk, slot, actor = in_flight.pop(ref)
                try:
                    value = ray.get(ref)
                except lost_actor as err:
                    deaths[chunk] += 1
                    if deaths[chunk] > self.max_retries:
                        start, end = chunks[chunk]
                        raise ScorerPoolError(
                            f"completions {start}..{end - 1} lost their Ray scoring actor {deaths[chunk]} times "
                            f"(distributed.ray_max_retries={self.max_retries}); last error: {err}. Actors "
                            "keep dying: look for out-of-memory kills or a checker that crashes its process "
                            "in the Ray logs (/tmp/ray/session_latest/logs on the node), or raise "
                            "distributed.ray_max_retries."
                        ) from err
                    pending.appendleft(chunk)
                    if self.workers[slot] is actor:  # the first of its chunks to report the death
                        ray.kill(actor, no_restart=True)
                        self.workers[slot] = self._actor.remote(self._make_task)
                        replaced += 1
                    continue
                assert results[chunk] is None, f"chunk {chunk} would be written twice"
                results[chunk] = value
        self.replaced_total += replaced
        scores: list[Score] = []
        errors: list[str] = []
        for result in results:
            assert result is not None
            scores.extend(result[0])
            errors.extend(result[1])
        assert len(scores) == n
        return ScoredBatch(scores, errors, replaced)

    def shutdown(self) -> None:
        """Stop the actors, and Ray itself when this pool started it."""
        ray = import_ray()
        if not ray.is_initialized():
            return
        for actor in self.workers:
            ray.kill(actor, no_restart=True)
        self.workers = []
        if self.owns_ray:
            ray.shutdown()
