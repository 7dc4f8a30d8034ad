"""A stage: what one step of the training loop does, as a plugin. The loop (loop/trainer.py) and setup
(loop/setup.py) are the same for every stage; they ask the run's `Stage` (keelrl.stages.STAGES[train.stage]) for
everything that differs, and never branch on the stage's name.

Required: `name`, `step(run, state) -> metrics` (one step, the step counter advanced), `eval(run, state) ->
metrics` (held-out metrics, named `eval/...`). Optional hooks, each None when the stage has nothing to add:
- head: the policy's head, "lm" (a language model) or "reward" (a scalar head: reward models);
- check(cfg, world_size): raise ValueError when the config cannot run as this stage (batch arithmetic, settings
  the stage would silently ignore); run on `keelrl train` before anything starts and again in setup once the world
  size is known;
- check_inputs(cfg): what the stage reads must be there (a reward model's pairs), before anything starts;
- load_data(cfg, tokenizer, task, template): what the stage trains on when it does not sample it
  (`Run.stage_data`);
- problem_source(cfg, task): where problems come from instead of the curriculum (self-play's buffer);
- build_roles(cfg, world, build_optimizer): a second policy for another role (`TrainState.proposer`);
  start_roles(run, state): its sampler, once the run exists; sync_roles(run, state): its sampler after a rollback
  restored its weights;
- finish(run, state, final_eval): artefacts beside the exported final/ weights (a reward model's card).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from keelrl.config import Config
from keelrl.run.distributed import World
from keelrl.run.run import Run
from keelrl.run.state import RolePolicy, TrainState

StepFn = Callable[[Run, TrainState], dict[str, float]]


@dataclass(frozen=True)
class Stage:
    name: str
    step: StepFn
    eval: StepFn
    head: Literal["lm", "reward"] = "lm"
    check: Callable[[Config, int], None] | None = None
    check_inputs: Callable[[Config], None] | None = None
    load_data: Callable[[Config, Any, Any, str], Any] | None = None
    problem_source: Callable[[Config, Any], Any] | None = None
    build_roles: Callable[[Config, World, Callable[..., Any]], RolePolicy | None] | None = None
    start_roles: Callable[[Run, TrainState], None] | None = None
    sync_roles: Callable[[Run, TrainState], None] | None = None
    finish: Callable[[Run, TrainState, dict[str, float]], None] | None = None
