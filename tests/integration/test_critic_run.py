"""PPO with a learned critic (algo.advantage = "gae") in real runs: the value model learns and is logged, a
resume from a checkpoint continues exactly (policy and critic), and the warm-up trains the critic alone."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from keelrl.config import ModelConfig, load_config
from keelrl.loop.trainer import train
from keelrl.models.load import load_policy
from keelrl.monitor.report import render_report
from keelrl.run.checkpoint import weights_sha256
from keelrl.run.faults import InjectedFault

CRITIC = [
    'algo.advantage="gae"',
    "algo.lam=0.95",
    "algo.critic_lr=1e-3",
    "train.steps=4",
    "checkpoint.every_steps=2",
    "log.rollouts_per_step=16",  # every rollout of a step (rollout.batch_size 16)
]


def _train(format_run: list[str], run_dir: Path, *extra: str) -> dict:
    cfg = load_config(
        "configs/smoke.toml",
        [*format_run, *CRITIC, "eval.at_start=false", "supervisor.enabled=false", *extra],
    )
    return train(cfg, run_dir)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _critic(run: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run / "checkpoints" / "latest" / "trainer_state.pt", weights_only=False)
    return state["critic"]["weights"]


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_critic_learns_resumes_exactly_and_warms_up(
    format_run: list[str], tmp_path: Path, critic: str
) -> None:
    format_run = [*format_run, f'algo.critic="{critic}"']
    clean = _train(format_run, tmp_path / "clean")
    metrics = _metrics(tmp_path / "clean")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and any(m["reward/std"] > 0 for m in metrics)
    for m in metrics:
        assert m["critic/value_loss"] > 0 and m["critic/warmup"] == 0.0
        assert {
            "critic/explained_variance",
            "critic/value_mean",
            "critic/clipfrac",
            "critic/grad_norm",
        } <= set(m)
    assert metrics[0]["critic/value_mean"] == 0.0  # the zero-initialised head
    # so at step 1 every value is 0 and GAE (gamma 1, lam 0.95) gives each token 0.95^(tokens after it) * R:
    # the returns' and the raw advantages' token mean, from the logged rollouts (all trainable, all scored)
    with gzip.open(tmp_path / "clean" / "rollouts.jsonl.gz", "rt") as f:
        first = [r for r in map(json.loads, f) if r["step"] == 1]
    assert len(first) == 16
    tokens = sum(r["completion_tokens"] for r in first)
    want = sum(r["reward"] * sum(0.95**j for j in range(r["completion_tokens"])) for r in first) / tokens
    assert want > 0
    assert metrics[0]["critic/return_mean"] == pytest.approx(want, rel=1e-5)
    assert metrics[0]["advantage/mean"] == pytest.approx(want, rel=1e-5)
    assert metrics[-1]["critic/value_mean"] != 0.0  # the critic has learned something
    assert metrics[-1]["critic/value_loss"] < metrics[0]["critic/value_loss"]
    assert "Critic (algo.advantage = gae)" in render_report([tmp_path / "clean"])  # keelrl report plots it
    weights = _critic(tmp_path / "clean")
    assert float(weights["head.weight"].abs().sum()) > 0
    # a shared critic saves its head only (the trunk is the policy's, saved as the policy)
    assert (set(weights) == {"head.weight", "head.bias"}) == (critic == "shared")

    with pytest.raises(InjectedFault):
        _train(format_run, tmp_path / "resumed", "faults.crash_at_step=2")
    resumed = _train(format_run, tmp_path / "resumed", "faults.crash_at_step=2")  # resumes from step 2
    assert resumed["weights_sha256"] == clean["weights_sha256"]
    for name, t in _critic(tmp_path / "resumed").items():
        assert torch.equal(t, weights[name]), name
    assert [m["critic/value_loss"] for m in _metrics(tmp_path / "resumed")][-2:] == [
        m["critic/value_loss"] for m in metrics
    ][-2:]

    warm = _train(format_run, tmp_path / "warm", "algo.critic_warmup_steps=2", "train.steps=2")
    initial, _ = load_policy(ModelConfig(path=format_run[0].split("=", 1)[1].strip('"')))
    assert clean["weights_sha256"] != weights_sha256(initial)
    assert warm["weights_sha256"] == weights_sha256(initial)  # the policy waited
    assert [m["critic/warmup"] for m in _metrics(tmp_path / "warm")] == [1.0, 1.0]
    assert float(_critic(tmp_path / "warm")["head.weight"].abs().sum()) > 0  # the critic did not
