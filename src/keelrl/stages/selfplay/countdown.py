"""Countdown proposals: what the proposer writes, and the task's own check that it is a fair problem.

Two forms (`selfplay.proposal`):
- `problem`: the proposer writes a problem in the compact template's form, `37 12 -> 444` (numbers, then the
  target), optionally inside `<problem> </problem>`; the brute-force `solve` must find it solvable within the
  rules (each number exactly once, + - * /, exact rationals).
- `worked`: the proposer writes a worked line, the problem and then a solution, as the demo's corpus does
  (`37 12 -> 444` and on the next line `<answer>37*12</answer>`). The task's own expression checker evaluates
  the solution (it must use each listed number once) and the problem's target is that value; the written
  target is ignored. This is Absolute Zero's executor: the environment, not the proposer, computes the gold
  answer, so a valid problem is solvable by construction and a proposer that cannot multiply can still pose
  a product.

Either way `check_proposal` accepts a problem only when it is well-formed, inside the task's ranges (count of
numbers, each number, the target) and not a held-out problem (its number multiset must be in the train split,
so the fixed eval set stays unseen). The canonical key (sorted numbers and the target) is what the buffer
deduplicates on: `12 37 -> 444` and `37 12 -> 444` are one problem.
"""

from __future__ import annotations

import re
from typing import Any

from keelrl.stages.selfplay.base import Proposal
from keelrl.stages.selfplay.buffer import ProblemBuffer
from keelrl.tasks.base import in_test_split, last_answer
from keelrl.tasks.countdown import Countdown, InvalidExpression, check_expression, solve

PROPOSAL = re.compile(
    r"^\s*(?:<problem>\s*)?([0-9]{1,6}(?:[ ,]+[0-9]{1,6}){0,7})\s*->\s*([0-9]{1,7})\s*(?:</problem>)?\s*$"
)


def problem_key(problem: dict[str, Any]) -> str:
    """Canonical key: sorted numbers and the target, e.g. "12,37->444"."""
    return ",".join(map(str, sorted(problem["numbers"]))) + f"->{problem['target']}"


def parse_proposal(text: str) -> dict[str, Any] | None:
    """The problem in the proposer's first line, or None when it is not `N N ... -> T`."""
    m = PROPOSAL.match(text.strip().split("\n", 1)[0])
    if m is None:
        return None
    return {"numbers": [int(x) for x in re.split(r"[ ,]+", m.group(1))], "target": int(m.group(2))}


def check_proposal(task: Countdown, text: str, form: str = "problem") -> Proposal:
    """Parse and check one proposal of `form` ("problem" or "worked") against the task's rules (see the
    module docstring)."""
    problem = parse_proposal(text)
    if problem is None:
        return Proposal(None, "malformed")
    if form == "worked":
        answer = last_answer(text)
        if answer is None:
            return Proposal(None, "no_solution")
        try:
            value = check_expression(answer.strip(), problem["numbers"])
        except InvalidExpression:
            return Proposal(None, "invalid_solution")
        if value.denominator != 1:
            return Proposal(None, "target_out_of_range")
        problem["target"] = int(value)
    elif form != "problem":
        raise ValueError(f"unknown proposal form {form!r} (problem, worked)")
    p, numbers, target = task.params, problem["numbers"], problem["target"]
    if not p.min_numbers <= len(numbers) <= p.max_numbers:
        return Proposal(None, "count_out_of_range")
    if any(not p.min_number <= n <= p.max_number for n in numbers):
        return Proposal(None, "number_out_of_range")
    if not p.min_target <= target <= p.max_target:
        return Proposal(None, "target_out_of_range")
    if in_test_split(tuple(sorted(numbers)), task.seed, p.test_fraction):
        return Proposal(None, "held_out")
    if form == "problem" and solve(numbers, target) is None:  # a worked problem is solvable by construction
        return Proposal(None, "unsolvable")
    return Proposal(problem, "valid", problem_key(problem))


PROPOSE_TEXT = (
    "Write a new Countdown problem: {min_numbers} to {max_numbers} numbers from {min_number} to {max_number}, and "
    "a target from {min_target} to {max_target} "
    "that the numbers reach with + - * /, each number used once. Write it on one line as `numbers -> target`, "
    "like `37 12 -> 444`."
)
WORKED_TEXT = (
    " Then, on the next line, write the solution that reaches the target, like `<answer>37*12</answer>`."
)


def proposer_prompt(task: Countdown, first: int, template: str, form: str = "problem") -> tuple[str, str]:
    """(user text, the line's start) of a proposer prompt. The line starts with `first` (drawn per prompt from
    the task's number range): a tiny model pretrained on the compact template's `a b -> t` lines continues
    it into a problem with no instruction at all (the user text is then empty), and a chat model is told
    the format."""
    text = PROPOSE_TEXT.format(**task.params.model_dump()) + (WORKED_TEXT if form == "worked" else "")
    return ("" if template == "compact" else text), f"{first} "


class CountdownProposer:
    """Countdown's `Proposer` (stages/selfplay/base.py): a prompt's cue is the problem line's first number."""

    reasons = tuple(
        "malformed no_solution invalid_solution unsolvable held_out count_out_of_range number_out_of_range "
        "target_out_of_range".split()
    )

    def cue(self, task: Countdown, draw: int, buffer: ProblemBuffer) -> dict[str, Any]:
        p = task.params
        return {"first": p.min_number + draw % (p.max_number - p.min_number + 1)}

    def prompt(self, task: Countdown, cue: dict[str, Any], template: str, form: str) -> tuple[str, str]:
        return proposer_prompt(task, int(cue["first"]), template, form)

    check = staticmethod(check_proposal)
    key = staticmethod(problem_key)
