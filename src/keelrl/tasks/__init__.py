"""Tasks and environments: problems, prompts or turns, and verifiable rewards. `get_task(name, **params)` is
the one entry point. `TASKS` maps a name to a factory called with `(seed=..., **params)`; single-turn tasks
follow tasks/base.py's `Task`, multi-turn environments tasks/env.py's `Environment`. Names with a prefix:
- "package.module:Class" (or ":function"): a user's own task or environment, imported (no entry needed);
- "dir:PATH": a Harbor task directory (Terminal-Bench 2's format), or a folder of them (tasks/harbor.py);
- "swebench:FILE.jsonl": SWE-bench-style instances (tasks/swebench.py);
- "reasoning_gym:DATASET": a reasoning-gym data set (tasks/reasoning_gym.py; the `envs` extra).
"dataset" (tasks/dataset.py) is a data set's rows scored by the user's reward functions.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from keelrl.tasks.base import Prompt, Score, Split, Task, Template
from keelrl.tasks.countdown import Countdown
from keelrl.tasks.env import check_environment
from keelrl.tasks.multiply import Multiply

__all__ = ["TASKS", "Prompt", "Score", "Split", "Task", "TaskError", "Template", "get_task"]


KEELRL = Path(__file__).parents[1]


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
    "countdown_set": lambda **kw: _load("keelrl.tasks.countdown_set:CountdownSet")(**kw),
    "cipher": lambda **kw: _load("keelrl.tasks.cipher:Cipher")(**kw),
    "countdown_search": lambda **kw: _load("keelrl.tasks.countdown_search:CountdownSearch")(**kw),
    "countdown_tools": lambda **kw: _load("keelrl.tasks.countdown_tools:CountdownTools")(**kw),
    "code_feedback": lambda **kw: _load("keelrl.tasks.code_feedback:CodeFeedback")(**kw),
    "swe_mini": lambda **kw: _load("keelrl.tasks.swe_mini:SweMini")(**kw),
    "dataset": lambda **kw: _load("keelrl.tasks.dataset:DatasetTask")(**kw),  # rows + reward functions
}

# "prefix:rest" names -> factory(rest, seed=..., **params)
PREFIXES: dict[str, Callable[..., Task]] = {
    "dir": lambda path, **kw: _load("keelrl.tasks.harbor:harbor_tasks")(path=path, **kw),
    "swebench": lambda path, **kw: _load("keelrl.tasks.swebench:swebench_tasks")(path=path, **kw),
    "reasoning_gym": lambda dataset, **kw: _load("keelrl.tasks.reasoning_gym:ReasoningGymTask")(
        dataset=dataset, **kw
    ),
}

# the tasks above whose factory takes the [sandbox] section (`sandbox=`): a name, or a prefix of "prefix:rest"
SANDBOXED = frozenset({"dir", "swebench", "code", "code_feedback", "swe_mini", "mixture"})


def get_task(name: str, seed: int = 0, sandbox: Any = None, **params: Any) -> Task:
    """Build a task by name (`TASKS`) or import path ("package.module:Class"). `params` are checked against
    the task's parameter model; a wrong name, path or parameter raises TaskError saying what is allowed.
    `sandbox`: the [sandbox] section (a SandboxConfig, its dict, or None for its defaults), given to the tasks
    that run model-written code or commands (sandbox/config.py's SANDBOXED)."""
    prefix, _, rest = name.partition(":")
    if (prefix if prefix in PREFIXES else name) in SANDBOXED:
        from keelrl.sandbox.config import moved_to_sandbox, sandbox_of

        if (moved := moved_to_sandbox(params)) is not None:
            raise TaskError(moved)
        params = {**params, "sandbox": sandbox_of(sandbox)}
    if prefix in PREFIXES:
        factory: Callable[..., Task] | None = functools.partial(PREFIXES[prefix], rest)
    else:
        factory = TASKS.get(name) or (_load(name) if ":" in name else None)
    if factory is None:
        hint = difflib.get_close_matches(name, TASKS, n=1)
        raise TaskError(
            f"unknown task {name!r}{f' (did you mean {hint[0]!r}?)' if hint else ''}; available tasks: "
            f"{', '.join(TASKS)}, 'dir:PATH', 'swebench:FILE.jsonl', 'reasoning_gym:DATASET', or your own as 'package.module:Class'. "
            "Set task.name in the config or "
            "--task on the command line."
        )
    try:
        task = factory(seed=seed, **params)
    except ValidationError as err:
        problems = "; ".join(
            f"`{'.'.join(map(str, e['loc'])) or name}`: {e['msg'].removeprefix('Value error, ')}"
            + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" else " (unknown parameter)")
            for e in err.errors()
        )
        raise TaskError(f"bad parameters for task {name!r}: {problems}") from None
    except TaskError:
        raise
    except Exception as err:  # building it again (a restart) would fail the same way: a user error
        where = traceback.extract_tb(err.__traceback__)[-1]  # the user's code, not keelrl's: say where
        at = "" if Path(where.filename).is_relative_to(KEELRL) else f" (at {where.filename}:{where.lineno})"
        raise TaskError(
            f"task {name!r} could not be built with task.params {params}: {type(err).__name__}: {err}{at}. "
            "Fix task.name or task.params (or the task's constructor)."
        ) from None
    if name not in TASKS and prefix not in PREFIXES:
        try:
            check_environment(task, name)
        except TypeError as err:
            raise TaskError(str(err)) from None
    return task
