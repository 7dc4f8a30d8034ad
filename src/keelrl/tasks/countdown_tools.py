"""countdown_tools: Countdown (TinyZero) where the model may call an exact-arithmetic `calc` tool before it
answers. Multi-turn (tasks/env.py).

Problems, splits and difficulty buckets are Countdown's (`task.params` are Countdown's parameters). An
episode: the model's turns may call `calc` (`<tool_call>calc: (3+4)*2</tool_call>`, or the JSON form in a
chat template's format); each result comes back as a tool message. The first turn without a tool call is
the answer, and ends the episode. The answer is scored by Countdown's checker (`score_countdown`: 1.0
correct, 0.1 well-formed but wrong, 0.0 no answer); an episode cut by a budget is scored on its last turn.
`calc` evaluates exactly (rationals) with Countdown's grammar but any numbers: it helps with arithmetic,
not with the choice of numbers, which the checker still enforces.
"""

from __future__ import annotations

from typing import Any

from keelrl.tasks.base import SYSTEM_CHAT, SameProblems, Score
from keelrl.tasks.countdown import Countdown, InvalidExpression, evaluate_expression, score_countdown
from keelrl.tasks.env import EpisodeState, Message, StepResult
from keelrl.tasks.tools import Tool, run_tool_calls, tool

USER_TEXT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use + - * / and each "
    "number exactly once. You may check arithmetic with the calc tool. When you are sure, reply without a "
    "tool call and give the equation in <answer> </answer> tags, like <answer> (1 + 2) * 3 </answer>."
)


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers, + - * /, parentheses)."""
    try:
        value = evaluate_expression(expression)
    except InvalidExpression as err:
        raise ValueError(str(err)) from None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


class CountdownTools(SameProblems):
    """Countdown with a calculator tool; see the module docstring. `brief=True` (a parameter of its own, the
    others are Countdown's): the opening is only "3 5 7 -> 22", no instructions (tiny character models)."""

    name = "countdown_tools"

    def __init__(self, seed: int = 0, brief: bool = False, **params: Any) -> None:
        self.seed, self.brief = seed, brief
        self.task = Countdown(seed=seed, **params)
        self.tools: list[Tool] = [tool(calc)]

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        return self.task.reference_answer(problem)

    def reset(self, problem: dict[str, Any], seed: int) -> list[Message]:
        if self.brief:  # Countdown's compact prompt
            return [{"role": "user", "content": self.task.prompt(problem, "compact").user}]
        user = USER_TEXT.format(numbers=list(problem["numbers"]), target=problem["target"])
        return [{"role": "system", "content": SYSTEM_CHAT}, {"role": "user", "content": user}]

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        return run_tool_calls(assistant_turn, self.tools).step_result()

    def finish(self, state: EpisodeState) -> Score:
        last = next((m["content"] for m in reversed(state.messages) if m["role"] == "assistant"), "")
        return score_countdown(state.problem["numbers"], state.problem["target"], last)
