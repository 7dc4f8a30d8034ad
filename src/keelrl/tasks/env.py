"""The Environment protocol: a task whose episodes take several turns (tools, feedback, repositories, games).

A `Task` asks one question and scores one answer; an `Environment` is a task that talks back. It has the
task's data methods (`name`, `problem(split, index)`, `difficulty(problem)`: deterministic, split-disjoint)
and, instead of `prompt` and `score`:

    reset(problem, seed) -> messages                      the episode's opening turns (system, user), or a
                                                          ResetResult(messages, scratch) / (messages, scratch)
    step(state, action) -> StepResult                     the environment's reply to one assistant turn
                                                          (messages, reward, done, info), or that 4-tuple

Optional: `finish(state) -> Score` (the scorer at the end, e.g. hidden tests: called once per episode,
however it ended), `tools` (a list of `Tool`s, shown to the model through the chat template's `tools=`
or, in the plain format, in the system text), `close(state)` (free what the episode held), `action` (how a
turn becomes the action `step` receives) and `global_random` (below). Any of `reset`, `step`, `finish` and
`close` may be `async def`: keelrl runs the coroutine on its one event loop (a background thread, so async
clients and sessions opened in `reset` stay usable in later steps) and waits for it on the episode's thread.

keelrl owns the episode: it renders `messages` to tokens, samples the model's turns, keeps the sampled
tokens exactly as sampled, calls `step` with each turn, appends the reply's tokens as context, and enforces
the budgets (rollout/multiturn.py). `EpisodeState` is what `step` sees: the problem, the episode's seed,
the turn number, the transcript so far, `scratch` (the environment's own per-episode data: what `reset`
returned as scratch, e.g. a game object or a working copy, else an empty dict), `rng` (a `random.Random`
of the episode's own, seeded from its seed) and `policy` (a second seat, below). Episodes of a batch run
concurrently on threads: keep everything an episode changes in `scratch`, never on `self`, and draw from
`state.rng`, never from the module-level `random`. A library that draws from the module-level `random`
itself (TextArena's games do) sets `global_random = True`: each of its calls then runs with the
module-level generator holding that episode's own stream (swapped in and out under a lock, so such calls
run one at a time), and its episodes are as reproducible as any other.

Typed actions (`action`): absent, `step` gets the turn's text. A pydantic model class: the turn's JSON
object parsed into it (`json_action`). Any callable `text -> action` (`tools.call_action(tools)`: exactly
one parsed `ToolCall`). When parsing raises a ValueError, `step` is not called: the model gets
"error: <message>" as a user turn and the episode goes on (the turn counts; `info["action_errors"]`).

Second seat (two-player games): during an episode run by keelrl, `state.policy` is an OpenAI-style client
over the policy being trained (`state.policy.chat.completions.create(messages=[...])`, rollout/client.py):
an opponent that is the policy itself. Its moves reach the trained episode only as the environment's
messages (context, never trained). An opponent of your own (a scripted player, another model behind any
OpenAI-compatible client) is called from `step` the same way.

The episode's reward: the step rewards reduced by the run's named choice (`STEP_REWARDS`, `episode.
step_rewards`: "sum", "mean" or "discounted" with `episode.discount`), plus `finish`'s reward; `correct` is
`finish`'s (strict accuracy, never mixed with shaping), or, without `finish`, the last step's
`info["correct"]`. Info keys keelrl counts: `tool_calls`, `tool_errors`, `action_errors` (per step).

An environment that drives the model itself (`rollout(client, problem, seed)`, the `verifiers` style) is an
environment too: rollout/client.py plays it through the same episode machinery.

A single-turn `Task` is the one-step case; keelrl keeps sampling it on its one-shot path, so every
existing task works unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import Score, Split

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}
EpisodeEnd = Literal["done", "turns", "context", "length"]  # why an episode ended (rollout/multiturn.py)
EPISODE_ENDS: tuple[EpisodeEnd, ...] = ("done", "turns", "context", "length")
StepRewards = Literal["sum", "mean", "discounted"]


@dataclass
class StepResult:
    messages: list[Message]  # the environment's reply (tool results, a user turn); may be empty when done
    reward: float = 0.0  # shaping for this step (reduced by STEP_REWARDS, added to `finish`'s reward)
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResetResult:
    messages: list[Message]  # the opening turns
    scratch: Any = field(default_factory=dict)  # the episode's own data: becomes `state.scratch`


@dataclass
class EpisodeState:
    problem: dict[str, Any]
    seed: int
    messages: list[Message]  # the transcript so far, the opening messages first
    turn: int = 0  # assistant turns taken so far (1 during the first `step`)
    scratch: Any = field(default_factory=dict)  # the environment's own per-episode data
    rewards: list[float] = field(default_factory=list)  # each step's reward
    infos: list[dict[str, Any]] = field(default_factory=list)  # each step's info
    policy: Any = None  # an OpenAI-style client over the policy: a second seat (set by rollout/multiturn.py)
    rng: random.Random = field(init=False, repr=False)  # the episode's own generator

    def __post_init__(self) -> None:
        self.rng = random.Random(stable_hash("env", self.seed))


@runtime_checkable
class Environment(Protocol):
    name: str

    def problem(self, split: Split, index: int) -> dict[str, Any]: ...

    def difficulty(self, problem: dict[str, Any]) -> str: ...

    def reset(self, problem: dict[str, Any], seed: int) -> list[Message] | ResetResult: ...

    def step(self, state: EpisodeState, action: Any) -> StepResult | tuple[Any, ...]: ...


def is_environment(task: object) -> bool:
    """Whether `task` is multi-turn (`reset` and `step`, or a `rollout` that drives the model), as opposed to a
    single-turn `Task`."""
    return (callable(getattr(task, "reset", None)) and callable(getattr(task, "step", None))) or callable(
        getattr(task, "rollout", None)
    )


def check_environment(obj: object, name: str) -> None:
    """Raise a TypeError naming what `obj` lacks to be a task or an environment (for imported classes)."""
    data = [m for m in ("problem", "difficulty") if not callable(getattr(obj, m, None))]
    if not isinstance(getattr(obj, "name", None), str):
        data.insert(0, "name (a str attribute)")
    # whichever protocol it started on (reset or step: an environment) is the one it is told about
    kinds = [("reset", "step"), ("rollout",), ("prompt", "score")]
    wants = next(k for k in kinds if k[-1] == "score" or any(callable(getattr(obj, m, None)) for m in k))
    missing = data + [m for m in wants if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(
            f"{name} is neither a task nor an environment: it lacks {', '.join(missing)}. A task has name, "
            "problem(split, index), difficulty(problem), prompt(problem, template) and score(problem, completion); "
            "an environment has name, problem, difficulty, reset(problem, seed) and step(state, assistant_turn), or "
            "rollout(client, problem, seed) if it drives the model itself (keelrl.tasks.env)"
        )


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock, _random_lock = threading.Lock(), threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """keelrl's one event loop for environments' coroutines, on a daemon thread started on first use."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="keelrl-env-loop", daemon=True).start()
    return _loop


