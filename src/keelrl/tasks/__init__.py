"""Tasks: problems, prompts and verifiable rewards. `get_task(name, **params)` is the one entry point."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from keelrl.tasks.base import Prompt, Score, Split, Task, Template
from keelrl.tasks.countdown import Countdown
from keelrl.tasks.multiply import Multiply

__all__ = ["TASK_NAMES", "Prompt", "Score", "Split", "Task", "TaskError", "Template", "get_task"]

TASK_NAMES = ("countdown", "multiply", "code", "mixture")


class TaskError(ValueError):
    """A task name or task parameter the user gave is wrong."""


def get_task(name: str, seed: int = 0, **params: Any) -> Task:
    """Build a task by name. `params` are checked against the task's parameter model; a wrong name or
    parameter raises TaskError saying what is allowed."""
    try:
        if name == "countdown":
            return Countdown(seed=seed, **params)
        if name == "multiply":
            return Multiply(seed=seed, **params)
        if name == "code":
            from keelrl.tasks.code import CodeTask  # imports the sandbox only when used

            return CodeTask(seed=seed, **params)
        if name == "mixture":
            from keelrl.tasks.mixture import TaskMixture

            return TaskMixture(seed=seed, **params)
    except ValidationError as err:
        problems = "; ".join(
            f"`{'.'.join(map(str, e['loc'])) or name}`: {e['msg'].removeprefix('Value error, ')}"
            + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" else " (unknown parameter)")
            for e in err.errors()
        )
        raise TaskError(f"bad parameters for task {name!r}: {problems}") from None
    hint = difflib.get_close_matches(name, TASK_NAMES, n=1)
    raise TaskError(
        f"unknown task {name!r}{f' (did you mean {hint[0]!r}?)' if hint else ''}; available tasks: "
        f"{', '.join(TASK_NAMES)}. Set task.name in the config or --task on the command line."
    )
