"""What bring-your-own environments need from the protocol (tasks/env.py, rollout/multiturn.py): per-episode state
from `reset`, per-episode randomness (also for libraries that draw from the module-level `random`), async hooks,
typed actions with errors the model reads, a second seat played by the policy, and the named reduction of step
rewards, with worked numbers."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any, Literal

import pytest
import torch
from pydantic import BaseModel
from test_multiturn import ScriptedSampler, bpe_tokenizer, ids

from keelrl.config import EpisodeConfig
from keelrl.core.seeds import stable_hash
from keelrl.rollout import SamplingSettings
from keelrl.rollout.chat import PlainFormat, TemplateFormat
from keelrl.rollout.episodes import Episode
from keelrl.rollout.multiturn import episode_errors, run_multiturn, turn_seed
from keelrl.tasks.base import Score
from keelrl.tasks.env import STEP_REWARDS, EpisodeState, ResetResult, StepResult, play_text
from keelrl.tasks.tools import ToolCall, call_action, parse_calls, run_tool_calls, tool


@pytest.fixture(scope="module")
def tok() -> Any:
    return bpe_tokenizer()


def play(tok, env, script, seeds, limits=None, fmt=None, max_new=16):
    sampler = ScriptedSampler(script, tok.eos_token_id)
    episodes = [Episode(i, env.problem("train", i), i, s) for i, s in enumerate(seeds)]
    limits = limits or EpisodeConfig(max_turns=4, max_context_tokens=4096, workers=len(seeds))
    rollouts = run_multiturn(
        sampler, tok, fmt or PlainFormat(tok), env, episodes, SamplingSettings(max_new), limits
    )
    return rollouts, sampler


class Base:
    name = "base"

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return {"i": index}

    def difficulty(self, problem: dict[str, Any]) -> str:
        return "all"

    def reset(self, problem: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"go {problem['i']}"}]


class Ledger:
    """A per-episode object, as a game or a maze instance would be."""

    def __init__(self, owner: int) -> None:
        self.owner, self.entries = owner, []


class LedgerEnv(Base):
    """Opens a Ledger per episode in `reset`; each step sleeps (so episodes interleave) and writes to its own
    ledger; records how many steps ran at once."""

    def __init__(self) -> None:
        self.running = self.most = 0
        self.lock = threading.Lock()

    def reset(self, problem, seed):
        return ResetResult(super().reset(problem, seed), Ledger(problem["i"]))

    def step(self, state: EpisodeState, action: str) -> StepResult:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.02)
        state.scratch.entries.append((state.problem["i"], state.turn, action))
        with self.lock:
            self.running -= 1
        return StepResult([{"role": "user", "content": "ok"}], done=state.turn == 3)

    def finish(self, state: EpisodeState) -> Score:
        return Score(0.0, True, {"owner": state.scratch.owner, "entries": list(state.scratch.entries)})


def test_reset_holds_per_episode_state_and_concurrent_episodes_keep_it_apart(tok) -> None:
    """`reset` returns the episode's own object; six episodes stepped on six threads at once each see only their
    own, and the result is what each episode gives alone."""
    eos = tok.eos_token_id
    seeds = list(range(6))
    script = {turn_seed(s, k): ids(tok, "h") * (1 + s) + [eos] for s in seeds for k in (1, 2, 3)}
    env = LedgerEnv()
    rollouts, _ = play(tok, env, script, seeds)
    assert env.most > 1  # the steps really ran concurrently
    for i, r in enumerate(rollouts):
        assert r.info["owner"] == i
        assert r.info["entries"] == [(i, k, "h" * (1 + i)) for k in (1, 2, 3)]
        (alone,), _ = play(tok, LedgerEnv(), script, [seeds[i]])
        assert alone.info["entries"] == [(0, k, "h" * (1 + i)) for k in (1, 2, 3)]
    # a (messages, scratch) tuple works too, and play_text runs the same reset
    env = LedgerEnv()
    env.reset = lambda problem, seed: ([{"role": "user", "content": "go"}], Ledger(42))  # type: ignore[method-assign]
    score, state, _ = play_text(env, {"i": 0}, ["a", "b", "c"])
    assert state.scratch.owner == 42 and score.info["entries"] == [(0, 1, "a"), (0, 2, "b"), (0, 3, "c")]


class DiceEnv(Base):
    """Each step draws a die from the episode's own generator; `finish` reports the draws."""

    def step(self, state, action):
        state.scratch.setdefault("draws", []).append(state.rng.randint(1, 6))
        return StepResult([{"role": "user", "content": "roll"}], done=state.turn == 3)

    def finish(self, state):
        return Score(0.0, True, {"draws": state.scratch["draws"]})


