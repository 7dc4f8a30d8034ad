"""Shared set-up for the benchmarks that measure overheads on the demo config (checkpoint_cost.py,
guard_overhead.py): the demo's RL config on a base model of the demo's size.

The base is the demo architecture with random weights (pretraining it takes minutes and changes neither
the checkpoint size nor the cost of the guards), unless `--base-model` points at a real one such as
`runs/demo/base`.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import torch

from keelrl.config import Config, TinyModelConfig, config_from_dict
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.recipes.demo import DEMO_MODEL, DEMO_TASK_PARAMS, DemoPlan, demo_rl_config

# --quick, a benchmark's check that it still runs (tests/integration/test_benchmarks_quick.py; its numbers mean
# nothing): the demo's RL stage on 32 completions of 8 tokens, 8-problem evals; a random base of QUICK_MODEL's
# 1-layer shape (demo_base), or the demo's model pretrained for QUICK_PLAN's 3 steps of 8 lines
QUICK_RL: dict[str, dict[str, Any]] = {
    "rollout": {"batch_size": 32, "group_size": 4, "max_new_tokens": 8},
    "train": {"micro_batch_size": 8},
    "eval": {"problems": 8},
}
QUICK_PLAN = DemoPlan(pretrain_steps=3, pretrain_batch=8, pretrain_lr=3e-3, rl_steps=2, eval_every=1)
QUICK_MODEL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, max_positions=64)
QUICK_EVAL_PROBLEMS = 8


def quick_rl(data: dict[str, Any]) -> dict[str, Any]:
    """An RL config dict (`demo_rl_config`'s) at QUICK_RL's sizes."""
    for section, values in QUICK_RL.items():
        data.setdefault(section, {}).update(values)
    return data


def demo_base(work: Path, base_model: str | None, quick: bool = False) -> str:
    if base_model:
        return base_model
    out = work / "base"
    if not (out / "config.json").exists():
        tok = build_char_tokenizer()
        shape = QUICK_MODEL if quick else DEMO_MODEL
        save_hf_dir(build_tiny_model(shape, len(tok), tok.eos_token_id), tok, out)
    return str(out)


def demo_config(base: str, steps: int, overrides: dict[str, dict[str, Any]], quick: bool = False) -> Config:
    """The demo's RL stage for `steps` steps, evals off (they would dominate short timings), with
    section-wise overrides (`quick`: at QUICK_RL's sizes)."""
    data = demo_rl_config(base, DEMO_TASK_PARAMS, steps, eval_every=0, seed=0)
    data["eval"] = {"every_steps": 0, "at_start": False, "problems": 16}
    data["log"]["progress"] = False
    if quick:
        quick_rl(data)
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return config_from_dict(data, "benchmark")


def step_seconds(run_dir: Path) -> list[float]:
    """Wall seconds of each logged step (differences of the metrics' time stamps)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [float(r["time"]) for r in rows if int(r["step"]) > 0]
    return [b - a for a, b in itertools.pairwise(times)]


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu": platform.machine(),
        "torch": torch.__version__,
        "loadavg": list(os.getloadavg()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def emit(result: dict[str, Any], out: str | None) -> None:
    """Print the benchmark's JSON, and write it to `out` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
