"""Stages: what one step of the training loop does, one folder each (rl/, sft/, rm/, selfplay/), each described by
a `Stage` (base.py) in its stage.py and registered here by name. The loop asks `STAGES[cfg.train.stage]` and never
branches on the name; adding a stage is its folder plus one line in `STAGES`."""

from __future__ import annotations

from keelrl.config import Config, ConfigError
from keelrl.config.checks import check_inputs
from keelrl.stages.base import Stage
from keelrl.stages.rl.stage import RL
from keelrl.stages.rm.stage import RM
from keelrl.stages.selfplay.stage import SELFPLAY
from keelrl.stages.sft.stage import SFT

STAGES: dict[str, Stage] = {
    "rl": RL,
    "sft": SFT,
    "rm": RM,
    "selfplay": SELFPLAY,
}


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise ConfigError(
            f"train.stage = {name!r} is not a stage; the stages are {', '.join(sorted(STAGES))}"
        )
    return STAGES[name]


def check_stage(cfg: Config, world_size: int = 1) -> Stage:
    """The config's stage, after its checks (a user error, exit 2, saying what does not fit)."""
    stage = get_stage(cfg.train.stage)
    if stage.check is not None:
        try:
            stage.check(cfg, world_size)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return stage


def check_run(cfg: Config) -> None:
    """Everything a run can be refused for before it starts anything (`keelrl train` runs this before the
    supervisor, a ladder for every point): the stage's config checks, the task and model paths
    (config/checks.py), the stage's inputs."""
    stage = check_stage(cfg)
    check_inputs(cfg)
    if stage.check_inputs is not None:
        stage.check_inputs(cfg)


__all__ = ["STAGES", "Stage", "check_run", "check_stage", "get_stage"]
