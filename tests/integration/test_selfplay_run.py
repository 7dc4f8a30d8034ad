"""`train.stage = "selfplay"` through the trainer: a tiny model pretrained on the demo's corpus proposes
Countdown problems (it writes `a b -> t` lines), the task checks them, the same model solves them; proposer
rewards are the learnability of their solve rates; the buffer is part of the resumable state."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from keelrl.algo.selfplay import learnability_reward
from keelrl.config import ConfigError, TinyModelConfig, config_from_dict
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.models.weights import tensors_sha256
from keelrl.recipes.demo import corpus_text, pretrain
from keelrl.stages import check_stage
from keelrl.tasks import get_task

# one-digit numbers: a tiny model learns the corpus's targets (values of the numbers) in seconds, so many of
# its proposals are solvable
PARAMS = {
    "min_numbers": 2,
    "max_numbers": 2,
    "min_number": 1,
    "max_number": 9,
    "max_target": 100,
    "test_fraction": 0.2,
}


@pytest.fixture(scope="module")
def corpus_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model pretrained for a few seconds on the demo's corpus: it writes problem lines."""
    task = get_task("countdown", **PARAMS)
    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, max_positions=64),
        len(tok),
        tok.eos_token_id,
    )
    pretrain(model, tok, lambda i: corpus_text(task, i, 0), steps=300, batch_size=32, lr=1e-2, seed=0)
    out = tmp_path_factory.mktemp("corpus_model")
    save_hf_dir(model, tok, out)
    return out


def _cfg(model: Path, steps: int, **overrides: dict) -> object:
    data = {
        "model": {"path": str(model)},
        "task": {"name": "countdown", "template": "compact", "params": PARAMS},
        "rollout": {"batch_size": 32, "group_size": 4, "max_new_tokens": 24},
        "algo": {"lr": 3e-3},
        "train": {"stage": "selfplay", "steps": steps, "micro_batch_size": 16, "threads": 1},
        "selfplay": {"proposer_prompts": 2},
        "eval": {"every_steps": 2, "problems": 16},
        "checkpoint": {"every_steps": 2},
        "log": {"progress": False, "rollouts_per_step": 64},
        "supervisor": {"enabled": False},
        "curriculum": {},
    }
    for section, values in overrides.items():
        data[section].update(values)
    return config_from_dict(data, "test")


def _rollouts(run: Path) -> list[dict]:
    with gzip.open(run / "rollouts.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def test_selfplay_proposes_checks_solves_and_pays(corpus_model: Path, tmp_path: Path) -> None:
    train(_cfg(corpus_model, 4), tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "selfplay/valid_frac" in r]
    assert len(steps) == 4
    # the corpus model writes problem lines, many of them valid; new ones fill the buffer and are paid
    assert max(r["selfplay/valid_frac"] for r in steps) >= 0.25 and steps[-1]["selfplay/buffer_size"] >= 4
    assert (
        max(r["selfplay/proposer_reward"] for r in steps) > 0
        and max(r["selfplay/learnable_frac"] for r in steps) > 0
    )
    assert all(
        sum(v for k, v in r.items() if k.startswith("selfplay/refused/")) + r["selfplay/valid_frac"]
        == pytest.approx(1.0)
        for r in steps
    )  # every proposal is valid or refused for one reason
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in steps) and "eval/accuracy" in rows[-1]
    logged = _rollouts(tmp_path / "run")
    proposals = [r for r in logged if r["info"].get("role") == "propose"]
    solutions = [r for r in logged if r["info"].get("role") == "solve"]
    assert proposals and solutions
    for r in proposals:  # paid by learnability when new and solved this step, else 0
        assert r["info"]["proposal"].startswith(f"{r['problem']['first']} ")
        expected = learnability_reward(r["info"]["solve_rate"]) if r["info"]["new"] else 0.0
        assert r["reward"] == pytest.approx(expected)
        assert r["info"]["reason"] in {"valid", "duplicate", "malformed", "unsolvable", "held_out",
                                       "count_out_of_range", "number_out_of_range", "target_out_of_range"}  # fmt: skip
    assert {r["info"]["reason"] for r in proposals if r["info"]["new"]} <= {"valid"}
    state = json.loads((tmp_path / "run" / "checkpoints" / "latest" / "state.json").read_text())
    buffer = state["curriculum"]["buffer"]
    assert (
        state["curriculum"]["kind"] == "selfplay"
        and len(buffer["entries"]) == steps[-1]["selfplay/buffer_size"]
    )
    assert all(e[3] >= 4 for e in buffer["entries"])  # every buffered problem was attempted by a solver group


