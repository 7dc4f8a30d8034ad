"""The example adapters (examples/environments/): the real `verifiers` library (multi-turn, single-turn and tool
environments, played unchanged through keelrl's client, and trained), the real TextArena (a two-player game
against the policy's second seat, reproducible under threads although TextArena draws from the module-level
`random`), and an OpenEnv-style maze (a local stand-in of OpenEnv's interface: typed actions, async steps,
per-step rewards)."""

from __future__ import annotations

import collections
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from keelrl.config import EpisodeConfig, TinyModelConfig, load_config
from keelrl.core.seeds import stable_hash
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.rollout import SamplingSettings
from keelrl.rollout.chat import PlainFormat, TemplateFormat
from keelrl.rollout.episodes import Episode
from keelrl.rollout.multiturn import episode_errors, run_multiturn, turn_seed
from keelrl.tasks.env import play_text

EXAMPLES = Path(__file__).parents[2] / "examples" / "environments"
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_multiturn import ScriptedSampler, bpe_tokenizer, ids  # noqa: E402


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.fixture(scope="module")
def tok() -> Any:
    return bpe_tokenizer()


def play(tok, env, script, seeds, fmt=None, max_new=16, limits=None, problems=None):
    sampler = ScriptedSampler(script, tok.eos_token_id)
    problems = problems or range(len(seeds))
    episodes = [Episode(i, env.problem("train", i), i, s) for i, s in zip(problems, seeds)]
    limits = limits or EpisodeConfig(max_turns=6, max_context_tokens=8000, workers=4)
    return run_multiturn(
        sampler, tok, fmt or PlainFormat(tok), env, episodes, SamplingSettings(max_new), limits
    ), sampler


VF_GUESS = '''
import verifiers as vf
from datasets import Dataset


class Guess(vf.MultiTurnEnv):
    """Find a number from 1 to 4: "higher" / "lower" after each wrong guess."""

    async def env_response(self, messages, state, **kwargs):
        said = str(messages[-1]["content"] if isinstance(messages[-1], dict) else messages[-1].content)
        digits = [int(c) for c in said if c.isdigit()]
        secret = int(state["answer"])
        if digits and digits[0] == secret:  # solved: verifiers' way to end the episode from here
            state["solved"] = len(state["trajectory"])
            state["final_env_response"] = [vf.UserMessage(content="yes")]
            return state["final_env_response"]
        return [vf.UserMessage(content="higher" if digits and digits[0] < secret else "lower")]


async def found(state, **kwargs):
    return 1.0 / state["solved"] if "solved" in state else 0.0


def load_environment(max_turns: int = 4):
    rows = [{"question": "Guess my number from 1 to 4.", "answer": str(1 + i % 4)} for i in range(16)]
    data = Dataset.from_list(rows)
    return Guess(dataset=data, eval_dataset=data, rubric=vf.Rubric(funcs=[found]), max_turns=max_turns)
'''


