"""Any `verifiers` environment (single- or multi-turn), trained by keelrl unchanged.

    pip install verifiers==0.3.1
    keelrl train configs/smoke.toml --set task.name=verifiers_env:Verifiers --set 'task.params={env_id = "my_env"}'

(this file on PYTHONPATH; `env_id` is what `vf.load_environment` loads: a module with `load_environment()`).
The rows of the environment's dataset are the problems (its eval dataset for the test split). keelrl plays each
episode by calling the environment's own `run_rollout` with an OpenAI SDK client that keelrl answers in process
(`client.openai()`): verifiers renders nothing and samples nothing; keelrl renders each call's messages with the
run's chat format, samples the turn, keeps its tokens, and refuses an environment that rewrites earlier turns.
The rubric's reward is the episode's reward; the episode counts as correct when it reaches `correct_at`.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from verifiers.clients import OpenAIChatCompletionsClient

from keelrl.tasks.base import Score
from keelrl.tasks.tools import tool


class Verifiers:
    def __init__(
        self, seed: int = 0, env_id: str = "", correct_at: float = 1.0, env: Any = None, **env_args: Any
    ):
        self.env = env if env is not None else vf.load_environment(env_id, **env_args)
        self.name, self.correct_at = f"verifiers:{env_id or type(self.env).__name__}", correct_at
        self.tools = [
            tool(fn) for fn in getattr(self.env, "tools", None) or []
        ]  # a ToolEnv's, shown to the model

    def problem(self, split: str, index: int) -> dict[str, Any]:
        rows = self.env.get_eval_dataset() if split == "test" else self.env.get_dataset()
        row = rows[index % len(rows)]
        return {k: row[k] for k in ("prompt", "answer", "info", "task", "example_id") if k in row}

    def difficulty(self, problem: dict[str, Any]) -> str:
        return str(problem.get("task") or "all")

    async def rollout(self, client: Any, problem: dict[str, Any], seed: int) -> Score:
        out = await self.env.run_rollout(problem, OpenAIChatCompletionsClient(client.openai()), "policy", {})
        reward, error = float(out.get("reward") or 0.0), out.get("error")
        if error and "keelrl ended this episode" not in str(error):  # its own error, not keelrl's budget
            raise RuntimeError(f"verifiers rollout failed: {error}")
        info = {"metrics": out.get("metrics") or {}, "stop": out.get("stop_condition")}
        return Score(reward, reward >= self.correct_at, info)