@contextmanager
def own_random(rng: random.Random):  # type: ignore[no-untyped-def]
    """The module-level `random` holds `rng`'s stream for the block (one block at a time), then gets its own back."""
    with _random_lock:
        saved = random.getstate()
        random.setstate(rng.getstate())
        try:
            yield
        finally:
            rng.setstate(random.getstate())
            random.setstate(saved)


def call_hook(env: Any, state: EpisodeState, hook: str, *args: Any) -> Any:
    """`env.<hook>(*args)` as keelrl calls it: a coroutine is awaited on keelrl's loop; with `global_random` the
    module-level `random` holds the episode's own stream meanwhile."""
    with own_random(state.rng) if getattr(env, "global_random", False) else nullcontext():
        out = getattr(env, hook)(*args)
        return (
            asyncio.run_coroutine_threadsafe(out, event_loop()).result() if asyncio.iscoroutine(out) else out
        )


def start_episode(env: Any, problem: dict[str, Any], seed: int) -> EpisodeState:
    """An episode's state after `reset`: the opening messages, and `reset`'s scratch if it returned one."""
    state = EpisodeState(problem, seed, [])
    out = call_hook(env, state, "reset", problem, seed)
    if isinstance(out, tuple):
        out = ResetResult(*out)
    if isinstance(out, ResetResult):
        state.scratch, out = out.scratch, out.messages
    state.messages = [dict(m) for m in out]
    return state


