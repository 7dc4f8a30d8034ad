"""Countdown sets: k independent Countdown problems in one prompt, paid only when every one is solved.

A difficulty ladder whose rungs share one skill: a policy that solves one problem with probability q solves
a set of k with probability about q^k, so what it learns on short sets is exactly what long sets need, and
a long set gives a group no signal until that skill is there (q = 0.3, k = 4: 1%). This is the family the
curriculum benchmark uses to ask whether choosing the rung speeds learning (docs/curriculum.md).

Problem: `{"items": [{"numbers": [...], "target": int}, ...]}`; each item is a problem of the Countdown task
with the same parameters and seed (tasks/countdown.py), so every item of a test set comes from Countdown's
test split (split by number multiset) and train and test stay disjoint. Buckets `x{min_problems}` ..
`x{max_problems}` (problems per set); set i of bucket xk holds Countdown problems i*max_problems + j, j < k
(so sets of different sizes with the same index share their first problems).
Answer: the equations in the problems' order, separated by ';', in one `<answer>` block
(`<answer>37*12;20-5</answer>`). Reward: 1.0 when every equation reaches its target (Countdown's exact
checker, each number once); 0.1 for an answer block that is not (wrong count, invalid or wrong equation);
0.0 for no answer. `info["items_correct"]` counts the solved items.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import (
    Prompt,
    Score,
    Split,
    Template,
    check_bucket,
    instruct_prompt,
    last_answer,
)
from keelrl.tasks.countdown import Countdown, CountdownParams, score_countdown, solve

SEPARATOR = ";"
USER_TEXT = (
    "Solve each of these Countdown problems: combine its numbers with + - * / (each number exactly once) to "
    "reach its target.\n{problems}\nWrite only the equations, in this order, separated by '{sep}', in "
    "<answer> </answer> tags, like <answer> a + b{sep} c * d </answer>."
)


class CountdownSetParams(CountdownParams):
    ranges = (*CountdownParams.ranges, "problems")
    min_problems: int = Field(1, ge=1, le=8, description="Fewest problems in a set (the easiest bucket).")
    max_problems: int = Field(4, ge=1, le=8, description="Most problems in a set (the hardest bucket).")


class CountdownSet:
    """k Countdown problems per prompt, all-or-nothing reward (see the module docstring)."""

    name = "countdown_set"

    def __init__(self, seed: int = 0, **params: Any) -> None:
        self.seed, self.params = seed, CountdownSetParams(**params)
        item_params = self.params.model_dump(exclude={"min_problems", "max_problems"})
        self.items = Countdown(seed=seed, **item_params)

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        rng = random.Random(stable_hash("countdown_set", self.seed, split, index))
        return self._set(split, index, rng.randint(self.params.min_problems, self.params.max_problems))

    def buckets(self) -> list[str]:
        """Difficulty buckets, easiest first: x{min_problems} .. x{max_problems} (problems per set)."""
        return [f"x{k}" for k in range(self.params.min_problems, self.params.max_problems + 1)]

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        check_bucket(self, bucket)
        return self._set(split, index, int(bucket[1:]))

    def _set(self, split: Split, index: int, k: int) -> dict[str, Any]:
        first = index * self.params.max_problems
        return {"items": [self.items.problem(split, first + j) for j in range(k)]}

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        items = problem["items"]
        if template == "compact":  # one line per problem, as Countdown's compact template writes it
            return Prompt("", "\n".join(self.items.prompt(item, "compact").user for item in items), "")
        lines = "\n".join(
            f"{i + 1}. numbers {item['numbers']}, target {item['target']}" for i, item in enumerate(items)
        )
        return instruct_prompt(template, USER_TEXT.format(problems=lines, sep=SEPARATOR))

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        items = problem["items"]
        # an answer left open at the end of its line counts
        answer = last_answer(completion, line_answer=True)
        if answer is None:
            return Score(0.0, False, {"formatted": False, "reason": "no_answer", "items_correct": 0})
        parts = answer.split(SEPARATOR)
        if len(parts) != len(items):
            info = {"reason": "wrong_count", "answers": len(parts), "items_correct": 0}
            return Score(0.1, False, {"formatted": True, **info, "answer": answer[:120]})
        scores = [
            score_countdown(item["numbers"], item["target"], f"<answer>{part}</answer>")
            for item, part in zip(items, parts, strict=True)
        ]
        solved = sum(s.correct for s in scores)
        if solved == len(items):
            return Score(1.0, True, {"formatted": True, "reason": "correct", "items_correct": solved})
        first_wrong = next(s for s in scores if not s.correct)
        info = {"reason": first_wrong.info["reason"], "items_correct": solved, "answer": answer[:120]}
        return Score(0.1, False, {"formatted": True, **info})

    def difficulty(self, problem: dict[str, Any]) -> str:
        return f"x{len(problem['items'])}"

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        """Each item's brute-force solution joined by ';' (None if one is not found)."""
        answers = [solve(list(item["numbers"]), int(item["target"])) for item in problem["items"]]
        return None if None in answers else SEPARATOR.join(answers)  # type: ignore[arg-type]
