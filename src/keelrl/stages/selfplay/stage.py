"""The self-play stage (`train.stage = "selfplay"`, [selfplay])."""

from __future__ import annotations

from typing import Any

from keelrl.config import Config
from keelrl.stages.base import Stage
from keelrl.stages.rl.step import task_eval
from keelrl.stages.selfplay.checks import check_selfplay
from keelrl.stages.selfplay.roles import build_proposer, start_proposer, sync_proposer
from keelrl.stages.selfplay.source import SelfPlaySource
from keelrl.stages.selfplay.step import selfplay_step


def proposals(cfg: Config, task: Any) -> SelfPlaySource:
    """Self-play's problems come from its buffer of proposals."""
    return SelfPlaySource(cfg.selfplay.buffer_capacity)


SELFPLAY = Stage(
    name="selfplay",
    step=selfplay_step,
    eval=task_eval,
    check=check_selfplay,
    problem_source=proposals,
    build_roles=build_proposer,
    start_roles=start_proposer,
    sync_roles=sync_proposer,
)
