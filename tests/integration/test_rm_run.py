"""Reward models through keelrl's training loop (`train.stage = "rm"`, `keelrl rm train`): held-out pair
accuracy, exact resume, micro-batching, the exported HF model and its card; and RL scoring with `reward.model`,
checked against transformers' own ForSequenceClassification forward."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from keelrl.cli.main import main
from keelrl.config import ConfigError, config_from_dict
from keelrl.loop.trainer import train
from keelrl.models.load import ModelLoadError, build_char_tokenizer, load_policy
from keelrl.run.checkpoint import weights_sha256
from keelrl.stages import check_stage
from keelrl.stages.rm.model import rm_ids
from keelrl.tasks import get_task

TASK = {
    "name": "countdown",
    "template": "compact",
    "params": {"min_numbers": 2, "max_numbers": 2, "max_number": 20, "max_target": 400},
}


@pytest.fixture(scope="module")
def prefs(tmp_path_factory) -> Path:
    """A hidden rule: the plain answer beats the same answer padded with `+0`s (the shorter one wins)."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("rm") / "prefs.jsonl"
    with path.open("w") as f:
        for _ in range(300):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            chosen, rejected = f"<answer>{a}+{b}</answer>", f"<answer>{a}+{b}+0+0</answer>"
            f.write(
                json.dumps({"prompt": f"{a} {b} -> {a + b}", "chosen": chosen, "rejected": rejected}) + "\n"
            )
    return path


def rm_config(model_dir: Path, prefs: Path, steps: int, micro_batch_size: int = 8) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "data": {"path": str(prefs), "batch_size": 16, "max_length": 64, "eval_fraction": 0.2},
        "algo": {"lr": 1e-3, "lr_schedule": "constant"},
        "train": {"stage": "rm", "steps": steps, "micro_batch_size": micro_batch_size, "threads": 1},
        "eval": {"every_steps": 6, "at_start": True},
        "checkpoint": {"every_steps": 6, "keep_last": 2},
        "supervisor": {"enabled": False},
    }


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory, tiny_model_dir, prefs) -> Path:
    out = tmp_path_factory.mktemp("rm_run") / "run"
    train(config_from_dict(rm_config(tiny_model_dir, prefs, 18)), out)
    return out


