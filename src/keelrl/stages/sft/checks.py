"""The supervised stages' config checks (sft; rm adds its own, stages/rm/stage.py): data to train on, examples
that split over the ranks, and no RL-only machinery that the stage would silently ignore."""

from __future__ import annotations

from keelrl.config import Config


def check_data(cfg: Config) -> None:
    if not cfg.data.path:
        raise ValueError(
            f"train.stage = '{cfg.train.stage}' needs data.path (a JSONL/Parquet/Arrow file, or --set data.path=FILE)"
        )


def check_supervised(cfg: Config, world_size: int, also_refused: dict[str, bool] | None = None) -> None:
    """Raise ValueError when `cfg` cannot run as a supervised stage; `also_refused`: settings the calling stage
    refuses beyond SFT's (name -> set?)."""
    d, stage = cfg.data, cfg.train.stage
    check_data(cfg)
    if d.batch_size % world_size:
        raise ValueError(
            f"data.batch_size={d.batch_size} examples cannot be split evenly over {world_size} ranks "
            f"({d.batch_size} / {world_size} = {d.batch_size / world_size:g})."
        )
    refused = {
        "rollout.max_staleness": cfg.rollout.max_staleness != 0,
        "algo.kl_coef": cfg.algo.kl_coef > 0,
        "algo.advantage = 'gae'": cfg.algo.advantage == "gae",
        "reward.model": bool(cfg.reward.model),
        **(also_refused or {}),
    }
    if bad := [k for k, on in refused.items() if on]:
        raise ValueError(
            f"train.stage = '{stage}' does not use {', '.join(bad)}; remove them from the {stage.upper()} config"
        )
