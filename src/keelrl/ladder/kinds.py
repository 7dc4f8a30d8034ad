"""What one point of a ladder is, by `ladder.kind` (`KINDS`): the command that makes it, whether it is
already made (a ladder started again reuses it), and the record the fits read from its directory.

Compute is estimated, not measured: a forward pass costs 2 FLOPs per parameter per token and a backward pass
4 (Kaplan et al. 2020, the rule ScaleRL and Chinchilla use). The CPU seconds each process used are measured
beside it (`ladder_cost.json`), and the wall time of its last process is in the run's summary."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from keelrl.config import Config
from keelrl.ladder.plan import LadderRun
from keelrl.monitor.run_dir import read_jsonl


class LadderError(RuntimeError):
    """A ladder cannot go on; the message says which run and where its log is."""


class Kind(Protocol):
    def argv(
        self, config: str | None, overrides: list[str], run: LadderRun, run_dir: Path, threads: int
    ) -> list[str]: ...

    def finished(self, run_dir: Path) -> bool: ...

    def record(self, run_dir: Path) -> dict[str, Any]: ...

    def parameters(self, cfg: Config) -> int: ...


def _summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _command(prog: list[str], config: str | None, run_dir: Path, *flags: str, sets: list[str]) -> list[str]:
    """`python -m PROG [CONFIG] --run-dir RUN_DIR FLAGS... --set ITEM...`: the process that makes one point."""
    set_args = [arg for item in sets for arg in ("--set", item)]
    program = [sys.executable, "-m", *prog, *([config] if config else [])]
    return [*program, "--run-dir", str(run_dir), *flags, *set_args]


def rl_flops_per_token_param(cfg: dict[str, Any]) -> float:
    """Training FLOPs per parameter per (prompt + completion) token of an RL step: sampling's forward (2), the
    update's forward and backward per epoch (6 each), the reference model's forward when a KL term needs it
    (2), the recomputed old log-probs when the sampler's are not used (2), and a separate critic (its
    forward + backward per epoch, and its forward for the values). Eval compute is not counted (ScaleRL counts
    training compute). `cfg`: the config as its run directory's config.json holds it (`config_to_dict`)."""
    a = cfg["algo"]
    flops = 2.0 + 6.0 * a["ppo_epochs"]
    if a["kl_coef"] > 0:
        flops += 2.0
    if a["old_logprobs"] == "recompute" or cfg["rollout"]["max_staleness"] >= 1:
        flops += 2.0
    if a["advantage"] == "gae" and a["critic"] == "separate":
        flops += 2.0 + 6.0 * a["ppo_epochs"]
    return flops


@dataclass(frozen=True)
class RLKind:
    """A `keelrl train` run of the ladder's config (supervised: a crash restarts it from its checkpoint).
    Its points are the held-out evals: (cumulative training compute, eval/accuracy)."""

    def argv(
        self, config: str | None, overrides: list[str], run: LadderRun, run_dir: Path, threads: int
    ) -> list[str]:
        own = [f"train.seed={run.seed}", f"train.threads={threads}", "log.progress=false"]
        return _command(["keelrl", "train"], config, run_dir, sets=[*overrides, *run.overrides(), *own])

    def finished(self, run_dir: Path) -> bool:
        return _summary(run_dir).get("state") == "finished"

    def record(self, run_dir: Path) -> dict[str, Any]:
        summary = _summary(run_dir)
        cfg = json.loads((run_dir / "config.json").read_text())  # as the run ran (not re-validated)
        params = int(summary["model"]["parameters"])
        per_token = rl_flops_per_token_param(cfg) * params
        by_step: dict[int, dict[str, Any]] = {}
        for row in read_jsonl(run_dir / "metrics.jsonl"):
            by_step.setdefault(int(row["step"]), {}).update(row)  # a step's train and eval lines
        compute, tokens, points = 0.0, 0.0, []
        for step, row in sorted(by_step.items()):
            tokens += float(row.get("tokens/trained", 0.0))
            compute = per_token * tokens
            if "eval/accuracy" in row:
                points.append((step, compute, float(row["eval/accuracy"])))
        wall = float(summary.get("wall_seconds", 0.0))
        return {
            "parameters": params,
            "flops_per_token_param": rl_flops_per_token_param(cfg),
            "eval_problems": cfg["eval"]["problems"] * cfg["eval"]["samples"],
            "steps": [p[0] for p in points],
            "compute": [p[1] for p in points],
            "accuracy": [p[2] for p in points],
            "tokens_trained": tokens,
            "train_steps": int(summary["steps"]),
            "wall_seconds": wall,
            # one process per run: its GPU seconds are its wall seconds when it trained on a GPU
            "gpu_seconds": wall if summary["model"].get("device") == "cuda" else 0.0,
        }

    def parameters(self, cfg: Config) -> int:
        from keelrl.models.load import count_parameters, load_policy

        return count_parameters(load_policy(cfg.model)[0])


@dataclass(frozen=True)
class PretrainKind:
    """Next-token pretraining of model.tiny on the demo's corpus (`python -m keelrl.ladder.pretrain_run`): the
    function that makes the demo's base models. Its point: held-out loss after D tokens with N parameters,
    compute 6 N D. An interrupted one starts again (a few minutes at most); final/ is the base model."""

    def argv(
        self, config: str | None, overrides: list[str], run: LadderRun, run_dir: Path, threads: int
    ) -> list[str]:
        flags = ("--seed", str(run.seed), "--threads", str(threads))
        return _command(
            ["keelrl.ladder.pretrain_run"], config, run_dir, *flags, sets=[*overrides, *run.overrides()]
        )

    def finished(self, run_dir: Path) -> bool:
        return _summary(run_dir).get("state") == "finished"

    def record(self, run_dir: Path) -> dict[str, Any]:
        s = _summary(run_dir)
        return {
            "parameters": int(s["parameters"]),
            "tokens": int(s["tokens"]),
            "steps": int(s["steps"]),
            "compute": 6.0 * s["parameters"] * s["tokens"],
            "loss": float(s["heldout_loss"]),
            "train_loss": float(s["train_loss"]),
            "wall_seconds": float(s["seconds"]),
        }

    def parameters(self, cfg: Config) -> int:
        from keelrl.ladder.pretrain_run import build_base

        return sum(p.numel() for p in build_base(cfg, 0)[0].parameters())


KINDS: dict[str, Kind] = {"rl": RLKind(), "pretrain": PretrainKind()}