def test_rm_run_learns_the_rule_and_exports_a_reward_model(rm_run, prefs) -> None:
    metrics = [json.loads(x) for x in (rm_run / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 6, 12, 18]
    assert evals[0]["eval/accuracy"] == 0.5  # a fresh head scores every completion 0: all ties
    assert evals[-1]["eval/accuracy"] >= 0.9 and evals[-1]["eval/margin"] > 0
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"] - 0.3
    steps = [m for m in metrics if "rm/accuracy" in m]
    assert [m["step"] for m in steps] == list(range(1, 19)) and all(m["loss/pair_nll"] > 0 for m in steps)
    assert {m["eval/pairs"] for m in evals} == {evals[0]["eval/pairs"]} and 40 <= evals[0]["eval/pairs"] <= 80

    final = rm_run / "final"
    card = json.loads((final / "reward_model.json").read_text())
    assert card["held_out_pair_accuracy"] == evals[-1]["eval/accuracy"] and card["max_length"] == 64
    assert card["train_pairs"] + card["held_out_pairs"] == 300 and card["score_std"] > 0
    # final/ is an ordinary HF reward model: transformers' own forward (last non-pad token) gives the scores
    hf = AutoModelForSequenceClassification.from_pretrained(final).eval()
    assert hf.config.num_labels == 1
    tok = build_char_tokenizer()
    rows = [json.loads(line) for line in prefs.read_text().splitlines()[:20]]
    with torch.no_grad():
        score = lambda p, c: float(hf(torch.tensor([rm_ids(tok, p, c, 64)[0]])).logits[0, 0])  # noqa: E731
        right = sum(score(r["prompt"], r["chosen"]) > score(r["prompt"], r["rejected"]) for r in rows)
    assert right >= 18


def test_rm_resume_is_exact_and_micro_batching_does_not_change_the_update(
    tmp_path, tiny_model_dir, prefs, rm_run
):
    cfg = rm_config(tiny_model_dir, prefs, 12)
    train(config_from_dict(cfg), tmp_path / "split")
    cfg["train"]["steps"] = 18
    train(config_from_dict(cfg), tmp_path / "split")
    load = lambda p: load_policy(config_from_dict({"model": {"path": str(p)}}).model, head="reward")[0]  # noqa: E731
    assert weights_sha256(load(tmp_path / "split" / "final")) == weights_sha256(load(rm_run / "final"))

    after = {}
    for mb in (16, 3):
        train(
            config_from_dict(rm_config(tiny_model_dir, prefs, 2, micro_batch_size=mb)), tmp_path / f"mb{mb}"
        )
        after[mb] = load(tmp_path / f"mb{mb}" / "final").state_dict()
    diff = max(float((after[16][k] - after[3][k]).abs().max()) for k in after[16])
    assert diff < 1e-5
    assert (
        float((after[16]["score.weight"]).abs().max()) > 1e-4
    )  # the head moved: the comparison means something


def test_keelrl_rm_train_command(tmp_path, tiny_model_dir, prefs) -> None:
    run_dir = tmp_path / "cli"
    code = main([
        "rm", "train", str(prefs), "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--no-supervisor",
        "--set", "train.steps=2", "--set", "data.batch_size=8", "--set", "log.tensorboard=false",
    ])  # fmt: skip
    assert code == 0 and (run_dir / "final" / "reward_model.json").is_file()
    # nothing held out in the config: `keelrl rm train` holds out 10% (a reward model is judged on them)
    held_out = json.loads((run_dir / "summary.json").read_text())["final_eval"]["pairs"]
    assert 15 <= held_out <= 45
    with pytest.raises(ConfigError, match="held-out pair accuracy"):
        cfg = rm_config(tiny_model_dir, prefs, 1)
        cfg["data"]["eval_fraction"] = 0.0
        check_stage(config_from_dict(cfg))  # the rm stage's check: keelrl train runs it first
    bad = main(
        ["rm", "train", str(tmp_path / "missing.jsonl"), "--model", "tiny", "--run-dir", str(tmp_path / "x")]
    )
    assert bad == 2


def rl_config(policy: Path, rm: str, steps: int, **reward) -> dict:
    return {
        "model": {"path": str(policy)},
        "task": TASK,
        "rollout": {"batch_size": 16, "group_size": 4, "max_new_tokens": 16},
        "reward": {"model": rm, **reward},
        "train": {"steps": steps, "micro_batch_size": 16, "threads": 1},
        "eval": {"every_steps": 0, "at_start": False},
        "log": {"rollouts_per_step": 16},
        "supervisor": {"enabled": False},
    }


def test_rl_rewards_are_the_verifier_plus_the_normalised_learned_score(
    tmp_path, tiny_model_dir, rm_run
) -> None:
    train(
        config_from_dict(rl_config(tiny_model_dir, str(rm_run), 2, verifier_weight=0.5, model_weight=2.0)),
        tmp_path / "rl",
    )
    card = json.loads((rm_run / "final" / "reward_model.json").read_text())
    hf = AutoModelForSequenceClassification.from_pretrained(rm_run / "final").eval()
    tok, task = build_char_tokenizer(), get_task("countdown", **TASK["params"])
    with gzip.open(tmp_path / "rl" / "rollouts.jsonl.gz", "rt") as f:
        rollouts = [json.loads(line) for line in f]
    assert len(rollouts) == 32
    for r in rollouts:
        prompt = task.prompt(r["problem"], "compact").user
        with torch.no_grad():
            raw = float(
                hf(torch.tensor([rm_ids(tok, prompt, r["text"], card["max_length"])[0]])).logits[0, 0]
            )
        verifier = task.score(r["problem"], r["text"]).reward
        assert r["info"]["reward_model"] == pytest.approx(raw, abs=1e-4)
        assert r["info"]["verifier_reward"] == pytest.approx(verifier)
        expected = 0.5 * verifier + 2.0 * (raw - card["score_mean"]) / card["score_std"]
        assert r["reward"] == pytest.approx(expected, abs=1e-4)
    metrics = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in rollouts if r["step"] == 1]
    assert metrics[0]["reward/model"] == pytest.approx(
        sum(r["info"]["reward_model"] for r in first) / 16, abs=1e-4
    )
    assert metrics[0]["reward/verifier"] == pytest.approx(
        sum(r["info"]["verifier_reward"] for r in first) / 16
    )


def test_a_reward_model_without_its_card_needs_a_scale(tmp_path, tiny_model_dir, rm_run) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(rm_run / "final", bare)
    (bare / "reward_model.json").unlink()
    with pytest.raises(ModelLoadError, match=r"reward\.score_mean and reward\.score_std"):
        train(config_from_dict(rl_config(tiny_model_dir, str(bare), 1)), tmp_path / "rl")
    assert not (tmp_path / "rl").exists()  # refused before the run directory was made
    train(
        config_from_dict(rl_config(tiny_model_dir, str(bare), 1, score_mean=0.0, score_std=1.0)),
        tmp_path / "ok",
    )
    assert (tmp_path / "ok" / "summary.json").is_file()