class GlobalDiceEnv(Base):
    """A library in the style of TextArena's games: it seeds and draws from the module-level `random` in `reset`
    and draws from it again in every step."""

    global_random = True

    def reset(self, problem, seed):
        random.seed(seed)  # as textarena.core.State does
        return ResetResult(super().reset(problem, seed), {"draws": [random.randint(1, 6)]})

    def step(self, state, action):
        time.sleep(0.005)
        state.scratch["draws"].append(random.randint(1, 6))
        return StepResult([{"role": "user", "content": "roll"}], done=state.turn == 3)

    finish = DiceEnv.finish


def test_per_episode_rng_is_reproducible_whatever_runs_beside_it(tok) -> None:
    eos = tok.eos_token_id
    seeds = [11, 12, 13, 14, 15, 16]
    script = {turn_seed(s, k): [*ids(tok, "h"), eos] for s in seeds for k in (1, 2, 3)}
    together, _ = play(tok, DiceEnv(), script, seeds)
    for s, r in zip(seeds, together):
        (alone,), _ = play(tok, DiceEnv(), script, [s])
        assert r.info["draws"] == alone.info["draws"]
        want = random.Random(stable_hash("env", s))  # the documented stream of `state.rng`
        assert r.info["draws"] == [want.randint(1, 6) for _ in range(3)]
    assert len({tuple(r.info["draws"]) for r in together}) > 1  # different episodes, different draws
    # the module-level `random`: each episode's calls see its own stream, and the process's generator is untouched
    before = random.getstate()
    together, _ = play(tok, GlobalDiceEnv(), script, seeds)
    assert random.getstate() == before
    for s, r in zip(seeds, together):
        (alone,), _ = play(tok, GlobalDiceEnv(), script, [s])
        assert r.info["draws"] == alone.info["draws"]
        want = random.Random(s)  # reset seeds the module-level generator with the episode's seed
        assert r.info["draws"] == [want.randint(1, 6) for _ in range(4)]
    # teeth: without `global_random` the episodes share one generator, and draws depend on the company they keep
    unguarded = type("Unguarded", (GlobalDiceEnv,), {"global_random": False})
    together, _ = play(tok, unguarded(), script, seeds)
    alone = [play(tok, unguarded(), script, [s])[0][0].info["draws"] for s in seeds]
    assert [r.info["draws"] for r in together] != alone


class AsyncEnv(Base):
    """Async hooks with a resource bound to the event loop it was made on (an asyncio.Queue made in `reset` and
    used in every step, as an aiohttp session would be)."""

    def __init__(self) -> None:
        self.running = self.most = 0

    async def reset(self, problem, seed):
        inbox: asyncio.Queue[str] = asyncio.Queue()
        return ResetResult(super().reset(problem, seed), {"inbox": inbox, "loop": asyncio.get_running_loop()})

    async def step(self, state, action):
        assert asyncio.get_running_loop() is state.scratch["loop"]
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.02)  # the other episodes' steps run meanwhile
        self.running -= 1
        await state.scratch["inbox"].put(action)
        return StepResult([{"role": "user", "content": "next"}], 0.5, done=state.turn == 2)

    async def finish(self, state):
        inbox = state.scratch["inbox"]
        return Score(1.0, True, {"seen": [inbox.get_nowait() for _ in range(inbox.qsize())]})


