"""configs/smoke.toml end to end on CPU: every file of the run-directory contract, and the exports."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from keelrl.cli.main import main
from keelrl.config import load_config
from keelrl.loop.trainer import train
from keelrl.run.checkpoint import verify, weights_sha256

METRIC_NAMES = [
    "reward/mean",
    "reward/std",
    "accuracy",
    "format_rate",
    "response_length/mean",
    "response_length/max",
    "response_length/truncated_frac",
    "entropy",
    "kl/old",
    "clipfrac/low",
    "clipfrac/high",
    "grad_norm",
    "lr",
    "loss/policy",
    "loss/total",
    "groups/no_signal_frac",
    "repetition/frac",
    "time/gen_s",
    "time/score_s",
    "time/train_s",
    "time/step_s",
    "throughput/tokens_per_s",
]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("smoke") / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(load_config("configs/smoke.toml", ["train.threads=1"]), run)
        # train.threads is the run's: the caller (a notebook, this suite) gets its own count back
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    return run


def test_run_directory_contract(smoke_run: Path) -> None:
    cfg = json.loads((smoke_run / "config.json").read_text())
    assert cfg["train"]["steps"] == 4 and cfg["model"]["path"] == "tiny"
    metrics = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]  # step 0: the eval before training
    assert all(isinstance(m["time"], float) for m in metrics)
    for m in metrics[1:]:
        missing = [k for k in METRIC_NAMES if k not in m]
        assert not missing, missing
    assert "eval/accuracy" in metrics[0] and "eval/accuracy" in metrics[2] and "eval/accuracy" in metrics[4]
    with gzip.open(smoke_run / "rollouts.jsonl.gz", "rt") as f:
        rollouts = [json.loads(line) for line in f]
    assert {r["step"] for r in rollouts} == {1, 2, 3, 4}
    assert {
        "problem",
        "text",
        "reward",
        "correct",
        "finish_reason",
        "policy_version",
        "sampling",
    } <= rollouts[0].keys()
    events = [json.loads(line) for line in (smoke_run / "events.jsonl").read_text().splitlines()]
    saves = [(e["step"], e["reason"]) for e in events if e["kind"] == "checkpoint"]
    assert [st for st, _ in saves] == [0, 2, 4] and saves[0][
        1
    ] == "initial"  # the guards' first rollback target
    status = json.loads((smoke_run / "status.json").read_text())
    assert (
        status["state"] == "finished" and status["step"] == 4 and status["last_checkpoint"] == "step_00000004"
    )
    latest = smoke_run / "checkpoints" / "latest"
    assert latest.is_symlink() and verify(latest) is None
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert (
        summary["steps"] == 4
        and "accuracy" in summary["final_eval"]
        and "accuracy" in summary["initial_eval"]
    )
    assert len(summary["weights_sha256"]) == 64


def test_final_export_loads_with_transformers(smoke_run: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(smoke_run / "final")
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert weights_sha256(model) == summary["weights_sha256"]


def test_eval_accepts_checkpoint_path(smoke_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            str(smoke_run / "checkpoints" / "latest"),
            "--task",
            "countdown",
            "--problems",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert 0.0 <= result["accuracy"] <= 1.0 and result["problems"] == 8


def test_python_dash_m_is_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "keelrl", "--help"], capture_output=True, text=True, check=True
    )
    assert "train" in out.stdout and "eval" in out.stdout


def test_console_lines_do_not_wrap_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """Logs and pipes get whole lines (rich alone wraps at 80 columns there)."""
    from keelrl.monitor.sinks import make_console

    line = "step 12/100  reward 0.512  accuracy 0.250  entropy 1.234" + "  kl 0.001" * 6
    make_console(stderr=True).print(line)
    assert capsys.readouterr().err == line + "\n"