@pytest.fixture
def vf_guess(tmp_path, monkeypatch) -> str:
    pytest.importorskip("verifiers")
    (tmp_path / "vf_guess.py").write_text(textwrap.dedent(VF_GUESS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "vf_guess"
    sys.modules.pop("vf_guess", None)


def test_verifiers_environments_play_unchanged_through_the_client(tok, vf_guess) -> None:
    import verifiers as vf
    from datasets import Dataset
    from verifiers_env import Verifiers

    eos = tok.eos_token_id
    env = Verifiers(env_id=vf_guess)
    assert env.problem("train", 1)["answer"] == "2" and env.problem("train", 1)["prompt"][0]["role"] == "user"
    # multi-turn, problem 0 (secret 1): 2 (lower), 3 (lower), 1: solved on turn 3
    turns = [[*ids(tok, "2"), eos], [*ids(tok, "3"), eos], [*ids(tok, "1"), eos]]
    (r,), sampler = play(tok, env, {turn_seed(5, k + 1): t for k, t in enumerate(turns)}, [5])
    assert episode_errors([r]) == [] and (r.reward, r.correct) == (pytest.approx(1 / 3), False)
    assert [t["content"] for t in r.info["transcript"]] == ["2", "lower", "3", "lower", "1"]
    mask = torch.tensor(r.trainable, dtype=torch.bool)
    assert torch.tensor(r.completion_ids)[mask].tolist() == [t for turn in turns for t in turn]
    opening = PlainFormat(tok).opening([{"role": "user", "content": "Guess my number from 1 to 4."}])
    assert sampler.calls[0][0] == opening and sampler.calls[2][0] == r.prompt_ids + r.completion_ids[:-2]
    # out of keelrl's turns: verifiers sees a context-length error, stops cleanly, and its rubric scores the episode
    limits = EpisodeConfig(max_turns=2, max_context_tokens=8000, workers=1)
    (r,), _ = play(tok, env, {turn_seed(5, k + 1): t for k, t in enumerate(turns)}, [5], limits=limits)
    assert episode_errors([r]) == [] and r.reward == 0.0 and r.finish_reason == "turns"
    assert r.info["stop"] == "prompt_too_long"

    # single-turn, as verifiers' SingleTurnEnv is used for math and QA
    async def exact(completion, answer, **kwargs) -> float:
        return float(answer in str(completion[-1]["content"]))

    rows = Dataset.from_list([{"question": "2+2?", "answer": "4"}] * 4)
    single = Verifiers(env=vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[exact])))
    script = {turn_seed(s, 1): [*ids(tok, d), eos] for s, d in ((1, "4"), (2, "5"))}
    rollouts, _ = play(tok, single, script, [1, 2])
    assert [(r.reward, r.correct, r.info["turns"]) for r in rollouts] == [(1.0, True, 1), (0.0, False, 1)]

    # tools: verifiers runs the call keelrl parsed from the model's text and sends the result back
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    tools = Verifiers(env=vf.ToolEnv(dataset=Dataset.from_list([{"question": "2+3?", "answer": "5"}] * 4),
                                     tools=[add], rubric=vf.Rubric(funcs=[exact]), max_turns=3))  # fmt: skip
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    script = {turn_seed(5, 1): [*ids(tok, *call), eos], turn_seed(5, 2): [*ids(tok, "5"), eos]}
    (r,), sampler = play(tok, tools, script, [5], fmt=TemplateFormat(tok, tools.tools), max_new=80)
    assert episode_errors([r]) == [] and r.correct and [t["role"] for t in r.info["transcript"]] == [
        "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert "<|im_start|>tool\n5<|im_end|>" in tok.decode(sampler.calls[1][0])


def _guesses(i: int) -> str:
    import random

    rng = random.Random(i)
    a, b, hint = rng.randint(1, 4), rng.randint(1, 4), rng.choice(["higher", "lower"])
    return f"User: Guess my number from 1 to 4.\nAssistant:{a}<eos>\nUser: {hint}\nAssistant:{b}"


COMMON = [
    'task.template="compact"', "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=8",
    "episode.max_turns=3", "episode.max_context_tokens=200", "train.steps=2", "train.micro_batch_size=8",
    "train.threads=1", "eval.at_start=false", "eval.every_steps=0", "checkpoint.every_steps=0",
    "log.progress=false", "supervisor.enabled=false",
]  # fmt: skip


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_verifiers_environment_trains(tmp_path, vf_guess) -> None:
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=256), len(tok), 0
    )
    pretrain(model, tok, _guesses, steps=60, batch_size=32, lr=1e-2, seed=0)
    save_hf_dir(model, tok, tmp_path / "model")
    overrides = [
        f'model.path="{tmp_path / "model"}"', 'task.name="verifiers_env:Verifiers"',
        f'task.params={{env_id = "{vf_guess}"}}', *COMMON,
    ]  # fmt: skip
    summary = train(load_config("configs/smoke.toml", overrides), tmp_path / "run")
    metrics = _metrics(tmp_path / "run")
    assert summary["state"] == "finished" and [m["step"] for m in metrics] == [1, 2]
    assert max(m["episode/turns"] for m in metrics) > 1.2 and max(m["reward/mean"] for m in metrics) > 0
    assert all(m.get("episode/error_frac", 0) == 0 for m in metrics)


