"""The [ladder] section: a grid of short runs of the same config, fitted and extrapolated (`keelrl ladder`).
The trainer ignores it; `keelrl ladder CONFIG` reads it (and `--axis`, `--seeds`, `--target` on top)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from keelrl.config.base import Section


class LadderConfig(Section):
    kind: Literal["rl", "pretrain"] = Field(
        "rl",
        description=(
            "'rl': every point is a `keelrl train` run of this config (held-out pass rate against training "
            "compute, ScaleRL's sigmoid); 'pretrain': every point pretrains model.tiny on the demo's corpus "
            "(held-out loss against parameters and tokens, a Chinchilla fit)."
        ),
    )
    axes: dict[str, list[Any]] = Field(
        default_factory=dict,
        description=(
            'Config keys and the values each takes, e.g. {"model.path" = ["a", "b"]}; the ladder runs their '
            "product (--axis KEY=V1,V2 adds one). Model size is the axis whose values change the parameter count."
        ),
    )
    seeds: int = Field(
        3,
        ge=1,
        description="Seeds per grid point (RL: train.seed = 0, 1, ...; pretrain: model init and corpus order).",
    )
    target: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Overrides naming the held-out target (a larger model.path, or a longer train.steps / "
            "ladder.pretrain_steps): predicted from the grid with an interval, then run and compared. {} = none."
        ),
    )
    target_seeds: int = Field(0, ge=0, description="Seeds of the target run (0 = ladder.seeds).")
    warmup_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description=(
            "RL fits leave out eval points at compute <= this fraction of the run's final compute (ScaleRL's "
            "warm-up cut: the first noisy stretch says little about the asymptote)."
        ),
    )
    resamples: int = Field(200, ge=10, description="Bootstrap resamples behind every interval.")
    level: float = Field(0.95, gt=0.0, lt=1.0, description="Coverage of the reported intervals.")
    jobs: int = Field(1, ge=1, description="Runs at a time (each in its own process).")
    threads: int = Field(1, ge=1, description="Torch CPU threads per run (train.threads).")
    pretrain_steps: int = Field(400, ge=1, description="Pretraining steps of a 'pretrain' point.")
    pretrain_batch: int = Field(64, ge=1, description="Corpus lines per pretraining step.")
    pretrain_lr: float = Field(3e-3, gt=0.0, description="Peak learning rate of pretraining (the demo's).")
    heldout_lines: int = Field(
        256, ge=8, description="Held-out corpus lines (test problems) the pretraining loss is measured on."
    )
