"""The Environment protocol: a task whose episodes take several turns (tools, feedback, repositories).

A `Task` asks one question and scores one answer; an `Environment` is a task that talks back. It has the
task's data methods (`name`, `problem(split, index)`, `difficulty(problem)`: deterministic, split-disjoint)
and, instead of `prompt` and `score`:

    reset(problem, seed) -> messages                      the episode's opening turns (system, user)
    step(state, assistant_turn) -> StepResult             the environment's reply to one assistant turn
                                                          (messages, reward, done, info), or that 4-tuple

Optional: `finish(state) -> Score` (the scorer at the end, e.g. hidden tests: called once per episode,
however it ended), `tools` (a list of `Tool`s, shown to the model through the chat template's `tools=`
or, in the plain format, in the system text) and `close(state)` (free what the episode held).

keelrl owns the episode: it renders `messages` to tokens, samples the model's turns, keeps the sampled
tokens exactly as sampled, calls `step` with the decoded text of each turn, appends the reply's tokens as
context, and enforces the budgets (rollout/multiturn.py). `EpisodeState` is what `step` sees: the problem,
the episode's seed, the turn number, the transcript so far, and `scratch`, a dict that belongs to the
environment (a working copy of a repository, a game board). Episodes of a batch run concurrently on
threads, so `step` must not share mutable state between episodes outside `scratch`.

The episode's reward is the sum of the step rewards (shaping) plus `finish`'s reward; `correct` is
`finish`'s (strict accuracy, never mixed with shaping), or, without `finish`, the last step's
`info["correct"]`. Info keys keelrl counts: `tool_calls`, `tool_errors` (per step).

A single-turn `Task` is the one-step case; keelrl keeps sampling it on its one-shot path, so every
existing task works unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from keelrl.tasks.base import Score, Split

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}
EpisodeEnd = Literal["done", "turns", "context", "length"]  # why an episode ended (rollout/multiturn.py)
EPISODE_ENDS: tuple[EpisodeEnd, ...] = ("done", "turns", "context", "length")


@dataclass
class StepResult:
    messages: list[Message]  # the environment's reply (tool results, a user turn); may be empty when done
    reward: float = 0.0  # shaping for this step (added to `finish`'s reward)
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeState:
    problem: dict[str, Any]
    seed: int
    messages: list[Message]  # the transcript so far, the opening messages first
    turn: int = 0  # assistant turns taken so far (1 during the first `step`)
    scratch: dict[str, Any] = field(default_factory=dict)  # the environment's own per-episode data
    rewards: list[float] = field(default_factory=list)  # each step's reward
    infos: list[dict[str, Any]] = field(default_factory=list)  # each step's info


@runtime_checkable
class Environment(Protocol):
    name: str

    def problem(self, split: Split, index: int) -> dict[str, Any]: ...

    def difficulty(self, problem: dict[str, Any]) -> str: ...

    def reset(self, problem: dict[str, Any], seed: int) -> list[Message]: ...

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult | tuple[Any, ...]: ...


def is_environment(task: object) -> bool:
    """Whether `task` is multi-turn (has `reset` and `step`), as opposed to a single-turn `Task`."""
    return callable(getattr(task, "reset", None)) and callable(getattr(task, "step", None))


def check_environment(obj: object, name: str) -> None:
    """Raise a TypeError naming what `obj` lacks to be a task or an environment (for imported classes)."""
    data = [m for m in ("problem", "difficulty") if not callable(getattr(obj, m, None))]
    if not isinstance(getattr(obj, "name", None), str):
        data.insert(0, "name (a str attribute)")
    # whichever protocol it started on (reset or step: an environment) is the one it is told about
    wants = (
        ("reset", "step")
        if any(callable(getattr(obj, m, None)) for m in ("reset", "step"))
        else ("prompt", "score")
    )
    missing = data + [m for m in wants if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(
            f"{name} is neither a task nor an environment: it lacks {', '.join(missing)}. A task has name, "
            "problem(split, index), difficulty(problem), prompt(problem, template) and score(problem, completion); "
            "an environment has name, problem, difficulty, reset(problem, seed) and step(state, assistant_turn) "
            "(keelrl.tasks.env)"
        )


def as_step_result(out: StepResult | Sequence[Any], env_name: str) -> StepResult:
    """`step`'s return value as a StepResult (a (messages, reward, done, info) tuple is accepted)."""
    if isinstance(out, StepResult):
        return out
    if isinstance(out, tuple) and len(out) == 4:
        messages, reward, done, info = out
        return StepResult(list(messages), float(reward), bool(done), dict(info or {}))
    raise TypeError(
        f"environment {env_name}: step() returned {type(out).__name__}; return a StepResult or a "
        "(messages, reward, done, info) tuple"
    )


def advance(env: Any, state: EpisodeState, assistant_turn: str) -> StepResult:
    """One step as keelrl takes it: the turn joins the transcript, the environment answers, and its reward and
    info are recorded. The reply's messages are not appended: the caller does, if the episode goes on."""
    state.turn += 1
    state.messages.append({"role": "assistant", "content": assistant_turn})
    out = as_step_result(env.step(state, assistant_turn), env.name)
    state.rewards.append(out.reward)
    state.infos.append(dict(out.info))
    return out


def play_text(
    env: Any, problem: dict[str, Any], turns: Sequence[str], seed: int = 0
) -> tuple[Score, EpisodeState, list[StepResult]]:
    """An episode driven by scripted assistant turns (text, no model, no tokens), as keelrl plays one, until
    the environment is done or the turns run out: its Score, final state and each step's result. For testing
    an environment (an oracle solves it, doing nothing does not, hacks score 0)."""
    state = EpisodeState(problem, seed, list(env.reset(problem, seed)))
    results: list[StepResult] = []
    try:
        for text in turns:
            results.append(out := advance(env, state, text))
            if out.done:
                break
            state.messages.extend(out.messages)
        return episode_score(env, state), state, results
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close(state)


def episode_score(env: object, state: EpisodeState) -> Score:
    """The episode's Score: step rewards plus `finish`'s (see the module docstring)."""
    shaping = sum(state.rewards)
    finish = getattr(env, "finish", None)
    if finish is not None:
        final = finish(state)
        return Score(shaping + final.reward, final.correct, dict(final.info), final.status)
    last = state.infos[-1] if state.infos else {}
    return Score(shaping, bool(last.get("correct", False)), {"formatted": bool(last.get("formatted", True))})
