"""Which problems to train on next.

A problem source hands the trainer the next `n` problems of the train split and keeps its position in a
JSON-serialisable state that lives in `TrainState.curriculum`, so a resumed run continues with exactly
the problems it would have seen.
"""

from __future__ import annotations

from typing import Any, Protocol

from keelrl.tasks import Task


class ProblemSource(Protocol):
    def next_problems(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        """The next n (index, problem) pairs (global, before sharding by rank)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SequentialSource:
    """Train problems in index order (the generator is random, so this is uniform sampling)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.cursor = 0

    def next_problems(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        out = [(i, self.task.problem("train", i)) for i in range(self.cursor, self.cursor + n)]
        self.cursor += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "sequential", "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.cursor = int(state["cursor"])
