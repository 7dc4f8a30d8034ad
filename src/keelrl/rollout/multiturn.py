"""Multi-turn episodes: an Environment's turns, sampled token-exactly, run concurrently, within budgets.

`run_multiturn` plays a batch of episodes. Each turn, every live episode's whole sequence so far is one
prompt of one batched `sampler.generate` call (rows grouped by their token budget); then the environment
answers every episode's turn on a thread pool (tool calls and sandbox runs are the slow part). An episode
that has ended is scored (`finish`) on the pool at once, while the others take their next turns. An episode's
rollout is one token sequence: `prompt_ids` (the opening), then `completion_ids` holding the sampled turns
(trainable 1, their sampling log-probs) and the environment's replies (trainable 0, log-prob 0). Tokens are
never decoded and re-encoded (rollout/chat.py).

Seeds: turn 1 samples with the episode's seed (a one-turn episode samples what the one-shot path would),
turn k with `stable_hash("turn", seed, k)`; a row's tokens depend only on its prompt, seed and the weights,
so results do not depend on batch composition or thread scheduling.

Budgets, and the end reason each records (`Rollout.finish_reason`):
- "done": the environment said so;
- "turns": `max_turns` assistant turns were taken and the environment was not done;
- "context": the sequence would pass `max_context_tokens` (a turn is capped at what is left; a reply that
  does not fit ends the episode and is dropped);
- "length": a turn used all of `rollout.max_new_tokens` without ending.
Every ending except "done" counts as truncated (`is_truncated`: the truncation guard's metric). A turn cut
by a budget is not passed to `step`, but it is in `state.messages` when `finish` scores the episode.

An environment whose `step` raises ends that episode (reason "done", status "agent_error", `info["reason"] =
"env_error"`), and `finish` raising makes it a "verifier_error" (`score_error`): neither has a reward, both are
left out of the advantages and returned as errors, like a checker that raises, and never stop the batch.

An environment that drives the model itself (`rollout(client, problem, seed)`) is played through the same
loop by `rollout.client.Driven`; every environment's episode gets `state.policy`, a client over the policy for
a second seat (rollout/client.py). The episode's reward reduces its step rewards by `episode.step_rewards`
(tasks/env.py, `STEP_REWARDS`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keelrl.config import EpisodeConfig
from keelrl.core.seeds import stable_hash
from keelrl.rollout.client import ModelClient, as_environment, policy_client
from keelrl.rollout.types import Episode, Rollout, Sampler, SamplingSettings
from keelrl.tasks.base import Score, unscored
from keelrl.tasks.env import EpisodeEnd, EpisodeState, advance, call_hook, episode_score, start_episode

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

    from keelrl.rollout.chat import ChatFormat


ERROR_CHARS = 600  # an environment's error is kept this long in the rollout's info


@dataclass
class _Live:
    episode: Episode
    state: EpisodeState
    opening: list[dict[str, Any]]
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # after the prompt: sampled turns and replies
    logprobs: list[float] = field(default_factory=list)
    trainable: list[int] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)
    end: EpisodeEnd | None = None
    error: str | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    def append(self, ids: list[int], logprobs: list[float] | None, entry: dict[str, Any]) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.trainable += [1 if logprobs is not None else 0] * len(ids)
        self.transcript.append({**entry, "tokens": len(ids), "trained": logprobs is not None})


def turn_seed(seed: int, turn: int) -> int:
    return seed if turn == 1 else stable_hash("turn", seed, turn)


def run_multiturn(
    sampler: Sampler,
    tokenizer: Tokenizer,
    fmt: ChatFormat,
    env: Any,
    episodes: Sequence[Episode],
    settings: SamplingSettings,
    limits: EpisodeConfig,
) -> list[Rollout]:
    """Play `episodes` to their end; returns their scored rollouts, in order (`episode_errors` lists what the
    environment raised)."""
    env = as_environment(env)
    # the sampler serves one caller at a time: the turns, or a second seat (rollout/client.py)
    lock = threading.Lock()
    seat = functools.partial(policy_client, sampler, tokenizer, fmt, settings, lock=lock)
    with ThreadPoolExecutor(max(1, limits.workers), thread_name_prefix="keelrl-env") as pool:
        lives = list(pool.map(lambda e: _start(env, fmt, e, seat(e.seed)), episodes))
        # each episode is scored as soon as it ends, while the others go on (its hidden tests overlap their turns)
        finishing: dict[int, Future[Score]] = {}
        for turn in range(1, limits.max_turns + 1):
            active = [x for x in lives if x.end is None]
            if not active:
                break
            with lock:
                _sample_turn(sampler, tokenizer, settings, active, limits, turn)
            stepping = [x for x in active if x.end is None]
            list(pool.map(lambda x: _env_step(env, fmt, x, limits), stepping))
            for i, x in enumerate(lives):
                if x.end is not None and i not in finishing:
                    finishing[i] = pool.submit(_finish, env, x, limits)
        for i, x in enumerate(lives):
            if x.end is None:
                x.end = "turns"
            if i not in finishing:
                finishing[i] = pool.submit(_finish, env, x, limits)
        scores = [finishing[i].result() for i in range(len(lives))]
    version = sampler.policy_version
    return [_rollout(x, s, tokenizer, settings, version) for x, s in zip(lives, scores)]


def episode_errors(rollouts: Sequence[Rollout]) -> list[str]:
    """Why each episode without a reward has none (`step` or `finish` raised, a verifier that could not judge), in
    order."""
    return [str(r.info.get("error", r.status)) for r in rollouts if r.status != "ok"]


def _start(env: Any, fmt: ChatFormat, e: Episode, seat: ModelClient) -> _Live:
    state = start_episode(env, e.problem, e.seed)
    state.policy = seat
    return _Live(e, state, list(state.messages), fmt.opening(state.messages))


def _sample_turn(
    sampler: Sampler,
    tokenizer: Tokenizer,
    settings: SamplingSettings,
    active: list[_Live],
    limits: EpisodeConfig,
    turn: int,
) -> None:
    """One batched generation per distinct token cap; appends each turn's tokens (trainable)."""
    by_cap: dict[int, list[_Live]] = defaultdict(list)
    for x in active:
        cap = min(settings.max_new_tokens, limits.max_context_tokens - x.length)
        if cap <= 0:
            x.end = "context"
        else:
            by_cap[cap].append(x)
    for cap, rows in sorted(by_cap.items()):
        capped = dataclasses.replace(settings, max_new_tokens=cap)
        gens = sampler.generate(
            [x.prompt_ids + x.ids for x in rows], capped, [turn_seed(x.episode.seed, turn) for x in rows]
        )
        for x, gen in zip(rows, gens):
            text = tokenizer.decode(gen.completion_ids, skip_special_tokens=True)
            x.append(list(gen.completion_ids), list(gen.logprobs), {"role": "assistant", "content": text})
            if gen.finish_reason == "length":
                x.end = "length" if cap == settings.max_new_tokens else "context"
                x.state.turn += 1  # not stepped, but in the transcript `finish` scores
                x.state.messages.append({"role": "assistant", "content": text})


