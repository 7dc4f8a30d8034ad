"""Environments that drive the model themselves through keelrl's OpenAI-style client (rollout/client.py): the
episode stays one append-only token sequence (trained ids = sampled ids, each turn sampled on exactly the trained
context), an environment that rewrites earlier turns is refused, budgets end the driver's calls, tool calls come
back parsed, and the real OpenAI SDK works against the client in process."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from test_multiturn import ScriptedSampler, bpe_tokenizer, ids

from keelrl.config import EpisodeConfig
from keelrl.rollout import SamplingSettings
from keelrl.rollout.chat import PlainFormat, TemplateFormat
from keelrl.rollout.client import EpisodeOver, HistoryRewritten
from keelrl.rollout.episodes import Episode
from keelrl.rollout.multiturn import episode_errors, run_multiturn, turn_seed
from keelrl.tasks.base import Score
from keelrl.tasks.env import is_environment
from keelrl.tasks.tools import tool


@pytest.fixture(scope="module")
def tok() -> Any:
    return bpe_tokenizer()


class Guess:
    """verifiers-style: `rollout` owns the loop and calls the model when it wants a turn. Secret 2: a reply
    "o\\nlo" after each wrong guess (it merges with the model's text when tokenized together)."""

    name = "guess"

    def __init__(self, edit: str | None = None, catch: bool = False) -> None:
        self.edit, self.catch = edit, catch
        self.seen: list[Any] = []  # (text, finish_reason) per answer, or the exception a call raised

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return {"i": index}

    def difficulty(self, problem: dict[str, Any]) -> str:
        return "all"

    def opening(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "be brief"}, {"role": "user", "content": "guess"}]

    def stopped(self, err: Exception) -> Any:
        """A call keelrl refused: recorded, then raised (the default) or scored as a partial episode."""
        self.seen.append(type(err).__name__)
        if not self.catch:
            raise err
        return Score(0.25, False, {"partial": True})

    def read(self, response: Any, messages: list[dict[str, Any]], turn: int) -> Score | None:
        """The model's answer joins the conversation; a right guess ends the game, a wrong one gets a hint."""
        choice = response.choices[0]
        self.seen.append((choice.message.content, choice.finish_reason))
        messages.append({"role": "assistant", "content": choice.message.content})
        if "2" in choice.message.content:
            return Score(1.0 / turn, True, {"turns": turn})
        messages.append({"role": "user", "content": "o\nlo"})
        if self.edit == "reply" and turn == 2:  # "cleans up" the model's first reply
            messages[2] = {"role": "assistant", "content": messages[2]["content"] + " (edited)"}
        elif self.edit == "drop" and turn == 2:  # drops the system message to save context
            del messages[0]
        return None

    async def rollout(self, client: Any, problem: dict[str, Any], seed: int) -> Any:
        messages = self.opening()
        for turn in range(1, 5):
            try:
                response = await client.chat.completions.create(
                    model="m", messages=list(messages), temperature=0.3
                )
            except (EpisodeOver, HistoryRewritten) as err:
                return self.stopped(err)
            if (score := self.read(response, messages, turn)) is not None:
                return score
        return 0.0


class SyncGuess(Guess):
    """The same game with a plain `rollout` and a blocking client, as with `openai.OpenAI`."""

    def rollout(self, client: Any, problem: dict[str, Any], seed: int) -> Any:  # type: ignore[override]
        messages = self.opening()
        for turn in range(1, 5):
            try:
                response = client.chat.completions.create(model="m", messages=list(messages), max_tokens=2)
            except (EpisodeOver, HistoryRewritten) as err:
                return self.stopped(err)
            if (score := self.read(response, messages, turn)) is not None:
                return score
        return 0.0


WIDE = EpisodeConfig(max_turns=8, max_context_tokens=4096, workers=4)


def play(tok, env, script, seeds=(11,), limits=WIDE, fmt=None, max_new=16):
    sampler = ScriptedSampler(script, tok.eos_token_id)
    episodes = [Episode(i, env.problem("train", i), i, s) for i, s in enumerate(seeds)]
    fmt = fmt or PlainFormat(tok)
    rollouts = run_multiturn(sampler, tok, fmt, env, episodes, SamplingSettings(max_new), limits)
    return rollouts, sampler


