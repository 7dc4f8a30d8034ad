"""Task mixtures: several tasks in one run.

`get_task("mixture", tasks=[{"task": "countdown", "params": {...}, "weight": 2}, {"task": "multiply"}])`
builds one task from its members. Each problem carries its member's label (its `name`, default its task
name) under `"task"`, so prompts, scores and metrics dispatch on plain JSON; the member never sees that key.
- `problem(split, i)` picks a member by weight with a hash of (seed, split, i) and returns its problem `i`:
  as deterministic as the members, and train/test stay disjoint.
- Buckets are `"<label>/<member bucket>"` (`"<label>/all"` for a member without buckets), so an adaptive
  curriculum steers members and their difficulty together (`curriculum.mixture`: fixed or adaptive weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from pydantic import Field, model_validator

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import (
    Prompt,
    Score,
    Split,
    Task,
    TaskParams,
    Template,
    check_bucket,
    score_batch,
    task_buckets,
)

ALL = "all"


class MixtureMember(TaskParams):
    task: str = Field(description="Task of this member: a name (countdown, ...) or 'package.module:Class'.")
    params: dict[str, Any] = Field(default_factory=dict, description="The member task's parameters.")
    weight: float = Field(1.0, gt=0.0, description="Share of problems drawn from this member (relative).")
    name: str = Field(
        "", description="Label in problems and metrics (task/<name>/...); default: the task name."
    )
    seed: int | None = Field(None, description="Seed of the member's generator; default: the mixture's seed.")

    @property
    def label(self) -> str:
        return self.name or self.task


class MixtureParams(TaskParams):
    tasks: list[MixtureMember] = Field(min_length=1, description="The member tasks and their weights.")

    @model_validator(mode="after")
    def _distinct(self) -> MixtureParams:
        labels = [m.label for m in self.tasks]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(
                f"member labels must differ; {', '.join(dupes)} repeat (give each member a `name`)"
            )
        bad = [m.label for m in self.tasks if "/" in m.label]
        if bad:
            raise ValueError(f"member labels may not contain '/': {', '.join(bad)}")
        if any(m.task == "mixture" for m in self.tasks):
            raise ValueError("a mixture cannot contain a mixture")
        return self


class TaskMixture:
    """Several tasks behind the Task protocol (and BucketedTask)."""

    name = "mixture"

    def __init__(self, seed: int = 0, sandbox: Any = None, **params: Any) -> None:
        from keelrl.tasks import TaskError, get_task  # the registry imports this module

        self.seed, self.params = seed, MixtureParams(**params)
        self.members: dict[str, Task] = {
            m.label: get_task(m.task, seed=seed if m.seed is None else m.seed, sandbox=sandbox, **m.params)
            for m in self.params.tasks
        }
        for label, task in self.members.items():
            if not (callable(getattr(task, "prompt", None)) and callable(getattr(task, "score", None))):
                raise TaskError(
                    f"mixture member {label!r} is a multi-turn environment (no prompt and score); a mixture "
                    "holds single-turn tasks: train the environment on its own"
                )
        total = sum(m.weight for m in self.params.tasks)
        self._weights = {m.label: m.weight / total for m in self.params.tasks}

    def weights(self) -> dict[str, float]:
        """Member label -> configured share (sums to 1)."""
        return dict(self._weights)

    def label_of(self, bucket: str) -> str:
        return bucket.split("/", 1)[0]

    def member(self, problem: dict[str, Any]) -> tuple[str, Task, dict[str, Any]]:
        """(label, member task, the problem as the member knows it) for a mixture problem."""
        label = problem.get("task")
        if label not in self.members:
            raise ValueError(f"mixture problem has task {label!r}; members are {', '.join(self.members)}")
        return label, self.members[label], {k: v for k, v in problem.items() if k != "task"}

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        u = stable_hash("mixture", self.seed, split, index) / 2**64
        labels = list(self._weights)
        label = next((t for t, c in zip(labels, accumulate(self._weights.values())) if u < c), labels[-1])
        return {**self.members[label].problem(split, index), "task": label}

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        _, task, inner = self.member(problem)
        return task.prompt(inner, template)

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        _, task, inner = self.member(problem)
        return task.score(inner, completion)

    def score_many(self, problems: Sequence[dict[str, Any]], completions: Sequence[str]) -> list[Score]:
        """Score a batch member by member (each member's own batched scorer, e.g. the code sandboxes)."""
        out: dict[int, Score] = {}  # problem index -> its score
        by_member: dict[str, list[int]] = {}
        for i, problem in enumerate(problems):
            by_member.setdefault(self.member(problem)[0], []).append(i)
        for label, idx in by_member.items():
            inner = [self.member(problems[i])[2] for i in idx]
            out.update(zip(idx, score_batch(self.members[label], inner, [completions[i] for i in idx])))
        return [out[i] for i in sorted(out)]

    def difficulty(self, problem: dict[str, Any]) -> str:
        label, task, inner = self.member(problem)
        return f"{label}/{task.difficulty(inner) if task_buckets(task) is not None else ALL}"

    def buckets(self) -> list[str]:
        """Every member's ladder, as "<label>/<bucket>", members in config order."""
        return [f"{label}/{b}" for label, task in self.members.items() for b in (task_buckets(task) or [ALL])]

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        check_bucket(self, bucket)
        label, inner = bucket.split("/", 1)
        task = self.members[label]
        problem = task.problem(split, index) if inner == ALL else task.problem_in(inner, split, index)  # type: ignore[attr-defined]
        return {**problem, "task": label}
