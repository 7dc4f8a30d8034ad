"""Checks of what a run names outside its config (`keelrl train` runs them before the supervisor, a ladder for
every point): the task builds and has both splits, local model paths exist. A stage adds its own
(`Stage.check_inputs`, keelrl.stages)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from keelrl.config.load import ConfigError

if TYPE_CHECKING:
    from keelrl.config.root import Config


def local_path(path: str) -> bool:
    """Whether a model name can only be a local path: it starts with '.', '/' or '~', ends in .gguf, or has
    more slashes than a hub id (org/name)."""
    return path.startswith((".", "/", "~")) or path.endswith(".gguf") or path.count("/") > 1


def check_inputs(cfg: Config) -> None:
    """What a run names must be there before anything starts (`keelrl train` runs this before the supervisor, a
    ladder for every point): the task builds with task.params, model.path and reward.model exist when they are
    local paths (a stage checks its own data: `Stage.check_inputs`). Raises a user error (exit 2)."""
    from keelrl.tasks import TaskError, get_task

    task = get_task(cfg.task.name, cfg.task.seed, cfg.sandbox, **cfg.task.params)
    for split in ("train", "test"):  # a split with nothing in it fails here, not at the first eval
        try:
            task.problem(split, 0)
        except Exception as err:  # whatever the task raises, drawing it again would raise it again
            raise TaskError(f"task.name = {cfg.task.name!r} has no {split} problem: {err}") from None
    for setting, path in (("model.path", cfg.model.path), ("reward.model", cfg.reward.model)):
        if path and local_path(path) and not Path(path).expanduser().exists():
            raise ConfigError(
                f"{setting} = {path!r} does not exist. Give an HF model directory, a keelrl checkpoint (RUN/final, "
                "RUN/checkpoints/latest), a .gguf file, a hub id (org/name), 'smollm2' or 'tiny'."
            )