def test_async_hooks_run_on_one_loop_and_overlap(tok) -> None:
    eos = tok.eos_token_id
    seeds = [1, 2, 3, 4]
    script = {turn_seed(s, k): ids(tok, "h") * k + [eos] for s in seeds for k in (1, 2)}
    env = AsyncEnv()
    rollouts, _ = play(tok, env, script, seeds)
    assert episode_errors(rollouts) == []
    assert all(r.info["seen"] == ["h", "hh"] and r.reward == pytest.approx(2.0) for r in rollouts)
    assert env.most > 1  # async steps of different episodes overlapped on the loop
    score, _, _ = play_text(AsyncEnv(), {"i": 0}, ["a", "b"])
    assert score.info["seen"] == ["a", "b"] and score.reward == pytest.approx(2.0)


class Move(BaseModel):
    row: int
    col: Literal[0, 1, 2]


class TypedEnv(Base):
    """Its action is a Move parsed from the turn's JSON."""

    action = Move

    def __init__(self) -> None:
        self.got: list[Any] = []

    def step(self, state, action):
        self.got.append(action)
        return StepResult([{"role": "user", "content": "placed"}], 1.0, done=action.row == 2)


def test_typed_actions_parse_or_tell_the_model_what_is_wrong(tok) -> None:
    env = TypedEnv()
    score, state, results = play_text(
        env, {"i": 0}, ['{"row": 1, "col": 1}', "I move to the middle", '{"row": "x", "col": 5}', 'ok: {"row": 2, "col": 0}']
    )  # fmt: skip
    assert env.got == [Move(row=1, col=1), Move(row=2, col=0)]  # step only sees parsed actions
    errors = [r.messages[0]["content"] for r in results[1:3]]
    assert all(e.startswith("error: ") and "fields row (integer), col (0|1|2)" in e for e in errors)
    assert (
        "row: Input should be a valid integer" in errors[1] and "col: Input should be 0, 1 or 2" in errors[1]
    )
    assert [i.get("action_errors", 0) for i in state.infos] == [0, 1, 1, 0]
    assert score.reward == pytest.approx(2.0)  # no reward for turns that did not parse
    # through keelrl's loop: the error is a user turn the model reads (context), counted in the rollout
    eos = tok.eos_token_id
    turns = [[*ids(tok, *"nope"), eos], [*ids(tok, *'{"row":2,"col":0}'), eos]]
    (r,), sampler = play(
        tok, TypedEnv(), {turn_seed(3, k + 1): t for k, t in enumerate(turns)}, [3], max_new=32
    )
    assert r.info["action_errors"] == 1 and r.info["turns"] == 2 and r.finish_reason == "done"
    assert r.info["transcript"][1]["role"] == "user" and r.info["transcript"][1]["content"].startswith(
        "error: "
    )
    assert "error: " in tok.decode(sampler.calls[1][0])  # the second turn was sampled after reading the error
    mask = torch.tensor(r.trainable, dtype=torch.bool)
    assert torch.tensor(r.completion_ids)[mask].tolist() == turns[0] + turns[1]


def test_tool_call_actions() -> None:
    def place(row: int, col: int) -> str:
        """Place a mark."""
        return "ok"

    class ToolEnv(Base):
        tools = (tool(place),)
        action = call_action(tools)

        def step(self, state, action):
            assert isinstance(action, ToolCall)
            return StepResult([{"role": "tool", "content": f"{action.name}{action.arguments}"}])

    _, _, results = play_text(
        ToolEnv(), {"i": 0},
        ['<tool_call>{"name": "place", "arguments": {"row": 1, "col": 2}}</tool_call>', "no call",
         "<tool_call>{bad json}</tool_call>", "<tool_call>place: {}</tool_call><tool_call>place: {}</tool_call>",
         '<tool_call>{"name": "jump", "arguments": {}}</tool_call>'],
    )  # fmt: skip
    said = [r.messages[0]["content"] for r in results]
    assert said[0] == "place{'row': 1, 'col': 2}"
    assert "write one <tool_call>" in said[1] and "found 0" in said[1]
    assert "not valid JSON" in said[2] and "found 2" in said[3] and "no tool named 'jump'" in said[4]
    assert all(s.startswith("error: ") for s in said[1:])


