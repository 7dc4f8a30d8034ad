"""`train.stage = "selfplay"` through the trainer: a tiny model pretrained on the demo's corpus proposes
Countdown problems (it writes `a b -> t` lines), the task checks them, the same model solves them; proposer
rewards are the learnability of their solve rates; the buffer is part of the resumable state."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from keelrl.algo.selfplay import learnability_reward
from keelrl.config import ConfigError, TinyModelConfig, config_from_dict
from keelrl.demo import corpus_text, pretrain
from keelrl.models import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.tasks import get_task
from keelrl.trainer import train

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


def test_selfplay_resumes_exactly_with_its_buffer(corpus_model: Path, tmp_path: Path) -> None:
    full = train(_cfg(corpus_model, 4), tmp_path / "full")
    train(_cfg(corpus_model, 2), tmp_path / "split")
    resumed = train(_cfg(corpus_model, 4), tmp_path / "split")
    assert resumed["weights_sha256"] == full["weights_sha256"]
    a = json.loads((tmp_path / "full" / "checkpoints" / "latest" / "state.json").read_text())["curriculum"]
    b = json.loads((tmp_path / "split" / "checkpoints" / "latest" / "state.json").read_text())["curriculum"]
    assert a == b


def test_selfplay_config_errors(corpus_model: Path) -> None:
    with pytest.raises(ConfigError, match="proposals keelrl can check"):
        _cfg(corpus_model, 2, task={"name": "multiply", "params": {}})
    with pytest.raises(ConfigError, match="every new proposal is solved"):
        _cfg(corpus_model, 2, selfplay={"proposer_prompts": 3})
    with pytest.raises(ConfigError, match="leave the buffer"):
        _cfg(corpus_model, 2, selfplay={"buffer_capacity": 4})
    with pytest.raises(ConfigError, match=r"curriculum\.kind"):
        _cfg(corpus_model, 2, curriculum={"kind": "adaptive"})