def json_action(model: type[BaseModel]) -> Callable[[str], BaseModel]:
    """A parser of turns into `model`: the turn's outermost `{...}` validated as JSON; a ValueError saying what is
    wrong and which fields are wanted when it is not one."""
    return functools.partial(_parse_json, model)  # a partial, not a function: a class attribute stays unbound


def _parse_json(model: type[BaseModel], text: str) -> BaseModel:
    start, end = text.find("{"), text.rfind("}")
    try:
        return model.model_validate_json(text[start : end + 1] if 0 <= start < end else text)
    except ValidationError as err:
        said = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the object'}: {e['msg']}" for e in err.errors())
        props = model.model_json_schema()["properties"].items()
        fields = ", ".join(
            f"{k} ({'|'.join(map(str, v['enum'])) if 'enum' in v else v.get('type', 'any')})"
            for k, v in props
        )
        raise ValueError(f"{said}. Write one JSON object with the fields {fields}") from None


def parse_action(env: Any, text: str) -> Any:
    """The turn as the action `step` takes (`env.action`: absent -> the text; a pydantic class -> JSON into it;
    a callable or a method `action(self, text)` -> its result). A ValueError is the model's mistake and says what
    it is."""
    spec = getattr(env, "action", None)
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        spec = json_action(spec)
    return text if spec is None else spec(text)


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
    """One step as keelrl takes it: the turn joins the transcript, is parsed into the environment's action, and
    the environment answers (a turn that does not parse is answered with its error instead); the step's reward
    and info are recorded. The reply's messages are not appended: the caller does, if the episode goes on."""
    state.turn += 1
    state.messages.append({"role": "assistant", "content": assistant_turn})
    try:
        action = parse_action(env, assistant_turn)
    except ValueError as err:  # the model's malformed action: it reads why, and may try again
        out = StepResult([{"role": "user", "content": f"error: {err}"}], info={"action_errors": 1})
    else:
        out = as_step_result(call_hook(env, state, "step", state, action), env.name)
    state.rewards.append(out.reward)
    state.infos.append(dict(out.info))
    return out


def play_text(
    env: Any,
    problem: dict[str, Any],
    turns: Sequence[str],
    seed: int = 0,
    step_rewards: StepRewards = "sum",
    discount: float = 1.0,
) -> tuple[Score, EpisodeState, list[StepResult]]:
    """An episode driven by scripted assistant turns (text, no model, no tokens), as keelrl plays one, until
    the environment is done or the turns run out: its Score, final state and each step's result. For testing
    an environment (an oracle solves it, doing nothing does not, hacks score 0)."""
    state = start_episode(env, problem, seed)
    results: list[StepResult] = []
    try:
        for text in turns:
            results.append(out := advance(env, state, text))
            if out.done:
                break
            state.messages.extend(out.messages)
        return episode_score(env, state, step_rewards, discount), state, results
    finally:
        if callable(getattr(env, "close", None)):
            call_hook(env, state, "close", state)


def _discounted(rewards: list[float], final: float, turns: int, gamma: float) -> float:
    return sum(gamma**t * r for t, r in enumerate(rewards)) + gamma ** max(turns - 1, 0) * final


# How an episode's step rewards r_1..r_T and `finish`'s reward F become its return (`episode.step_rewards`):
# sum: r_1 + ... + r_T + F; mean: (r_1 + ... + r_T) / T + F (0 without steps); discounted: sum over t of
# discount^(t-1) r_t, plus discount^(turns-1) F (F arrives with the last turn: a longer episode earns less).
STEP_REWARDS: dict[str, Callable[[list[float], float, int, float], float]] = {
    "sum": lambda r, final, turns, gamma: sum(r) + final,
    "mean": lambda r, final, turns, gamma: (sum(r) / len(r) if r else 0.0) + final,
    "discounted": _discounted,
}


def episode_score(
    env: Any, state: EpisodeState, step_rewards: StepRewards = "sum", discount: float = 1.0
) -> Score:
    """The episode's Score: the step rewards reduced by `step_rewards` plus `finish`'s (the module docstring)."""
    final = call_hook(env, state, "finish", state) if callable(getattr(env, "finish", None)) else None
    last = state.infos[-1] if state.infos else {}
    reward = STEP_REWARDS[step_rewards](state.rewards, final.reward if final else 0.0, state.turn, discount)
    if final is not None:
        return Score(reward, final.correct, dict(final.info), final.status)
    return Score(reward, bool(last.get("correct", False)), {"formatted": bool(last.get("formatted", True))})
