"""Every objective, the importance masks and the fp32 head in a real (short) training run: the settings reach
the update, and its metrics say so. Two mini-batches per step: the first is on-policy, where every objective
has PPO's gradient; the second is stale, where they differ. So each objective's run ends with other weights
than ppo_clip's, except gspo_token, whose gradient equals gspo's when advantages are per sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keelrl.config import load_config
from keelrl.loop.trainer import train

COMMON = [
    "train.steps=2",
    "algo.minibatches=2",
    "eval.at_start=false",
    "eval.every_steps=0",
    "supervisor.enabled=false",
]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(format_run: list[str], run: Path, *extra: str) -> dict[str, torch.Tensor]:
    """Train; the final weights."""
    summary = train(load_config("configs/smoke.toml", [*format_run, *COMMON, *extra]), run)
    assert summary["state"] == "finished"
    return load_file(run / "final" / "model.safetensors")


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def ppo_weights(format_run: list[str], tmp_path_factory) -> dict[str, torch.Tensor]:
    return _train(format_run, tmp_path_factory.mktemp("ppo") / "run")


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "cispo"])
def test_each_objective_reaches_the_update(
    format_run: list[str], tmp_path: Path, ppo_weights: dict[str, torch.Tensor], objective: str
) -> None:
    clips = ["algo.seq_clip_low=0.05", "algo.seq_clip_high=0.05"]
    weights = _train(format_run, tmp_path / objective, f'algo.objective="{objective}"', *clips)
    assert _distance(weights, ppo_weights) > 1e-4
    if objective == "gspo_token":  # the same gradient as gspo's, token by token summed
        gspo = _train(format_run, tmp_path / "gspo", 'algo.objective="gspo"', *clips)
        assert _distance(weights, gspo) < 1e-5


@pytest.mark.parametrize(
    "extra",
    [
        ['algo.objective="gspo"', "algo.seq_clip_low=0.05", "algo.seq_clip_high=0.05"],
        ['algo.objective="gspo_token"'],
        ['algo.objective="cispo"', "algo.cispo_max=1.05"],
        [
            'algo.correction="mis"',
            'algo.old_logprobs="recompute"',
            "algo.is_mask_low=0.999999",
            "algo.is_mask_high=1.000001",
        ],
        [
            'algo.correction="mis"',
            'algo.old_logprobs="recompute"',
            'algo.correction_level="sequence"',
            'train.autocast="bf16"',
            "model.fp32_head=true",
        ],
    ],
    ids=["gspo", "gspo_token", "cispo", "token_mask", "sequence_mask_bf16_fp32_head"],
)
def test_objectives_and_corrections_train(format_run: list[str], tmp_path: Path, extra: list[str]) -> None:
    _train(format_run, tmp_path, *extra)
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2] and any(m["reward/std"] > 0 for m in metrics)
    for m in metrics:
        assert m["loss/total"] == m["loss/total"]  # finite, not NaN
        if "gspo" in extra[0] or "cispo" in extra[0]:
            assert "clipfrac/dual" not in m and "clipfrac/high" in m
    if "cispo" in extra[0]:  # the second mini-batch is stale: some weights reach the 1.05 cap
        assert any(m["clipfrac/high"] > 0 for m in metrics)
    if "gspo" in extra[0]:  # and some sequence ratios leave [0.95, 1.05]
        assert any(m["clipfrac/high"] + m["clipfrac/low"] > 0 for m in metrics)
    assert any(m["ratio/max"] > 1.0 + 1e-3 for m in metrics)  # the second mini-batch is off-policy
    if "mis" in extra[0]:
        # the mask path ran (old log-probs recomputed, mismatch measured); keelrl's own sampler agrees with the
        # trainer to ~1e-6 in fp32 and ~1e-3 in bf16, so even a band of 1e-6 drops (almost) nothing. Dropping
        # itself: tests/unit/test_offpolicy.py.
        assert all(0.0 <= m["behaviour/cut_frac"] < 0.05 and m["mismatch/max_abs"] < 1e-2 for m in metrics)
        assert all(m["behaviour/ess"] > 0.99 for m in metrics)