@pytest.mark.parametrize("fmt_name", ["plain", "chat"])
@pytest.mark.parametrize("driver", [Guess, SyncGuess])
def test_a_driven_episode_trains_exactly_the_sampled_tokens(tok, fmt_name, driver) -> None:
    """Turns sampled as non-canonical tokens ("hel" "lo" where the tokenizer writes "hello"); the environment's
    reply "o\nlo" would merge with the model's text if tokenized together. The ids at trainable positions are the
    sampled ids byte for byte; each turn was sampled on exactly the trained sequence; the driver read the decoded
    text in the OpenAI response shape; its own sampling arguments did not change the run's."""
    fmt = PlainFormat(tok) if fmt_name == "plain" else TemplateFormat(tok)
    eos = tok.eos_token_id
    turns = [[*ids(tok, "hel", "lo", "h"), eos], [*ids(tok, "h", "o"), eos], [*ids(tok, "2"), eos]]
    env = driver()
    assert is_environment(env)
    (r,), sampler = play(tok, env, {turn_seed(11, k + 1): t for k, t in enumerate(turns)}, fmt=fmt)
    assert episode_errors([r]) == [] and r.finish_reason == "done" and r.info["turns"] == 3
    assert (r.reward, r.correct) == (pytest.approx(1 / 3), True)
    assert env.seen == [("helloh", "stop"), ("ho", "stop"), ("2", "stop")]
    mask = torch.tensor(r.trainable, dtype=torch.bool)
    assert torch.tensor(r.completion_ids)[mask].tolist() == [t for turn in turns for t in turn]
    assert torch.tensor(r.sample_logprobs)[mask].tolist() == pytest.approx(
        [-0.5 - 0.01 * i for turn in turns for i in range(len(turn))]
    )
    # the sequence: opening + turn + reply + turn + reply + turn, each reply rendered and tokenized alone
    opening = fmt.opening(env.opening())
    reply = fmt.reply(env.opening(), [{"role": "user", "content": "o\nlo"}], eos)
    assert r.prompt_ids == opening
    assert r.completion_ids == turns[0] + reply + turns[1] + reply + turns[2]
    assert [c[0] for c in sampler.calls] == [
        opening, opening + turns[0] + reply, opening + turns[0] + reply + turns[1] + reply,
    ]  # fmt: skip
    assert {c[2] for c in sampler.calls} == {16}  # the run's token cap, not the call's max_tokens
    text = tok.decode(r.completion_ids)
    assert tok(text, add_special_tokens=False)["input_ids"] != r.completion_ids  # re-tokenizing would differ


@pytest.mark.parametrize("edit", ["reply", "drop"])
def test_an_environment_that_rewrites_history_is_refused(tok, edit) -> None:
    """Editing the model's earlier reply, or dropping an earlier message, makes the call's history differ from
    what was sampled: the call raises HistoryRewritten in the driver, and the episode is an agent error naming the
    message, with no reward and nothing trained; the other episodes of the batch are unaffected."""
    from keelrl.step.batch import collate

    eos = tok.eos_token_id
    h = [*ids(tok, "h"), eos]
    script = {turn_seed(s, k): h for s in (1, 2) for k in (1, 2, 3)} | {
        turn_seed(2, 2): [*ids(tok, "2"), eos]
    }
    env = Guess(edit=edit)
    bad, good = play(tok, env, script, seeds=(1, 2))[0]
    assert "HistoryRewritten" in env.seen
    assert bad.status == "agent_error" and bad.info["reason"] == "env_error"
    assert "rewrote the conversation" in bad.info["error"] and "append only" in bad.info["error"]
    assert ("message 2 was" if edit == "reply" else "message 0 was") in bad.info["error"]
    assert episode_errors([bad, good]) == [bad.info["error"]]
    assert good.status == "ok" and good.correct
    batch = collate([bad, good], tok.pad_token_id, torch.device("cpu"))
    assert batch.target_mask[0].sum() == 0 and batch.target_mask[1].sum() == sum(good.trainable)


def test_budgets_end_the_drivers_calls(tok) -> None:
    eos = tok.eos_token_id
    h = [*ids(tok, "h"), eos]
    turns = EpisodeConfig(max_turns=2, max_context_tokens=4096, workers=1)
    # out of turns: the driver's third call raises EpisodeOver; left to propagate, the episode scores 0
    env = Guess()
    (r,), _ = play(tok, env, {turn_seed(3, k): h for k in (1, 2)}, seeds=(3,), limits=turns)
    assert env.seen == [("h", "stop"), ("h", "stop"), "EpisodeOver"]
    assert (r.finish_reason, r.status, r.reward, r.info["reason"]) == ("turns", "ok", 0.0, "budget")
    # caught, the driver scores what was done
    env = Guess(catch=True)
    (r,), _ = play(tok, env, {turn_seed(3, k): h for k in (1, 2)}, seeds=(3,), limits=turns)
    assert (r.reward, r.info["partial"]) == (0.25, True)
    # a turn cut at rollout.max_new_tokens reaches the driver with finish_reason "length", as from an API
    env = Guess(catch=True)
    (r,), _ = play(tok, env, {turn_seed(4, 1): ids(tok, "h") * 20 + [eos]}, seeds=(4,), max_new=5)
    assert r.finish_reason == "length" and env.seen == [("hhhhh", "length"), "EpisodeOver"]


