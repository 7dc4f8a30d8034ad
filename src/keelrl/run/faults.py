"""Chaos drills (`[faults]`, all off by default): inject the failures a long run meets, to rehearse recovery.
Every fault fires at most once per run: it is written to events.jsonl (kind "fault") before firing, and a
restarted worker reads the events, so the restart a fault causes does not trigger it again.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from keelrl.config import FaultsConfig
from keelrl.core.seeds import stable_hash
from keelrl.monitor.run_dir import RunDir
from keelrl.run import checkpoint as ckpt
from keelrl.tasks.base import Score


class InjectedFault(RuntimeError):
    """Raised by a drill; a real run never raises it."""


class FaultInjector:
    def __init__(self, cfg: FaultsConfig, run_dir: RunDir | None, seed: int = 0) -> None:
        """`run_dir` None (ranks other than 0) means: never fire."""
        self.cfg = cfg if run_dir is not None else FaultsConfig()
        self.run_dir = run_dir
        self.seed = seed
        self.fired = (
            {e.get("fault") for e in run_dir.events() if e.get("kind") == "fault"} if run_dir else set()
        )

    def _fire(self, name: str, step: int, **fields: Any) -> bool:
        """Record and return True the first time `name` fires in this run; False ever after."""
        if name in self.fired:
            return False
        self.fired.add(name)
        assert self.run_dir is not None
        self.run_dir.event("fault", step, fault=name, injected=True, **fields)
        return True

    def _due(self, name: str, step: int) -> bool:
        """The drill `name` (a field holding a step, 0 = off) is set for `step` and fires now."""
        return 0 < getattr(self.cfg, name) == step and self._fire(name, step)

    def after_step(self, step: int) -> None:
        if self._due("crash_at_step", step):
            raise InjectedFault(f"injected fault: crash_at_step={step}")
        if self._due("hang_at_step", step):
            while True:  # no heartbeats from here on: the supervisor must notice
                time.sleep(3600)

    def weight_sync_drill(self, step: int) -> str | None:
        """The weight push after step `step`'s update: "skip" it, keep the engine's "stale_prefix_cache", or
        None (a real push). The weight-sync check must catch both drills."""
        if self._due("skip_weight_sync_at_step", step):
            return "skip"
        return "stale_prefix_cache" if self._due("stale_prefix_cache_at_step", step) else None

    def before_sampling(self, step: int, sampler: object) -> None:
        """kill_engine_at_step: SIGKILL the sampling engine's process as step `step` starts sampling. The pid is
        read only then: a Ray pool of engines answers it with a round trip to its actors."""
        if not 0 < self.cfg.kill_engine_at_step == step:
            return
        pid = getattr(sampler, "engine_pid", None)
        if pid and self._fire("kill_engine_at_step", step, pid=pid):
            os.kill(pid, signal.SIGKILL)

    def save_forced(self, step: int) -> bool:
        """True when a drill needs a checkpoint at this step even if the interval does not call for one."""
        return 0 < self.cfg.kill_during_save_at_step == step and "kill_during_save_at_step" not in self.fired

    def before_save(self, step: int) -> Callable[[str], None] | None:
        """The hook for this step's checkpoint write (called after each file), or None: a kill after the
        weights, before the manifest (kill_during_save_at_step), or a full disk at the trainer state."""

        def at_trainer_state(act: Callable[[], None]) -> Callable[[str], None]:
            return lambda fname: act() if fname == ckpt.TRAINER_STATE else None

        if self._due("kill_during_save_at_step", step):
            return at_trainer_state(lambda: os.kill(os.getpid(), signal.SIGKILL))
        if self._due("disk_full_at_step", step):

            def full() -> None:
                raise OSError(errno.ENOSPC, "No space left on device (injected fault)")

            return at_trainer_state(full)
        return None

    def after_save(self, path: Path, step: int) -> None:
        if (
            self.cfg.corrupt_latest_checkpoint
            and step > 0
            and self._fire("corrupt_latest_checkpoint", step, checkpoint=path.name)
        ):
            weights = path / ckpt.WEIGHTS
            with open(weights, "r+b") as f:
                f.seek(weights.stat().st_size // 2)
                chunk = f.read(64)
                f.seek(-len(chunk), os.SEEK_CUR)
                f.write(bytes(b ^ 0xFF for b in chunk))
            raise InjectedFault(f"injected fault: corrupted {path.name}/{ckpt.WEIGHTS} and crashed")

    def corrupt_gradients(self, step: int, model: torch.nn.Module) -> None:
        """Called after backward, before the optimizer step of RL step `step` (1-based)."""
        if self._due("nan_grad_at_step", step):
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))

    @property
    def wraps_scoring(self) -> bool:
        return bool(self.cfg.reward_error_rate or self.cfg.reward_stall_s)

    def wrap_score(
        self, score: Callable[[dict[str, Any], str], Score], step: int
    ) -> Callable[[dict[str, Any], str], Score]:
        if not self.wraps_scoring:
            return score
        calls = [0]

        def wrapped(problem: dict[str, Any], completion: str) -> Score:
            calls[0] += 1
            if self.cfg.reward_stall_s and self._fire(
                "reward_stall_s", step, seconds=self.cfg.reward_stall_s
            ):
                time.sleep(self.cfg.reward_stall_s)
            rng = random.Random(stable_hash("reward_error", self.seed, step, calls[0]))
            if rng.random() < self.cfg.reward_error_rate:
                raise InjectedFault("injected fault: reward function error")
            return score(problem, completion)

        return wrapped