def _env_step(env: Any, fmt: ChatFormat, x: _Live, limits: EpisodeConfig) -> None:
    state = x.state
    try:
        out = advance(env, state, x.transcript[-1]["content"])
    except Exception as err:  # the environment's own bug: this episode ends, the batch goes on
        x.error = f"{type(err).__name__}: {err}"[:ERROR_CHARS]
        x.end = "done"
        return
    if out.done:
        x.end = "done"
        return
    if state.turn == limits.max_turns:
        return  # out of turns: the reply would never be read
    last = x.ids[-1] if x.trainable and x.trainable[-1] else None  # the turn's last sampled token
    reply = fmt.reply(x.opening, out.messages, last)
    if x.length + len(reply) >= limits.max_context_tokens:
        x.end = "context"
        return
    state.messages.extend(out.messages)
    roles = sorted({m["role"] for m in out.messages})
    content = "\n".join(str(m.get("content", "")) for m in out.messages)
    x.append(reply, None, {"role": roles[0] if len(roles) == 1 else "environment", "content": content})


def _finish(env: Any, x: _Live, limits: EpisodeConfig) -> Score:
    try:
        if x.error is not None:
            return unscored("agent_error", "env_error", x.error)
        return episode_score(env, x.state, limits.step_rewards, limits.discount)
    except Exception as err:  # a scorer that raises: no reward for this episode, as for single-turn checkers
        x.error = f"{type(err).__name__}: {err}"[:ERROR_CHARS]
        return unscored("verifier_error", "score_error", x.error)
    finally:
        if callable(getattr(env, "close", None)):
            call_hook(env, x.state, "close", x.state)


def _rollout(
    x: _Live, score: Score, tokenizer: Tokenizer, settings: SamplingSettings, version: int
) -> Rollout:
    infos = x.state.infos
    info = {
        **score.info,
        "turns": x.state.turn,
        **{k: sum(int(i.get(k, 0)) for i in infos) for k in ("tool_calls", "tool_errors", "action_errors")},
        "step_rewards": list(x.state.rewards),
        "end_reason": x.end,
        "transcript": x.transcript,
    }
    return x.episode.rollout(
        prompt_ids=x.prompt_ids,
        completion_ids=x.ids,
        sample_logprobs=x.logprobs,
        trainable=x.trainable,
        finish_reason=x.end or "done",
        policy_version=version,
        sampling=settings,
        text=tokenizer.decode(x.ids, skip_special_tokens=True),
        reward=score.reward,
        correct=score.correct,
        info=info,
        status=score.status,
    )