def test_a_json_list_of_calls_in_one_tag_is_every_call() -> None:
    # SmolLM2's chat template asks for <tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call> ([] for none)
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    tools = [tool(add)]
    text = '<tool_call>[\n{"name": "add", "arguments": {"a": 1, "b": 2}},\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n]</tool_call>'
    replies = run_tool_calls(text, tools)
    assert [m["content"] for m in replies.messages] == ["3", "7"] and replies.errors == 0
    assert parse_calls("<tool_call>[]</tool_call>", tools) == []
    bad = parse_calls("<tool_call>[{]</tool_call>", tools)
    assert len(bad) == 1 and "not valid JSON" in str(bad[0])


def test_plain_calls_and_unclosed_tags() -> None:
    def python(code: str) -> str:
        """Run code."""
        return code

    tools = [tool(python)]
    # "the text after the colon is the tool's one required argument, or a JSON object of its arguments"
    assert parse_calls("<tool_call>python: {k: 1 for k in 'ab'}</tool_call>", tools) == [
        ToolCall("python", {"code": "{k: 1 for k in 'ab'}"})
    ]
    assert parse_calls('<tool_call>python: {"code": "1"}</tool_call>', tools) == [
        ToolCall("python", {"code": "1"})
    ]
    # a stray closing tag before a call cut off at the end does not hide the cut call
    calls = parse_calls("</tool_call> then <tool_call>python: 1</tool_call><tool_call>python: cut", tools)
    assert (
        calls[0] == ToolCall("python", {"code": "1"}) and "without its" in str(calls[1]) and len(calls) == 2
    )


def test_a_parameterised_annotation_has_its_json_type() -> None:
    def total(values: list[int], weights: dict[str, float], name: str = "") -> float:
        """Sum."""
        return 0.0

    props = tool(total).parameters["properties"]
    assert [props[k]["type"] for k in ("values", "weights", "name")] == ["array", "object", "string"]


class Nim(Base):
    """Two-player Nim (take 1 or 2 from 5; taking the last wins): the model moves first, the second seat is the
    policy itself, asked through `state.policy` with its own view of the game."""

    def reset(self, problem, seed):
        return ResetResult([{"role": "user", "content": "pile 5, take 1 or 2"}], {"pile": 5, "seen": []})

    def step(self, state, action):
        game = state.scratch
        game["pile"] -= 2 if "2" in action else 1
        if game["pile"] <= 0:
            return StepResult([], done=True, info={"correct": True})
        view = [{"role": "user", "content": f"you are second; pile {game['pile']}"}]
        reply = state.policy.chat.completions.create(messages=view)
        move = reply.choices[0].message.content
        game["seen"].append((move, reply.choices[0].finish_reason, reply.usage["completion_tokens"]))
        game["pile"] -= 2 if "2" in move else 1
        if game["pile"] <= 0:
            return StepResult([], done=True, info={"correct": False})
        return StepResult([{"role": "user", "content": f"opponent took {move}; pile {game['pile']}"}])

    def finish(self, state):
        won = bool(state.infos[-1].get("correct"))
        return Score(1.0 if won else -1.0, won, {"seen": state.scratch["seen"]})


