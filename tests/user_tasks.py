"""Tasks that tests name by import path, as a user brings their own: `task.name = "user_tasks:SlowingMultiply"`
(tests/conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import time

from keelrl.tasks.base import Score, last_answer
from keelrl.tasks.multiply import Multiply


class SlowingMultiply(Multiply):
    """A verifier that becomes slow part-way through the run (as a stalled sandbox or an overloaded reward
    service does): from its 7th batch on, every completion costs 40 ms more."""

    calls = 0

    def score_many(self, problems, completions):
        SlowingMultiply.calls += 1
        if SlowingMultiply.calls > 6:
            time.sleep(0.04 * len(completions))
        return [self.score(p, c) for p, c in zip(problems, completions)]


class HackableMultiply(Multiply):
    """A deliberately hackable reward: it pays 1.0 for any odd answer, while the strict checker (`correct`)
    accepts only even ones. The format-trained model greedily answers "44" (strictly correct); RL on the
    proxy teaches it odd answers: reward up, held-out accuracy down."""

    def score(self, problem, completion):
        answer = (last_answer(completion) or "").strip()
        if not answer.isdigit():
            return Score(0.0, False, {"formatted": False})
        odd = int(answer) % 2 == 1
        return Score(1.0 if odd else 0.1, not odd, {"formatted": True, "answer": answer})


def make_multiply(seed: int = 0, **params) -> Multiply:
    """A task factory function (the "package.module:function" form)."""
    return Multiply(seed=seed, **params)


NOT_A_TASK = 42


class HalfAnEnvironment:
    """Has the data methods and `reset`, but neither `step` (an environment) nor `prompt`/`score` (a task)."""

    name = "half"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def problem(self, split, index):
        return {"i": index}

    def difficulty(self, problem):
        return "all"

    def reset(self, problem, seed):
        return [{"role": "user", "content": "hi"}]


class NeedsLevel(Multiply):
    """A constructor that fails as a user's typo does: a required argument task.params does not give."""

    def __init__(self, seed: int = 0, *, level: int, **params) -> None:
        super().__init__(seed=seed, **params)


class NoTestSplit(Multiply):
    """A task whose test split is empty (as a `dir:` set of two tasks can be): drawing from it raises."""

    def problem(self, split, index):
        if split == "test":
            raise ValueError("the test split is empty (2 tasks, test_fraction 0.2)")
        return super().problem(split, index)
