"""Self-play's problem source: the buffer of proposed problems (`buffer.py`). It is the run's `ProblemSource`
under `train.stage = "selfplay"`, so its state is saved with TrainState's problem-source state like any
curriculum's, and a resumed run continues with the same buffer and cursor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keelrl.curriculum.sources import GroupOutcome
from keelrl.stages.selfplay.buffer import ProblemBuffer


class SelfPlaySource:
    def __init__(self, capacity: int) -> None:
        self.buffer = ProblemBuffer(capacity=capacity)
        self.cursor = 0  # the top-up walks the buffer in order, round and round

    def next_problems(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        """n problems from the buffer for the solver to practise on (fewer when the buffer is smaller)."""
        keys = list(self.buffer.entries)
        if not keys:
            return []
        picked = [keys[(self.cursor + i) % len(keys)] for i in range(min(n, len(keys)))]
        self.cursor = (self.cursor + len(picked)) % len(keys)
        return [(-1, {**self.buffer.entries[k].problem}) for k in picked]

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        """Unused: the self-play step records each problem's attempts in the buffer itself."""

    def metrics(self) -> dict[str, float]:
        return {"selfplay/buffer_size": float(len(self.buffer.entries))}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "selfplay", "cursor": self.cursor, "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if state.get("kind") != "selfplay":
            raise ValueError(
                f"the checkpoint's problem source is {state.get('kind', 'sequential')!r}, not a self-play buffer; "
                "resume with the train.stage it was made with"
            )
        self.cursor = int(state["cursor"])
        self.buffer = ProblemBuffer.from_state(state["buffer"])
