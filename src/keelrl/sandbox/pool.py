"""`SandboxPool`: many executions at once, one sandbox slot per worker thread."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from keelrl.sandbox.execute import Sandbox
from keelrl.sandbox.isolation import IsolationRequest
from keelrl.sandbox.result import Call, ExecResult, IsolationLevel, Job, SandboxError, SandboxLimits


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


@dataclass
class _Work:
    job: Job
    future: Future[ExecResult] = field(default_factory=Future)


class SandboxPool(contextlib.AbstractContextManager):
    """`workers` sandbox slots, one thread each, fed from a bounded queue (`submit` blocks when it is full).
    Results come back as futures; `run_many` keeps the input order. As root each slot leases its own uid."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        queue_size: int | None = None,
        isolation: IsolationRequest = "auto",
        limits: SandboxLimits | None = None,
        python: str | None = None,
        hide: Sequence[str] = (),
    ) -> None:
        self.workers = workers or default_workers()
        if self.workers < 1:
            raise SandboxError(f"workers must be >= 1 (got {self.workers})")
        self._queue: queue.Queue[_Work | None] = queue.Queue(maxsize=queue_size or 2 * self.workers)
        self._boxes = [Sandbox(isolation, limits, python, hide) for _ in range(self.workers)]
        self.level: IsolationLevel = self._boxes[0].level
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, args=(box,), name=f"keelrl-sandbox-{i}", daemon=True)
            for i, box in enumerate(self._boxes)
        ]
        for t in self._threads:
            t.start()

    def _serve(self, box: Sandbox) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            if not work.future.set_running_or_notify_cancel():
                continue
            try:
                j = work.job
                work.future.set_result(box.run(j.code, j.entry_point, j.calls, j.limits))
            except Exception as err:  # a bug in the sandbox itself: hand it to the caller, keep serving
                work.future.set_exception(err)

    def submit(self, job: Job) -> Future[ExecResult]:
        if self._closed:
            raise SandboxError("this SandboxPool is closed")
        work = _Work(job)
        self._queue.put(work)
        return work.future

    def run_many(self, jobs: Iterable[Job]) -> list[ExecResult]:
        """Run all jobs (up to `workers` at a time) and return their results in order."""
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def run(self, code: str, entry_point: str | None = None, calls: Sequence[Call | str] = ()) -> ExecResult:
        return self.submit(Job(code, entry_point, calls)).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        for box in self._boxes:
            box.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
