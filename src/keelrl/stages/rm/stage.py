"""The reward-model stage (`train.stage = "rm"`, `keelrl rm train`): the SFT stage's data order and checks, a
scalar head, the pair loss, held-out pair accuracy, and the card beside final/."""

from __future__ import annotations

from typing import Any

from keelrl.config import Config
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.stages.base import Stage
from keelrl.stages.rm.step import held_out_pairs, load_pairs, rm_step, write_card
from keelrl.stages.sft.checks import check_data, check_supervised
from keelrl.stages.sft.data import read_pairs


def check_rm(cfg: Config, world_size: int) -> None:
    """SFT's checks, a held-out split to judge the model by, nothing that samples, one process, the whole model."""
    d = cfg.data
    check_data(cfg)
    if not d.eval_path and d.eval_fraction == 0:
        raise ValueError(
            "a reward model is judged by its held-out pair accuracy: set data.eval_fraction (e.g. 0.1) or "
            "data.eval_path (held-out pairs)"
        )
    # a reward model samples nothing
    check_supervised(
        cfg, world_size, {"rollout.engine = 'vllm'": cfg.rollout.engine == "vllm", "data.packing": d.packing}
    )
    if world_size > 1 or cfg.model.lora.rank:
        raise ValueError(
            "train.stage = 'rm' (reward-model training) runs in one process and trains the whole model for now: "
            f"this run has {world_size} ranks and model.lora.rank = {cfg.model.lora.rank}"
        )


def check_pairs(cfg: Config) -> None:
    """The preference pairs can train and judge a reward model (read_pairs raises a DataError saying why not)."""
    read_pairs(cfg.data, cfg.task.seed)


def rm_eval(run: Run, state: TrainState) -> dict[str, float]:
    """Held-out pair accuracy (as eval/accuracy), loss and margin."""
    return {f"eval/{k}": v for k, v in held_out_pairs(run, state).items()}


def load_data(cfg: Config, tokenizer: Any, task: Any, template: str) -> Any:
    return load_pairs(cfg, tokenizer)


RM = Stage(
    name="rm",
    step=rm_step,
    eval=rm_eval,
    head="reward",
    check=check_rm,
    check_inputs=check_pairs,
    load_data=load_data,
    finish=write_card,
)
