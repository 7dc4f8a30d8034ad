"""Countdown proposals: what the proposer writes, and the task's own check that it is a fair problem.

The proposer writes a problem in the compact template's form, `37 12 -> 444` (numbers, then the target),
optionally inside `<problem> </problem>`. `check_proposal` accepts it only when it is well-formed, inside the
task's ranges (count of numbers, each number, the target), not a held-out problem (its number multiset must be
in the train split, so the fixed eval set stays unseen) and solvable within the rules (the brute-force
`solve`: each number exactly once, + - * /, exact rationals). The canonical key (sorted numbers and the
target) is what the buffer deduplicates on: `12 37 -> 444` and `37 12 -> 444` are one problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from keelrl.tasks.base import in_test_split
from keelrl.tasks.countdown import Countdown, solve

PROPOSAL = re.compile(
    r"^\s*(?:<problem>\s*)?(\d{1,6}(?:[ ,]+\d{1,6}){0,7})\s*->\s*(\d{1,7})\s*(?:</problem>)?\s*$"
)


@dataclass(frozen=True)
class Proposal:
    problem: dict[str, Any] | None  # None when refused
    reason: str  # "valid", or why it was refused
    key: str = ""


def problem_key(problem: dict[str, Any]) -> str:
    """Canonical key: sorted numbers and the target, e.g. "12,37->444"."""
    return ",".join(map(str, sorted(problem["numbers"]))) + f"->{problem['target']}"


def parse_proposal(text: str) -> dict[str, Any] | None:
    """The problem in the proposer's first line, or None when it is not `N N ... -> T`."""
    line = text.strip().split("\n", 1)[0] if text.strip() else ""
    m = PROPOSAL.match(line)
    if m is None:
        return None
    return {"numbers": [int(x) for x in re.split(r"[ ,]+", m.group(1))], "target": int(m.group(2))}


def check_proposal(task: Countdown, text: str) -> Proposal:
    """Parse and check one proposal against the task's rules (see the module docstring)."""
    problem = parse_proposal(text)
    if problem is None:
        return Proposal(None, "malformed")
    p, numbers, target = task.params, problem["numbers"], problem["target"]
    if not p.min_numbers <= len(numbers) <= p.max_numbers:
        return Proposal(None, "count_out_of_range")
    if any(not p.min_number <= n <= p.max_number for n in numbers):
        return Proposal(None, "number_out_of_range")
    if not p.min_target <= target <= p.max_target:
        return Proposal(None, "target_out_of_range")
    if in_test_split(tuple(sorted(numbers)), task.seed, p.test_fraction):
        return Proposal(None, "held_out")
    if solve(numbers, target) is None:
        return Proposal(None, "unsolvable")
    return Proposal(problem, "valid", problem_key(problem))


PROPOSE_TEXT = (
    "Write a new Countdown problem: {lo_n} to {hi_n} numbers from {lo} to {hi}, and a target from {tmin} to {tmax} "
    "that the numbers reach with + - * /, each number used once. Write it on one line as `numbers -> target`, "
    "like `37 12 -> 444`."
)


def proposer_prompt(task: Countdown, first: int, template: str) -> tuple[str, str]:
    """(user text, the line's start) of a proposer prompt. The line starts with `first` (drawn per prompt from
    the task's number range): a tiny model pretrained on the compact template's `a b -> t` lines continues
    it into a problem with no instruction at all (the user text is then unused), and a chat model is told
    the format."""
    p = task.params
    text = PROPOSE_TEXT.format(
        lo_n=p.min_numbers,
        hi_n=p.max_numbers,
        lo=p.min_number,
        hi=p.max_number,
        tmin=p.min_target,
        tmax=p.max_target,
    )
    return ("" if template == "compact" else text), f"{first} "
