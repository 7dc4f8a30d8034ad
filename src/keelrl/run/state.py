"""`TrainState`: everything a restart needs, in one object. If it is not here, it does not survive a crash.
Sampling randomness derives from (train.seed, step, row) and problem choice from the data cursor and the
curriculum state, so restoring this object restores the run exactly; the global RNGs (python, numpy,
torch) are captured too, for any code that draws from them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from keelrl.models.weights import load_untied, untied_state_dict


@dataclass
class RolePolicy:
    """A policy trained beside `TrainState.policy` for another role (self-play's proposer under
    `selfplay.policies = "two"`): its own weights, optimizer and schedule, saved in trainer_state.pt."""

    model: PreTrainedModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    version: int = 0  # its policy version: one per step, as TrainState.policy_version

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": untied_state_dict(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        device = next(self.model.parameters()).device
        load_untied(self.model, {k: v.to(device) for k, v in saved["weights"].items()})
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.version = int(saved["version"])


# TrainState's JSON fields, in state.json
COUNTERS = ("step", "policy_version", "best_metric", "best_step", "last_eval", "guards", "curriculum")


@dataclass
class TrainState:
    step: int  # RL steps completed
    policy: PreTrainedModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ref_policy: PreTrainedModel | None = None  # frozen copy of the initial policy; rebuilt, not saved
    # the value model and its optimizer (algo.advantage = "gae"); saved in trainer_state.pt
    critic: torch.nn.Module | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    policy_version: int = 0  # increments with every optimizer update of the policy
    best_metric: float | None = None  # best value of checkpoint.best_metric so far
    best_step: int | None = None
    last_eval: dict[str, float] = field(default_factory=dict)  # metrics of the newest held-out eval
    guards: dict[str, Any] = field(default_factory=dict)  # guard/divergence-rule state
    curriculum: dict[str, Any] = field(default_factory=dict)  # problem source state: data cursor, pass rates
    # rollout.max_staleness >= 1: per rank, the batches submitted ahead, sampled (rollout/pipeline.py); saved in
    # trainer_state.pt
    pipeline: list[list[dict[str, Any]]] = field(default_factory=list)
    # model.lora: the base model the adapters sit on, {"path", "weights_sha256"} (keelrl/models/lora.py); rebuilt at
    # setup, recorded in every checkpoint, and a resume onto another base is refused
    lora_base: dict[str, str] | None = None
    # selfplay.policies = "two": the proposer, a policy of its own (stages/selfplay/roles.py); the solver is `policy`
    proposer: RolePolicy | None = None

    def counters(self) -> dict[str, Any]:
        """The JSON part of the state (the tensors are saved separately)."""
        return {k: getattr(self, k) for k in COUNTERS}

    def load_counters(self, data: dict[str, Any]) -> None:
        self.step = int(data["step"])
        self.policy_version = int(data["policy_version"])
        self.best_metric = data.get("best_metric")
        self.best_step = data.get("best_step")
        self.last_eval = dict(data.get("last_eval") or {})
        self.guards = dict(data.get("guards") or {})
        self.curriculum = dict(data.get("curriculum") or {})


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
