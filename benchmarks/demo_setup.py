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

from keelrl.config import Config, config_from_dict
from keelrl.demo import DEMO_MODEL, DEMO_TASK_PARAMS, demo_rl_config
from keelrl.models import build_char_tokenizer, build_tiny_model, save_hf_dir


def demo_base(work: Path, base_model: str | None) -> str:
    if base_model:
        return base_model
    out = work / "base"
    if not (out / "config.json").exists():
        tok = build_char_tokenizer()
        save_hf_dir(build_tiny_model(DEMO_MODEL, len(tok), tok.eos_token_id), tok, out)
    return str(out)


def demo_config(base: str, steps: int, overrides: dict[str, dict[str, Any]]) -> Config:
    """The demo's RL stage for `steps` steps, evals off (they would dominate short timings), with
    section-wise overrides."""
    data = demo_rl_config(base, DEMO_TASK_PARAMS, steps, eval_every=0, seed=0)
    data["eval"] = {"every_steps": 0, "at_start": False, "problems": 16}
    data["log"]["progress"] = False
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