@pytest.mark.parametrize("policies", ["one", "two"])
def test_selfplay_resumes_exactly_with_its_buffer(corpus_model: Path, tmp_path: Path, policies: str) -> None:
    # two: the solver trains on its rollouts alone, which at this test's lr 3e-3 empties its evals (a rollback)
    sp, algo = {"proposer_prompts": 2, "policies": policies}, {"lr": 3e-3 if policies == "one" else 1e-3}
    full = train(_cfg(corpus_model, 4, selfplay=sp, algo=algo), tmp_path / "full")
    train(_cfg(corpus_model, 2, selfplay=sp, algo=algo), tmp_path / "split")
    resumed = train(_cfg(corpus_model, 4, selfplay=sp, algo=algo), tmp_path / "split")
    assert resumed["weights_sha256"] == full["weights_sha256"]
    latest = {name: tmp_path / name / "checkpoints" / "latest" for name in ("full", "split")}
    a, b = (json.loads((latest[name] / "state.json").read_text())["curriculum"] for name in ("full", "split"))
    assert a == b and a["buffer"]["entries"]
    saved = {name: torch.load(latest[name] / "trainer_state.pt", weights_only=False) for name in latest}
    if policies == "one":
        assert "proposer" not in saved["full"]
        return
    # the proposer (its weights, optimizer moments and schedule) resumes exactly too, and it trained apart
    full_p, split_p = saved["full"]["proposer"], saved["split"]["proposer"]
    assert full_p["version"] == split_p["version"] == 4
    assert tensors_sha256(full_p["weights"]) == tensors_sha256(split_p["weights"])
    assert tensors_sha256(full_p["weights"]) != full["weights_sha256"]
    moments = [
        (x["exp_avg"], y["exp_avg"])
        for x, y in zip(full_p["optimizer"]["state"].values(), split_p["optimizer"]["state"].values())
    ]
    assert moments and all(torch.equal(x, y) for x, y in moments)
    assert full_p["scheduler"] == split_p["scheduler"]


def test_selfplay_policies_setting_is_fixed_for_a_run_directory(corpus_model: Path, tmp_path: Path) -> None:
    train(_cfg(corpus_model, 2), tmp_path / "run")
    with pytest.raises(Exception, match=r"selfplay\.policies"):
        train(_cfg(corpus_model, 4, selfplay={"proposer_prompts": 2, "policies": "two"}), tmp_path / "run")


def test_selfplay_config_errors(corpus_model: Path) -> None:
    with pytest.raises(ConfigError, match="proposals keelrl can check"):
        check_stage(_cfg(corpus_model, 2, task={"name": "multiply", "params": {}}))
    with pytest.raises(ConfigError, match="every new proposal is solved"):
        check_stage(_cfg(corpus_model, 2, selfplay={"proposer_prompts": 3}))
    with pytest.raises(ConfigError, match="leave the buffer"):
        check_stage(_cfg(corpus_model, 2, selfplay={"buffer_capacity": 4}))
    with pytest.raises(ConfigError, match=r"curriculum\.kind"):
        check_stage(_cfg(corpus_model, 2, curriculum={"kind": "adaptive"}))
    with pytest.raises(ConfigError, match=r"policies = 'two' does not combine with rollout\.engine = 'vllm'"):
        check_stage(_cfg(corpus_model, 2, selfplay={"policies": "two"}, rollout={"engine": "vllm"}))


def test_two_policies_roll_back_together(corpus_model: Path, tmp_path: Path) -> None:
    """At this lr the solver's evals collapse by step 4 and eval_regression rolls back to step 0: the proposer is
    restored with the policy, and guards.rollback_lr_scale lowers both learning rates."""
    cfg = _cfg(corpus_model, 6, selfplay={"proposer_prompts": 2, "policies": "two", "proposer_lr": 2e-3})
    cfg.guards.rollback_lr_scale = 0.5
    cfg.guards.max_rollbacks = 1
    train(cfg, tmp_path / "run")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    (rollback,) = [e for e in events if e["kind"] == "rollback"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    after = [r for r in rows if "proposer/lr" in r and r["step"] > rollback["to_step"]]
    assert after, "steps ran after the rollback"
    assert all(r["proposer/lr"] == pytest.approx(1e-3) and r["lr"] == pytest.approx(1.5e-3) for r in after)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "latest" / "trainer_state.pt", weights_only=False)
    assert saved["proposer"]["scheduler"]["base_lrs"] == [pytest.approx(1e-3)]
    # restored, not carried on: 6 updates since step 0 (without the restore it would count the 4 before too)
    assert rollback["to_step"] == 0 and saved["proposer"]["version"] == 6