@pytest.mark.parametrize("fmt_name", ["plain", "chat"])
def test_a_second_seat_played_by_the_policy(tok, fmt_name) -> None:
    """The opponent's moves are sampled from the policy on the opponent's own view, with seeds of their own;
    they reach the model only as the environment's messages (never trained); episodes stay reproducible."""
    fmt = PlainFormat(tok) if fmt_name == "plain" else TemplateFormat(tok)
    eos = tok.eos_token_id
    one, two = [*ids(tok, "1"), eos], [*ids(tok, "2"), eos]
    # episode 7: model 2 (pile 3), opponent 1 (pile 2), model 2: the model wins;
    # episode 8: model 1 (pile 4), opponent 2 (pile 2), model 1 (pile 1), opponent 1: the opponent wins
    script = {
        turn_seed(7, 1): two, stable_hash("seat", 7, 1): one, turn_seed(7, 2): two,
        turn_seed(8, 1): one, stable_hash("seat", 8, 1): two, turn_seed(8, 2): one, stable_hash("seat", 8, 2): one,
    }  # fmt: skip
    rollouts, sampler = play(tok, Nim(), script, [7, 8], fmt=fmt)
    win, loss = rollouts
    assert (win.reward, win.correct, loss.reward, loss.correct) == (1.0, True, -1.0, False)
    assert win.info["seen"] == [("1", "stop", 2)] and loss.info["seen"] == [
        ("2", "stop", 2),
        ("1", "stop", 2),
    ]
    seat_calls = [c for c in sampler.calls if c[1] == stable_hash("seat", 7, 1)]
    assert len(seat_calls) == 1 and seat_calls[0][0] == fmt.opening(
        [{"role": "user", "content": "you are second; pile 3"}]
    )
    mask = torch.tensor(win.trainable, dtype=torch.bool)
    assert torch.tensor(win.completion_ids)[mask].tolist() == two + two  # only the model's own turns train
    assert "opponent took 1; pile 2" in tok.decode(torch.tensor(win.completion_ids)[~mask].tolist())
    (alone,), _ = play(tok, Nim(), script, [7], fmt=fmt)
    assert alone.completion_ids == win.completion_ids


def test_step_reward_reductions_with_worked_numbers(tok) -> None:
    """Step rewards 1, 0, 2 and finish 3 over 3 turns, discount 0.5: sum 1+0+2+3 = 6; mean (1+0+2)/3 + 3 = 4;
    discounted 1 + 0.5*0 + 0.25*2 + 0.25*3 = 2.25 (finish arrives with turn 3)."""
    assert STEP_REWARDS["sum"]([1.0, 0.0, 2.0], 3.0, 3, 0.5) == pytest.approx(6.0)
    assert STEP_REWARDS["mean"]([1.0, 0.0, 2.0], 3.0, 3, 0.5) == pytest.approx(4.0)
    assert STEP_REWARDS["discounted"]([1.0, 0.0, 2.0], 3.0, 3, 0.5) == pytest.approx(2.25)
    # a last turn cut by a budget is not stepped but is a turn: finish's reward waits for it
    assert STEP_REWARDS["discounted"]([1.0], 2.0, 2, 0.5) == pytest.approx(1.0 + 0.5 * 2.0)
    assert STEP_REWARDS["mean"]([], 2.0, 1, 0.5) == pytest.approx(2.0)
    assert STEP_REWARDS["discounted"]([4.0], 1.0, 1, 0.9) == pytest.approx(
        5.0
    )  # one turn: nothing discounted

    class Graded(Base):
        def step(self, state, action):
            return StepResult(
                [{"role": "user", "content": "."}], [1.0, 0.0, 2.0][state.turn - 1], state.turn == 3
            )

        def finish(self, state):
            return Score(3.0, True)

    eos = tok.eos_token_id
    script = {turn_seed(1, k): [*ids(tok, "h"), eos] for k in (1, 2, 3)}
    for how, want in (("sum", 6.0), ("mean", 4.0), ("discounted", 2.25)):
        limits = EpisodeConfig(
            max_turns=4, max_context_tokens=4096, workers=1, step_rewards=how, discount=0.5
        )
        (r,), _ = play(tok, Graded(), script, [1], limits)
        assert r.reward == pytest.approx(want) and r.info["step_rewards"] == [1.0, 0.0, 2.0]
        assert play_text(Graded(), {"i": 0}, "abc", step_rewards=how, discount=0.5)[
            0
        ].reward == pytest.approx(want)