def test_textarena_two_player_game_against_the_policy_seat(tok) -> None:
    pytest.importorskip("textarena")
    from textarena_env import TextArena

    eos = tok.eos_token_id

    def move(cell: str) -> list[int]:
        return [*ids(tok, "[", cell, "]"), eos]

    # episode 5: the model takes 4, 1, 7 (a column), the seat 0 and 8: the model wins
    # episode 6: the model takes 0, 1, 5, the seat 4, 2, 6 (a diagonal): the seat wins
    script = {turn_seed(5, k + 1): move(c) for k, c in enumerate("417")}
    script |= {stable_hash("seat", 5, k + 1): move(c) for k, c in enumerate("08")}
    script |= {turn_seed(6, k + 1): move(c) for k, c in enumerate("015")}
    script |= {stable_hash("seat", 6, k + 1): move(c) for k, c in enumerate("426")}
    env = TextArena()
    (win, loss), sampler = play(tok, env, script, [5, 6])
    assert (win.reward, win.correct, loss.reward, loss.correct) == (1.0, True, -1.0, False)
    assert "Player 0 has won" in win.info["outcome"] and "Player 1 has won" in loss.info["outcome"]
    seat = [c[0] for c in sampler.calls if c[1] == stable_hash("seat", 5, 1)]
    assert len(seat) == 1 and "You are Player 1" in tok.decode(seat[0])  # the seat's own view of the game
    mask = torch.tensor(win.trainable, dtype=torch.bool)
    assert torch.tensor(win.completion_ids)[mask].tolist() == [t for c in "417" for t in move(c)]
    assert "Player 1 placed their symbol (X) in cell 0" in tok.decode(
        torch.tensor(win.completion_ids)[~mask].tolist()
    )


def test_textarena_games_are_reproducible_under_threads(tok) -> None:
    """GuessTheNumber draws its secret from the module-level `random` (seeded by TextArena's State): each
    episode gets its own stream, so a batch of concurrent episodes equals each played alone."""
    pytest.importorskip("textarena")
    from textarena_env import TextArena

    eos = tok.eos_token_id
    env = TextArena(game="GuessTheNumber-v0", players=1)
    seeds = list(range(30, 36))
    script = {turn_seed(s, k): [*ids(tok, "[", *str(k + 9), "]"), eos] for s in seeds for k in range(1, 7)}
    together, _ = play(tok, env, script, seeds)
    alone = [
        play(tok, TextArena(game="GuessTheNumber-v0", players=1), script, [s], problems=[i])[0][0]
        for i, s in enumerate(seeds)
    ]
    hints = [[t["content"] for t in r.info["transcript"] if t["role"] == "user"] for r in together]
    assert hints == [[t["content"] for t in r.info["transcript"] if t["role"] == "user"] for r in alone]
    assert len({tuple(h) for h in hints}) > 1  # different problems, different secrets


def _solve(board: str) -> list[str]:
    """The shortest path on a maze board (breadth first), as JSON actions."""
    rows = board.splitlines()
    find = {ch: (r, c) for r, row in enumerate(rows) for c, ch in enumerate(row)}
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    todo, came = collections.deque([find["@"]]), {find["@"]: None}
    while todo:
        r, c = todo.popleft()
        for name, (dr, dc) in steps.items():
            nxt = (r + dr, c + dc)
            if (
                0 <= nxt[0] < len(rows)
                and 0 <= nxt[1] < len(rows[0])
                and rows[nxt[0]][nxt[1]] != "#"
                and nxt not in came
            ):
                came[nxt] = ((r, c), name)
                todo.append(nxt)
    path, at = [], find["G"]
    while came[at] is not None:
        at, name = came[at]
        path.append(json.dumps({"move": name}))
    return path[::-1]


