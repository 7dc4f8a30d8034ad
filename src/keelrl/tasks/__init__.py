"""Tasks: problems, prompts and verifiable rewards. `get_task(name, **params)` is the one entry point.
`TASKS` maps a name to a factory called with `(seed=..., **params)`. A user's own task needs no entry:
`get_task("mypkg.mytask:MyTask")` imports `mypkg.mytask` and calls its `MyTask` (a class or function).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from keelrl.tasks.base import Prompt, Score, Split, Task, Template
from keelrl.tasks.countdown import Countdown
from keelrl.tasks.multiply import Multiply

__all__ = ["TASKS", "Prompt", "Score", "Split", "Task", "TaskError", "Template", "get_task"]


class TaskError(ValueError):
    """A task name or task parameter the user gave is wrong."""


def _load(path: str) -> Callable[..., Task]:
    module, _, attr = path.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
        if not callable(factory):
            raise TypeError(f"{module}.{attr} is a {type(factory).__name__}, not a class or function")
    except (ImportError, AttributeError, TypeError, ValueError) as err:
        raise TaskError(
            f"cannot load task {path!r} ({type(err).__name__}: {err}). A task is a name ({', '.join(TASKS)}) or "
            "'package.module:Class' (or ':function'), called with seed=... and the task parameters, from a "
            "module that is importable (installed, or on PYTHONPATH) and defines that name."
        ) from None
    return factory


TASKS: dict[str, Callable[..., Task]] = {
    "countdown": Countdown,
    "multiply": Multiply,
    "code": lambda **kw: _load("keelrl.tasks.code:CodeTask")(**kw),  # imports the sandbox only when used
    "mixture": lambda **kw: _load("keelrl.tasks.mixture:TaskMixture")(**kw),
}


def get_task(name: str, seed: int = 0, **params: Any) -> Task:
    """Build a task by name (`TASKS`) or import path ("package.module:Class"). `params` are checked against
    the task's parameter model; a wrong name, path or parameter raises TaskError saying what is allowed."""
    factory = TASKS.get(name) or (_load(name) if ":" in name else None)
    if factory is None:
        hint = difflib.get_close_matches(name, TASKS, n=1)
        raise TaskError(
            f"unknown task {name!r}{f' (did you mean {hint[0]!r}?)' if hint else ''}; available tasks: "
            f"{', '.join(TASKS)}, or your own as 'package.module:Class'. Set task.name in the config or "
            "--task on the command line."
        )
    try:
        return factory(seed=seed, **params)
    except ValidationError as err:
        problems = "; ".join(
            f"`{'.'.join(map(str, e['loc'])) or name}`: {e['msg'].removeprefix('Value error, ')}"
            + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" else " (unknown parameter)")
            for e in err.errors()
        )
        raise TaskError(f"bad parameters for task {name!r}: {problems}") from None
