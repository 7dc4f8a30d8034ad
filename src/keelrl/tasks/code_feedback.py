"""code_feedback: a programming problem (the code task's) where the model submits, sees the public tests'
results from the sandbox, and may try again; the reward comes from hidden tests. Multi-turn (tasks/env.py).

Problems and splits are the code task's (`task.params`: the code task's parameters, plus `attempts` and
`public_tests`). A problem's first `public_tests` cases are public: each submission (the last fenced
Python block of a turn, as the code task reads it) runs against them in the sandbox and the verdict comes
back as a user turn ("2/3 public tests passed; case 1 `f(0)`: expected 1, got 0"). The episode ends when a
submission passes every public test, when `attempts` submissions were made, or at a turn without code.
The reward is the code task's rule applied to the HIDDEN cases (the others; all cases when a problem has
no more than `public_tests`) on the last submission: 1.0 all pass, 0.1 a block that fails, 0.0 no block.
The hidden cases' expected values never enter the sandbox or the conversation (keelrl.sandbox: the judge).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import Field

from keelrl.tasks.base import SameProblems, Score, TaskParams
from keelrl.tasks.code import SYSTEM_CODE_CHAT, CodeTask, extract_code
from keelrl.tasks.env import EpisodeState, Message, StepResult

USER_SUFFIX = (
    "\n\nGive the complete function in one ```python code block. Each submission is run against the public "
    "tests and you will see the results; you may then submit a corrected version."
)


class FeedbackParams(TaskParams):
    attempts: int = Field(3, ge=1, le=20, description="Most submissions per episode.")
    public_tests: int = Field(
        2, ge=1, description="A problem's first cases shown to the model as public tests."
    )


class CodeFeedback(SameProblems):
    """The code task with public-test feedback and retries; see the module docstring."""

    name = "code_feedback"

    def __init__(self, seed: int = 0, sandbox: Any = None, **params: Any) -> None:
        own = {k: params.pop(k) for k in list(params) if k in FeedbackParams.model_fields}
        self.seed, self.params = seed, FeedbackParams(**own)
        self.task = CodeTask(seed=seed, sandbox=sandbox, **params)

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        return problem.get("reference")

    def split_tests(self, problem: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        """(public, hidden) cases."""
        tests, k = list(problem["tests"]), self.params.public_tests
        return tests[:k], (tests[k:] or tests)

    def reset(self, problem: dict[str, Any], seed: int) -> list[Message]:
        return [
            {"role": "system", "content": SYSTEM_CODE_CHAT},
            {"role": "user", "content": problem["prompt"] + USER_SUFFIX},
        ]

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        if extract_code(assistant_turn) is None:
            return StepResult([], done=True, info={"submitted": False})
        state.scratch["submission"] = assistant_turn
        state.scratch["attempts"] = attempts = state.scratch.get("attempts", 0) + 1
        public, _ = self.split_tests(state.problem)
        s = self.task.score({**state.problem, "tests": public}, assistant_turn)
        passed, total = s.info.get("passed", 0), s.info.get("total", len(public))
        verdict = f"{passed}/{total} public tests passed"
        if not s.correct:
            verdict += f"; {s.info.get('detail') or s.info.get('reason', '')}"
        done = s.correct or attempts >= self.params.attempts
        info = {"submitted": True, "public_passed": passed, "public_total": total}
        return StepResult([{"role": "user", "content": verdict}], done=done, info=info)

    def finish(self, state: EpisodeState) -> Score:
        _, hidden = self.split_tests(state.problem)
        submission = state.scratch.get("submission", "")
        score = self.task.score({**state.problem, "tests": hidden}, submission)
        return replace(score, info={**score.info, "attempts": state.scratch.get("attempts", 0)})
