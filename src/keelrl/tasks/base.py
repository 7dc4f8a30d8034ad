"""The Task protocol: where problems come from, how they are asked, and how answers are checked. A task is
deterministic: `problem(split, index)` is a pure function of the task's seed, the split and the index, so a
data cursor is one integer, ranks shard by index, and a resumed run sees the same problems. Problems are
JSON-serialisable dicts. `score` never raises on model output: anything the model writes yields a `Score`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, model_validator

from keelrl.core.seeds import stable_hash

Split = Literal["train", "test"]
Template = Literal["base", "chat", "compact", "qwen_instruct"]
# How an episode ended (DESIGN.md): only "ok" carries a reward into the advantages. verifier_error: the checker
# could not judge (it raised, crashed, timed out, or wrote no usable reward); agent_error: the episode broke on the
# agent's side for a reason not the model's (an environment's step raised, its container did not start);
# timeout: the episode ran out of wall time. A verifier that cannot run is never a reward of 0 or 1.
Status = Literal["ok", "verifier_error", "agent_error", "timeout"]
STATUSES: tuple[Status, ...] = ("ok", "verifier_error", "agent_error", "timeout")


@dataclass(frozen=True)
class Score:
    """reward: what the policy is trained on (may include format credit).
    correct: strict accuracy, never mixed with shaping.
    info: details; `formatted` (bool) says whether the answer was well-formed, `reason` names the outcome.
    status: "ok", or why there is no reward (`Status`): then reward and correct mean nothing and the sample is
    left out of the advantages; info["error"] says what went wrong."""

    reward: float
    correct: bool
    info: dict[str, Any] = field(default_factory=dict)
    status: Status = "ok"


@dataclass(frozen=True)
class Prompt:
    """A task's question, before rendering. system: instructions (a chat system turn, a base model's
    preamble; may be empty). user: the question. assistant_prefix: the assistant turn's first words, part
    of the prompt tokens; the scorer sees it in front of the completion. history: earlier chat turns
    ({"role", "content"}) between the system turn and `user` (a data set's multi-turn chat prompt)."""

    system: str
    user: str
    assistant_prefix: str
    history: tuple[dict[str, str], ...] = ()


@runtime_checkable
class Task(Protocol):
    """Optional methods, looked up with getattr (a task without them still works): `score_many(problems,
    completions)` (batched scoring, see `score_batch`), `reference_answer(problem) -> str | None` (a
    known-correct answer as the model should state it, used by `keelrl eval --perplexity reference` when a
    problem has no "reference" field), `size(split) -> int` (a split's number of distinct problems, when finite:
    evals take at most that many), and the `BucketedTask` methods below."""

    name: str

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        """The `index`-th problem of `split`; deterministic; train and test never share a problem."""
        ...

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt: ...

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        """`completion` is the assistant's text including `Prompt.assistant_prefix`."""
        ...

    def difficulty(self, problem: dict[str, Any]) -> str:
        """A short bucket name (e.g. 'n3'), used for curricula and eval breakdowns."""
        ...


@runtime_checkable
class BucketedTask(Protocol):
    """Optional addition to `Task`: problems from a named difficulty bucket (what a curriculum steers).
    `difficulty(problem_in(b, split, i)) == b`; `problem_in` is pure and split-disjoint like `problem`."""

    def buckets(self) -> list[str]:
        """Bucket names, easiest first."""
        ...

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]: ...


class SameProblems:
    """The data methods of another task, `self.task` (problem, difficulty, buckets, problem_in): for a task or
    environment that asks that task's problems its own way (countdown_tools, code_feedback)."""

    task: Any

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return self.task.problem(split, index)

    def difficulty(self, problem: dict[str, Any]) -> str:
        return self.task.difficulty(problem)

    def buckets(self) -> list[str]:
        return self.task.buckets()

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        return self.task.problem_in(bucket, split, index)


def task_buckets(task: Task) -> list[str] | None:
    """The task's difficulty ladder (easiest first), or None when it cannot draw problems by bucket."""
    return list(task.buckets()) if isinstance(task, BucketedTask) else None


def check_bucket(task: Any, bucket: str) -> None:
    """`problem_in`'s first check: `bucket` is one of `task.buckets()`, else a ValueError naming them."""
    buckets = task.buckets()
    if bucket not in buckets:
        raise ValueError(
            f"task {task.name}: no difficulty bucket {bucket!r}; its buckets are {', '.join(buckets)}"
        )


def score_batch(task: Task, problems: list[dict[str, Any]], completions: list[str]) -> list[Score]:
    """Score many completions: the task's `score_many` if any (code: parallel sandboxes), else `score`."""
    many = getattr(task, "score_many", None)
    if many is not None:
        return list(many(problems, completions))
    return [task.score(p, c) for p, c in zip(problems, completions)]


ScoreFn = Callable[[dict[str, Any], str], Score]


