"""The problems self-play has proposed: deduplicated by a canonical key, each with its difficulty record (the
solver's attempts and successes, and the step it was proposed at). The buffer is plain JSON (`state_dict`), so
it lives in TrainState's problem-source state and a resumed run continues with the same buffer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Entry:
    problem: dict[str, Any]
    step: int  # when it was first proposed
    attempts: int = 0
    solved: int = 0

    @property
    def solve_rate(self) -> float | None:
        return self.solved / self.attempts if self.attempts else None


@dataclass
class ProblemBuffer:
    """Proposed problems by key, in the order they were accepted; `capacity` keeps the newest ones."""

    capacity: int = 4096
    entries: dict[str, Entry] = field(default_factory=dict)
    proposals: int = 0  # every proposal offered, accepted or not
    duplicates: int = 0

    def add(self, key: str, problem: dict[str, Any], step: int) -> bool:
        """Accept a valid problem unless its key is already here (then count a duplicate). Past `capacity`,
        the oldest entry leaves (its key may then be proposed again)."""
        self.proposals += 1
        if key in self.entries:
            self.duplicates += 1
            return False
        self.entries[key] = Entry(problem, step)
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]
        return True

    def record(self, key: str, attempts: int, solved: int) -> None:
        """Add the solver's attempts on a problem to its difficulty record."""
        if not 0 <= solved <= attempts:
            raise ValueError(f"solved ({solved}) must lie in [0, attempts ({attempts})]")
        entry = self.entries[key]
        entry.attempts += attempts
        entry.solved += solved

    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "proposals": self.proposals,
            "duplicates": self.duplicates,
            "entries": [[k, e.problem, e.step, e.attempts, e.solved] for k, e in self.entries.items()],
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> ProblemBuffer:
        entries = {
            key: Entry(problem, int(step), int(attempts), int(solved))
            for key, problem, step, attempts, solved in data["entries"]
        }
        return cls(int(data["capacity"]), entries, int(data["proposals"]), int(data["duplicates"]))
