"""What an eval of a saved model reads besides the model: the config of the run it came from, the task's
parameters (that run's, with the command line's on top) and the model itself, on the device asked for. Shared by
`keelrl eval` / `keelrl compare` (cli/eval.py) and `keelrl judge` (judge/session.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from keelrl.config import ConfigError


def run_config_near(model_path: str) -> dict[str, Any] | None:
    """The resolved config of the run a checkpoint or final/ directory came from, if there is one."""
    p = Path(model_path)
    if not p.exists():
        return None
    p = p.resolve()
    state = p / "state.json"
    if state.is_file():
        return json.loads(state.read_text()).get("config")
    for parent in (p.parent, p.parent.parent):
        cfg = parent / "config.json"
        if cfg.is_file() and (parent / "metrics.jsonl").exists():
            return json.loads(cfg.read_text())
    return None


def task_params_for(args: argparse.Namespace, run_cfg: dict[str, Any]) -> tuple[dict[str, Any], int, str]:
    """Task parameters, seed and template: the run's (same task), then --task-param / --template on top."""
    task_cfg = run_cfg.get("task", {}) if run_cfg.get("task", {}).get("name") == args.task else {}
    params = dict(task_cfg.get("params", {}))
    for item in args.task_param:
        if "=" not in item:
            raise ConfigError(f"--task-param expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        params[key] = json.loads(value) if value.strip()[:1] in "0123456789-[{tf" else value
    return params, int(task_cfg.get("seed", 0)), args.template or task_cfg.get("template", "auto")


def load_for_eval(model_path: str, device: str) -> tuple[Any, Any]:
    import torch

    from keelrl.config import ModelConfig
    from keelrl.models.load import load_policy

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA device; use --device auto or cpu")
    model, tokenizer = load_policy(ModelConfig(path=model_path))
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        model.to("cuda")
    return model, tokenizer
