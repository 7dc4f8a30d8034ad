"""OpenEnv-style environments as keelrl environments, and a maze written in OpenEnv's style.

    keelrl train configs/smoke.toml --set task.name=openenv_env:OpenEnv --set episode.step_rewards=discounted

(this file on PYTHONPATH). OpenEnv's environments are classes with `reset(seed, episode_id) -> Observation`,
`step(action) -> Observation`, `async step_async(action)` and a `state` property; actions and observations are
typed pydantic models, and an observation carries `done`, `reward` (this step's) and `metadata`. The `openenv`
package is not installed here (it brings gradio and a web stack with it), so `Maze` below is a local stand-in
that follows that interface; the adapter only uses the interface, so OpenEnv's own environment classes plug in
by import path (`env_class`, `action_class`).

The adapter: one environment instance per episode (made in `reset`, kept in `state.scratch`: what OpenEnv's
server does per session), the model's turn parsed as the typed action (`action`: a JSON object; a turn that does
not parse is answered with what is wrong, and the episode goes on), `step_async` awaited on keelrl's event loop,
and each step's reward a step reward, reduced by the run's `episode.step_rewards` (sum / mean / discounted).
"""

from __future__ import annotations

import importlib
import random
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from keelrl.tasks.env import EpisodeState, ResetResult, StepResult


class MazeAction(BaseModel):  # OpenEnv: an Action subclass
    move: Literal["up", "down", "left", "right"]


class MazeObservation(BaseModel):  # OpenEnv: an Observation subclass (done, reward, metadata)
    board: str
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Maze:
    """A size x size grid with walls: from the top-left corner to the bottom-right one. Each move costs 0.05 and
    a bump into a wall 0.1; the goal pays 1."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    STEPS: ClassVar[dict[str, tuple[int, int]]] = {
        "up": (-1, 0),
        "down": (1, 0),
        "left": (0, -1),
        "right": (0, 1),
    }

    def __init__(self, size: int = 4) -> None:
        self.size, self.walls, self.pos, self.steps = size, set(), (0, 0), 0

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> MazeObservation:
        rng, n, path = random.Random(seed), self.size, [(0, 0)]
        for move in rng.sample(["down", "right"] * (n - 1), 2 * (n - 1)):  # a random open way to the goal
            dr, dc = self.STEPS[move]
            path.append((path[-1][0] + dr, path[-1][1] + dc))
        self.walls = set(rng.sample([(r, c) for r in range(n) for c in range(n) if (r, c) not in path], n))
        self.pos, self.steps = (0, 0), 0
        return MazeObservation(board=self._board())

    def step(self, action: MazeAction) -> MazeObservation:
        dr, dc = self.STEPS[action.move]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        self.steps += 1
        if not (0 <= r < self.size and 0 <= c < self.size) or (r, c) in self.walls:
            return MazeObservation(board=self._board(), reward=-0.1, metadata={"bumped": True})
        self.pos = (r, c)
        won = self.pos == (self.size - 1, self.size - 1)
        return MazeObservation(
            board=self._board(), done=won, reward=1.0 if won else -0.05, metadata={"success": won}
        )

    async def step_async(self, action: MazeAction) -> MazeObservation:
        return self.step(action)

    @property
    def state(self) -> dict[str, Any]:
        return {"step_count": self.steps, "position": self.pos}

    def _board(self) -> str:
        mark = {self.pos: "@", (self.size - 1, self.size - 1): "G", **dict.fromkeys(self.walls, "#")}
        return "\n".join("".join(mark.get((r, c), ".") for c in range(self.size)) for r in range(self.size))


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class OpenEnv:
    name = "openenv"

    def __init__(
        self, seed: int = 0, env_class: str = "openenv_env:Maze", action_class: str = "openenv_env:MazeAction",
        env_args: dict[str, Any] | None = None, intro: str = 'Reach G. Answer with {"move": "up|down|left|right"}.',
    ) -> None:  # fmt: skip
        self.env_class, self.action = (
            _load(env_class),
            _load(action_class),
        )  # `action`: the turn parsed into it
        self.seed, self.env_args, self.intro = seed, env_args or {}, intro

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return {"seed": 2 * index + (split == "test") + 1000 * self.seed}  # train and test never share a maze

    def difficulty(self, problem: dict[str, Any]) -> str:
        return "all"

    def reset(self, problem: dict[str, Any], seed: int) -> ResetResult:
        env = self.env_class(**self.env_args)
        observation = env.reset(seed=problem["seed"], episode_id=f"{problem['seed']}-{seed}")
        return ResetResult([{"role": "user", "content": f"{self.intro}\n{_show(observation)}"}], env)

    async def step(self, state: EpisodeState, action: BaseModel) -> StepResult:
        observation = await state.scratch.step_async(action)
        success = bool(observation.metadata.get("success", False))
        reply = [] if observation.done else [{"role": "user", "content": _show(observation)}]
        return StepResult(reply, float(observation.reward or 0.0), observation.done, {"correct": success})


def _show(observation: BaseModel) -> str:
    fields = observation.model_dump(exclude={"done", "reward", "metadata"})
    return "\n".join(str(v) if len(fields) == 1 else f"{k}: {v}" for k, v in fields.items())