def test_tool_calls_come_back_parsed_and_echoes_pass_the_history_check(tok) -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class Calc(Guess):
        tools = (tool(add),)

        async def rollout(self, client, problem, seed):
            messages = [{"role": "user", "content": "2+3?"}]
            schemas = [t.schema() for t in self.tools]
            for _ in range(3):
                message = (
                    await client.chat.completions.create(model="m", messages=messages, tools=schemas)
                ).choices[0]
                self.seen.append(message.finish_reason)
                messages.append(message.message.model_dump(exclude_none=True))  # echoed as the SDK would
                if not message.message.tool_calls:
                    return Score(1.0, "5" in message.message.content)
                for call in message.message.tool_calls:
                    args = json.loads(call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(add(**args))})
            return 0.0

    eos = tok.eos_token_id
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    script = {turn_seed(5, 1): [*ids(tok, *call), eos], turn_seed(5, 2): [*ids(tok, "5"), eos]}
    env = Calc()
    (r,), sampler = play(tok, env, script, seeds=(5,), fmt=TemplateFormat(tok, env.tools), max_new=80)
    assert episode_errors([r]) == [] and r.correct and env.seen == ["tool_calls", "stop"]
    assert "Tools: add" in tok.decode(r.prompt_ids)  # the environment's tools reach the model's prompt
    assert "<|im_start|>tool\n5<|im_end|>" in tok.decode(sampler.calls[1][0])


def test_a_driver_that_raises_is_an_agent_error_and_one_that_never_calls_is_refused(tok) -> None:
    class Broken(Guess):
        async def rollout(self, client, problem, seed):
            await client.chat.completions.create(messages=self.opening())
            raise KeyError("driver bug")

    eos = tok.eos_token_id
    (r,), _ = play(tok, Broken(), {turn_seed(6, 1): [*ids(tok, "h"), eos]}, seeds=(6,))
    assert r.status == "agent_error" and "driver bug" in r.info["error"]

    class Silent(Guess):
        def rollout(self, client, problem, seed):  # type: ignore[override]
            return 1.0

    with pytest.raises(ValueError, match="returned without calling the model"):
        play(tok, Silent(), {}, seeds=(6,))


def test_the_openai_sdk_runs_against_the_client_in_process(tok) -> None:
    """`client.openai()`: the real SDK (async and sync), its HTTP requests answered in process; a refused call is
    the SDK's BadRequestError with keelrl's sentence."""
    openai = pytest.importorskip("openai")

    class SDKGuess(Guess):
        async def rollout(self, client, problem, seed):
            sdk = client.openai()
            assert isinstance(sdk, openai.AsyncOpenAI)
            messages = self.opening()
            for turn in range(1, 5):
                try:
                    response = await sdk.chat.completions.create(model="m", messages=messages)
                except openai.BadRequestError as err:
                    self.seen.append(err.message)
                    return 0.5
                if (score := self.read(response, messages, turn)) is not None:
                    return score
            return 0.0

    class SyncSDKGuess(SyncGuess):
        def rollout(self, client, problem, seed):  # type: ignore[override]
            sdk = client.openai()
            assert isinstance(sdk, openai.OpenAI)
            messages = self.opening()
            response = sdk.chat.completions.create(model="m", messages=messages)
            return self.read(response, messages, 1) or 0.0

    class HTTPGuess(SyncGuess):
        """Over a real local HTTP server, as a program of its own would reach the policy."""

        def rollout(self, client, problem, seed):  # type: ignore[override]
            self.url = client.serve()
            sdk = openai.OpenAI(base_url=self.url, api_key="none", max_retries=0)
            messages = self.opening()
            return self.read(sdk.chat.completions.create(model="m", messages=messages), messages, 1) or 0.0

    eos = tok.eos_token_id
    script = {turn_seed(7, 1): [*ids(tok, "h"), eos], turn_seed(7, 2): [*ids(tok, "2"), eos]}
    served = HTTPGuess()
    (r,), _ = play(tok, served, script, seeds=(7,))
    assert (
        episode_errors([r]) == []
        and served.seen == [("h", "stop")]
        and served.url.startswith("http://127.0.0.1:")
    )
    with pytest.raises(openai.APIConnectionError):  # the server stopped with the episode
        openai.OpenAI(base_url=served.url, api_key="none", max_retries=0).chat.completions.create(
            model="m", messages=[]
        )
    for env in (SDKGuess(), SyncSDKGuess()):
        (r,), _ = play(tok, env, script, seeds=(7,))
        assert episode_errors([r]) == []
    assert r.reward == 0.0 and env.seen == [("h", "stop")]
    env = SDKGuess()
    limits = EpisodeConfig(max_turns=1, max_context_tokens=4096, workers=1)
    (r,), _ = play(tok, env, script, seeds=(7,), limits=limits)
    assert env.seen[0] == ("h", "stop") and "context length" in env.seen[1] and r.reward == 0.5