def test_openenv_style_maze_typed_actions_async_steps_and_step_rewards(tok) -> None:
    from openenv_env import OpenEnv

    env = OpenEnv()
    problem = env.problem("train", 3)
    board = env.reset(problem, 0).messages[0]["content"].split("\n", 1)[1]
    path = _solve(board)
    score, state, _ = play_text(env, problem, path)
    n = len(path)
    assert score.correct and score.reward == pytest.approx(
        1.0 - 0.05 * (n - 1)
    )  # sum: n-1 moves, then the goal
    score, _, _ = play_text(env, problem, path, step_rewards="discounted", discount=0.5)
    assert score.reward == pytest.approx(sum(-0.05 * 0.5**t for t in range(n - 1)) + 0.5 ** (n - 1))
    score, _, _ = play_text(env, problem, path, step_rewards="mean")
    assert score.reward == pytest.approx((1.0 - 0.05 * (n - 1)) / n)
    # a turn that is not the typed action is answered with what is wrong and costs nothing; a bump costs 0.1
    score, state, results = play_text(env, problem, ["go right", '{"move": "sideways"}', *path])
    assert score.correct and [i.get("action_errors", 0) for i in state.infos[:2]] == [1, 1]
    assert "move (up|down|left|right)" in results[0].messages[0]["content"]
    # through keelrl's loop: the same numbers, and each episode has its own maze instance
    eos = tok.eos_token_id
    script = {turn_seed(9, k + 1): [*ids(tok, *p), eos] for k, p in enumerate(path)}
    limits = EpisodeConfig(max_turns=12, max_context_tokens=8000, workers=2)
    (r,), _ = play(tok, env, script, [9], max_new=32, limits=limits, problems=[3])
    assert r.correct and r.reward == pytest.approx(1.0 - 0.05 * (n - 1)) and r.info["turns"] == n


MAZE = {"env_args": {"size": 3}, "intro": "Go to G."}  # short episodes: a quick pretraining


def _maze_turns(i: int) -> str:
    """Two random moves in a maze, as the plain format writes the episode."""
    import random

    from openenv_env import OpenEnv

    rng, env = random.Random(i), OpenEnv(**MAZE)
    moves = [json.dumps({"move": rng.choice(["up", "down", "left", "right"])}) for _ in range(2)]
    _, state, results = play_text(env, env.problem("train", rng.randrange(64)), moves)
    text = f"User: {state.messages[0]['content']}\nAssistant:{moves[0]}<eos>"
    return text + (
        f"\nUser: {results[0].messages[0]['content']}\nAssistant:{moves[1]}" if results[0].messages else ""
    )


def test_the_maze_trains_with_discounted_step_rewards(tmp_path) -> None:
    """A tiny model pretrained to move at random, trained through the trainer on the maze loaded by import path:
    multi-turn episodes, typed actions, async steps, step rewards discounted."""
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=256)
    model = build_tiny_model(cfg, len(tok), 0)
    pretrain(model, tok, _maze_turns, steps=60, batch_size=16, lr=1e-2, seed=0)
    save_hf_dir(model, tok, tmp_path / "model")
    overrides = [
        f'model.path="{tmp_path / "model"}"', 'task.name="openenv_env:OpenEnv"', *COMMON,
        'task.params={env_args = {size = 3}, intro = "Go to G."}',
        "episode.step_rewards=discounted", "episode.discount=0.9", "rollout.max_new_tokens=24",
        "episode.max_turns=4", "episode.max_context_tokens=250",
    ]  # fmt: skip
    summary = train(load_config("configs/smoke.toml", overrides), tmp_path / "run")
    metrics = _metrics(tmp_path / "run")
    records = [
        json.loads(line) for line in __import__("gzip").open(tmp_path / "run" / "rollouts.jsonl.gz", "rt")
    ]
    assert summary["state"] == "finished" and [m["step"] for m in metrics] == [1, 2]
    assert all(m["episode/turns"] > 1.5 for m in metrics) and any(m["reward/std"] > 0 for m in metrics)
    assert all(0 <= m["episode/action_errors"] <= m["episode/turns"] for m in metrics)
    for r in records:  # each episode's reward is its step rewards, discounted (no finish: the maze has none)
        rewards = r["info"]["step_rewards"]
        assert r["reward"] == pytest.approx(sum(0.9**t * x for t, x in enumerate(rewards)))
