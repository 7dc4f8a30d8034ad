"""LoRA under torchrun (ddp, gloo on CPU): DDP over a policy whose only trainable parameters are the adapters
gives the update of one process with the whole batch (losses within 1e-6, adapters and merged weights within
1e-6; see test_torchrun.py for why weights are compared, not hashed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

SETTINGS = [
    "train.steps=3", "eval.every_steps=0", "checkpoint.every_steps=0", "algo.lr=1e-3", "model.lora.rank=8",
    'distributed.strategy="ddp"',
]  # fmt: skip


def _run(run_dir: Path, format_run: list[str], nproc: int) -> None:
    argv = ["-m", "keelrl", "train", "configs/smoke.toml", "--run-dir", str(run_dir)]
    for item in [*format_run, *SETTINGS]:
        argv += ["--set", item]
    if nproc > 1:
        argv = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *argv]
    else:
        argv.append("--no-supervisor")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow  # 20-40 s: three processes on two cores
def test_lora_two_processes_equal_one(format_run: list[str], tmp_path: Path) -> None:
    _run(tmp_path / "single", format_run, 1)
    _run(tmp_path / "multi", format_run, 2)
    single, multi = (
        [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("single", "multi")
    )
    assert [m["step"] for m in single] == [m["step"] for m in multi] == [0, 1, 2, 3]
    for a, b in zip(single[1:], multi[1:]):
        assert a["reward/mean"] == b["reward/mean"]
        assert abs(a["loss/total"] - b["loss/total"]) <= 1e-6
    adapters = [
        load_file(str(tmp_path / n / "final" / "adapter" / "adapter_model.safetensors"))
        for n in ("single", "multi")
    ]
    merged = [load_file(str(tmp_path / n / "final" / "model.safetensors")) for n in ("single", "multi")]
    assert max(float(t.abs().max()) for k, t in adapters[0].items() if "lora_B" in k) > 1e-4  # they trained
    assert _max_diff(*adapters) <= 1e-6
    assert _max_diff(*merged) <= 1e-6
