"""The RL stage (`train.stage = "rl"`, the default)."""

from keelrl.stages.base import Stage
from keelrl.stages.rl.checks import check_batch_arithmetic
from keelrl.stages.rl.step import task_eval, train_step

RL = Stage(name="rl", step=train_step, eval=task_eval, check=check_batch_arithmetic)
