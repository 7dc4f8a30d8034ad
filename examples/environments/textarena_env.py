"""TextArena games as keelrl environments: one-player puzzles and two-player games against a second seat.

    pip install textarena==0.7.4
    keelrl train configs/smoke.toml --set task.name=textarena_env:TextArena --set 'task.params={game = "TicTacToe-v0"}'

(this file on PYTHONPATH). The model is player 0 (the first to move). In a game of several players the other
seats are the policy itself (`state.policy`: self-play, those moves are never trained on), each with its own
view of the game. Each episode has its own game object (from `reset`, in `state.scratch`); TextArena's games
draw from the module-level `random`, so `global_random = True` gives each episode its own stream (keelrl swaps
it in around every call), and episodes are reproducible whatever runs beside them. The reward is TextArena's
for player 0 (1 win, 0 draw, -1 loss; 0 for a game the episode's budget cut short); correct = a win.
"""

from __future__ import annotations

from typing import Any

import textarena as ta

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import Score
from keelrl.tasks.env import EpisodeState, ResetResult, StepResult


def _text(observation: list[tuple[int, str, Any]]) -> str:
    return "\n".join(
        f"[{'GAME' if sender == ta.GAME_ID else f'Player {sender}'}] {m}" for sender, m, _ in observation
    )


class TextArena:
    name = "textarena"
    global_random = True  # TextArena's games draw from the module-level `random`

    def __init__(self, seed: int = 0, game: str = "TicTacToe-v0", players: int = 2) -> None:
        self.seed, self.game, self.players = seed, game, players

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return {"game": self.game, "game_seed": stable_hash("textarena", self.seed, split, index) % 2**31}

    def difficulty(self, problem: dict[str, Any]) -> str:
        return problem["game"]

    def reset(self, problem: dict[str, Any], seed: int) -> ResetResult:
        game = ta.make(f"{problem['game']}-raw")  # no wrappers: each observation is what is new
        game.reset(num_players=self.players, seed=problem["game_seed"])
        player, observation = game.get_observation()
        assert player == 0, "the model moves first"
        seats = {p: [] for p in range(1, self.players)}  # each other seat's own conversation
        return ResetResult([{"role": "user", "content": _text(observation)}], {"game": game, "seats": seats})

    def step(self, state: EpisodeState, action: str) -> StepResult:
        game, seats = state.scratch["game"], state.scratch["seats"]
        done, _ = game.step(action)
        player, observation = game.get_observation()
        while not done and player != 0:  # the other seats move until it is the model's turn again
            seats[player].append({"role": "user", "content": _text(observation)})
            reply = state.policy.chat.completions.create(messages=seats[player]).choices[0].message.content
            seats[player].append({"role": "assistant", "content": reply})
            done, _ = game.step(reply)
            player, observation = game.get_observation()
        return StepResult([] if done else [{"role": "user", "content": _text(observation)}], done=done)

    def finish(self, state: EpisodeState) -> Score:
        game = state.scratch["game"]
        if not game.state.done:
            return Score(0.0, False, {"outcome": "unfinished"})
        rewards, info = game.close()
        return Score(float(rewards[0]), rewards[0] > 0, {"outcome": info[0].get("reason", "")})