def score_safely(
    task: Task, problems: list[dict[str, Any]], completions: list[str], score: ScoreFn | None = None
) -> tuple[list[Score], list[str]]:
    """Score many completions without raising (the trainer's and the Ray scorers' one path): `score_batch`,
    and if that raises (checkers are user code), each alone; one that raises is a `verifier_error` (reason
    `score_error`: no reward, left out of training).
    `score` (fault drills) replaces `task.score`, skipping the batch. Returns scores and errors in order."""
    if score is None:
        try:
            return score_batch(task, problems, completions), []
        except Exception:
            score = task.score
    scores: list[Score] = []
    errors: list[str] = []
    for problem, completion in zip(problems, completions):
        try:
            scores.append(score(problem, completion))
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}"[:300])
            scores.append(unscored("verifier_error", "score_error", errors[-1]))
    return scores, errors


def unscored(status: Status, reason: str, error: str, extra: dict[str, Any] | None = None) -> Score:
    """The Score of a sample that has no reward (`status` is not "ok"); `error` says why, in a sentence. `extra`
    updates the info (a "formatted" in it replaces the False)."""
    return Score(0.0, False, {"formatted": False, "reason": reason, "error": error, **(extra or {})}, status)


class TaskParams(BaseModel):
    """Base of each task's parameter model: unknown parameters are errors. `ranges` names the pairs of fields
    `min_<name>` / `max_<name>` that must be in order (a ValueError "min_<name>=5 > max_<name>=3" otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ranges: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _ranges_in_order(self) -> TaskParams:
        for key in self.ranges:
            lo, hi = getattr(self, f"min_{key}"), getattr(self, f"max_{key}")
            if lo > hi:
                raise ValueError(f"min_{key}={lo} > max_{key}={hi}")
        return self


def in_test_split(key: Any, seed: int, test_fraction: float) -> bool:
    """Assign a problem key (e.g. the sorted number multiset) to the test split with probability
    `test_fraction`, by hash, so splits are disjoint by construction and independent of generation order."""
    return (stable_hash("split", seed, key) % 1_000_000) < test_fraction * 1_000_000


T = TypeVar("T")


def shuffled_pick(items: Sequence[T], index: int, *key: Any) -> T:
    """The `index`-th of `items` in a seeded order: each pass over them (epoch) a new permutation, seeded by `key`
    and the epoch, so a finite set of problems is walked in a fresh order every time round."""
    epoch, pos = divmod(index, len(items))
    order = list(range(len(items)))
    random.Random(stable_hash(*key, epoch)).shuffle(order)
    return items[order[pos]]


# TinyZero's instructions ("base" preamble, "chat" system turn) and its assistant turn's first words.
SYSTEM_BASE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer."
)
SYSTEM_CHAT = (
    "You are a helpful assistant. You first think about the reasoning process in the mind and then provide "
    "the user with the answer."
)
# TinyZero's qwen-instruct system turn, word for word ("thinks", "provides" and all)
SYSTEM_QWEN_INSTRUCT = (
    "You are a helpful assistant. You first thinks about the reasoning process in the mind and then provides "
    "the user with the answer."
)
THINK_PREFIX = "Let me solve this step by step.\n<think>"
ANSWER_PREFIX = "<answer>"  # the assistant turn's first words in answer-only templates


def instruct_prompt(template: Template, user: str, think: bool = False) -> Prompt:
    """A base or chat template's prompt: the chat system turn for "chat", else the base preamble; the assistant
    turn opens at THINK_PREFIX with `think` (reasoning in <think> tags first), else at ANSWER_PREFIX."""
    system = SYSTEM_CHAT if template == "chat" else SYSTEM_BASE
    return Prompt(system, user, THINK_PREFIX if think else ANSWER_PREFIX)


def last_answer(text: str, line_answer: bool = False) -> str | None:
    """The last complete <answer>...</answer> block's content (what re.findall(r"<answer>(.*?)</answer>",
    re.DOTALL) finds last), or None. The whole text is searched in linear time: str.find reads each character
    at most once (that regex rescans to the end from every unclosed <answer>: quadratic).
    `line_answer`: without a complete block, an answer opened by the prompt's '<answer>' prefix (the text starts
    with it) may end at the end of its line (stripped; None when that is empty)."""
    found, pos = None, 0
    while (start := text.find("<answer>", pos)) >= 0:
        end = text.find("</answer>", start + 8)
        if end < 0:
            break
        found, pos = text[start + 8 : end], end + 9
    if found is None and line_answer and text.startswith(ANSWER_PREFIX):
        found = text[len(ANSWER_PREFIX) :].split("\n", 1)[0].strip() or None
    return found


# a decimal digit outside ASCII 0-9 (Arabic-Indic, full-width, ...): Python's \d, int() and float() read them as
# numbers; in an answer only ASCII digits are numbers
NON_ASCII_DIGIT = re.compile(r"(?![0-9])\d")
