"""The SFT stage (`train.stage = "sft"`, `keelrl sft`)."""

from __future__ import annotations

from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.stages.base import Stage
from keelrl.stages.rl.step import task_eval
from keelrl.stages.sft.checks import check_supervised
from keelrl.stages.sft.step import held_out_loss, load_sft_data, sft_step


def sft_eval(run: Run, state: TrainState) -> dict[str, float]:
    """The held-out loss, and the task's accuracy unless data.task_eval is off."""
    held_out = {f"eval/{k}": v for k, v in held_out_loss(run, state).items()}
    return held_out if not run.cfg.data.task_eval else {**held_out, **task_eval(run, state)}


SFT = Stage(name="sft", step=sft_step, eval=sft_eval, check=check_supervised, load_data=load_sft_data)
