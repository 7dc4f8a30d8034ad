"""Self-play on the code task, one step through `selfplay_step` with a scripted sampler in place of the model:
the proposer's text is checked in the sandbox and enters the buffer once (its repeats are duplicates), the
solver is judged by the proposed tests, and the new problem is paid its learnability. The model is a random tiny
one: only its log-probs enter the update."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keelrl.algo.selfplay import learnability_reward
from keelrl.config import TinyModelConfig, config_from_dict
from keelrl.models import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.rollout import SamplingSettings
from keelrl.rollout.types import Generation
from keelrl.selfplay.step import selfplay_step
from keelrl.setup import setup

PROPOSAL = (  # what follows the proposer's start, `<spec>`
    "Return the sum of the squares of a list of integers.</spec>\n```python\ndef sum_squares(xs):\n"
    "    return sum(x * x for x in xs)\n```\n<tests>\nassert sum_squares([1, 2]) == 5\n"
    "assert sum_squares([]) == 0\nassert sum_squares([-3]) == 9\n</tests>"
)
RIGHT = "def sum_squares(xs):\n    return sum(x * x for x in xs)\n```"
WRONG = "def sum_squares(xs):\n    return sum(xs)\n```"  # passes only the empty list


@dataclass
class ScriptedSampler:
    """Proposer prompts (they end in `<spec>`) get PROPOSAL; solver prompts get RIGHT for even seeds, WRONG for
    odd ones."""

    tokenizer: Any
    solver_seeds: list[int]
    policy_version: int = 0

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        out = []
        for ids, seed in zip(prompts, seeds):
            if self.tokenizer.decode(ids).endswith("<spec>"):
                text = PROPOSAL
            else:
                self.solver_seeds.append(seed)
                text = RIGHT if seed % 2 == 0 else WRONG
            got = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Generation(got, [-1.0] * len(got), "eos"))
        return out

    def update_weights(self, weights: Any, version: int) -> None: ...


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    tok = build_char_tokenizer()
    policy = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, max_positions=1024),
        len(tok),
        tok.eos_token_id,
    )
    save_hf_dir(policy, tok, tmp_path / "model")
    return tmp_path / "model"


def test_code_selfplay_step_checks_in_the_sandbox_solves_and_pays(model: Path, tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "model": {"path": str(model)},
            "task": {"name": "code", "template": "compact"},
            "rollout": {"batch_size": 16, "group_size": 4, "max_new_tokens": 400},
            "train": {"stage": "selfplay", "steps": 1, "micro_batch_size": 8, "threads": 1},
            "selfplay": {"proposer_prompts": 1},
            "eval": {"every_steps": 0},
            "log": {"progress": False},
            "supervisor": {"enabled": False},
        },
        "test",
    )
    run, state = setup(cfg, tmp_path / "run")
    solver_seeds: list[int] = []
    run.sampler = ScriptedSampler(run.tokenizer, solver_seeds)
    metrics = selfplay_step(run, state)

    buffer = run.source.buffer  # type: ignore[attr-defined]
    assert len(buffer.entries) == 1
    (entry,) = buffer.entries.values()
    assert entry.problem["entry_point"] == "sum_squares" and len(entry.problem["tests"]) == 3
    assert "sum_squares(xs)" in entry.problem["prompt"] and "assert" not in entry.problem["prompt"]
    # one valid new proposal, three repeats of it; the solver's 4 attempts were judged by the proposed tests
    assert metrics["selfplay/valid_frac"] == 1.0 and metrics["selfplay/duplicate_frac"] == 0.75
    assert metrics["selfplay/distinct_frac"] == 0.25
    rate = sum(s % 2 == 0 for s in solver_seeds) / len(solver_seeds)
    assert (
        0.0 < rate < 1.0
    )  # the scripted solver both passes and fails, so the proposal earns its learnability
    assert len(solver_seeds) == 4 and (entry.attempts, entry.solved) == (4, round(4 * rate))
    assert metrics["accuracy"] == pytest.approx(rate)
    assert metrics["selfplay/proposer_reward"] == pytest.approx(learnability_reward(rate) / 4)
    assert all(metrics[f"selfplay/refused/{r}"] == 0.0 for r in ("malformed", "invalid_solution", "held_out"))
