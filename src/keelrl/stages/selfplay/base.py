"""What a task needs for self-play: a `Proposer` says how to ask for a problem, checks what came back by the
task's own rules, and names a problem's canonical key (what the buffer deduplicates on). `proposers.PROPOSERS`
maps a task name to its proposer (countdown.py, code.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from keelrl.stages.selfplay.buffer import ProblemBuffer


@dataclass(frozen=True)
class Proposal:
    problem: dict[str, Any] | None  # None when refused
    reason: str  # "valid", or why it was refused (one of the proposer's `reasons`)
    key: str = ""


class Proposer(Protocol):
    """`selfplay.proposal` is the form: "problem" (the proposer states the answer key: a Countdown target, a
    code problem's expected values, and the task checks it) or "worked" (the proposer writes a solution and the
    task's executor computes the answer key from it, as Absolute Zero's does)."""

    reasons: tuple[str, ...]  # every refusal reason check() can give (each a selfplay/refused/* metric)

    def cue(self, task: Any, draw: int, buffer: ProblemBuffer) -> dict[str, Any]:
        """What varies between proposer prompts (JSON data), from a seeded integer `draw`."""
        ...

    def prompt(self, task: Any, cue: dict[str, Any], template: str, form: str) -> tuple[str, str]:
        """(user text, the start of the proposer's answer)."""
        ...

    def check(self, task: Any, text: str, form: str) -> Proposal:
        """The proposal in `text` (the start included) as a problem of the task, or why it is refused."""
        ...

    def key(self, problem: dict[str, Any]) -> str: ...
