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
from keelrl.loop.setup import setup
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.rollout import SamplingSettings
from keelrl.rollout.types import Generation
from keelrl.stages.selfplay.step import selfplay_step

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


def test_two_policies_each_trained_on_its_own_role(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """selfplay.policies = "two": the proposer's sampler writes the proposals, the policy's the solutions; each
    update gets only its own role's rollouts and moves only its own weights."""
    import torch

    import keelrl.stages.selfplay.step as step_module
    from keelrl.models.weights import untied_state_dict

    cfg = config_from_dict(
        {
            "model": {"path": str(model)},
            "task": {"name": "code", "template": "compact"},
            "rollout": {"batch_size": 16, "group_size": 4, "max_new_tokens": 400},
            "train": {"stage": "selfplay", "steps": 1, "micro_batch_size": 8, "threads": 1},
            "selfplay": {"proposer_prompts": 1, "policies": "two", "proposer_lr": 1e-2},
            "eval": {"every_steps": 0},
            "log": {"progress": False},
            "supervisor": {"enabled": False},
        },
        "test",
    )
    run, state = setup(cfg, tmp_path / "run")
    assert state.proposer is not None and run.proposer is not None
    assert state.proposer.model is not state.policy
    assert state.proposer.optimizer.param_groups[0]["lr"] == 1e-2 != state.optimizer.param_groups[0]["lr"]
    solver_seeds: list[int] = []
    proposer_prompts: list[str] = []

    class ProposerOnly(ScriptedSampler):
        def generate(
            self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
        ) -> list[Generation]:
            proposer_prompts.extend(self.tokenizer.decode(ids) for ids in prompts)
            return super().generate(prompts, settings, seeds)

    run.sampler = ScriptedSampler(run.tokenizer, solver_seeds)
    run.proposer.sampler = ProposerOnly(run.tokenizer, [])
    before = {
        "solver": {k: v.clone() for k, v in untied_state_dict(state.policy).items()},
        "proposer": {k: v.clone() for k, v in untied_state_dict(state.proposer.model).items()},
    }
    updates: list[tuple[object, list[str]]] = []
    real_update = step_module.rl_update

    def recording_update(run_: object, state_: object, rollouts: list) -> dict[str, float]:
        updates.append((state_.policy, [r.info["role"] for r in rollouts]))  # type: ignore[attr-defined]
        return real_update(run_, state_, rollouts)  # type: ignore[arg-type]

    monkeypatch.setattr(step_module, "rl_update", recording_update)
    metrics = selfplay_step(run, state)

    # the proposer's sampler saw only proposer prompts; the policy's sampler only the solver's
    assert len(proposer_prompts) == 4 and all(p.endswith("<spec>") for p in proposer_prompts)
    assert len(solver_seeds) == 4
    assert [(policy, set(roles)) for policy, roles in updates] == [
        (state.policy, {"solve"}),
        (state.proposer.model, {"propose"}),
    ]
    assert [len(roles) for _, roles in updates] == [4, 4]
    # both moved (the proposal group's rewards differ: one new, three duplicates; the solver both passes and
    # fails), each by its own optimizer, and the two policies now differ
    after = {"solver": untied_state_dict(state.policy), "proposer": untied_state_dict(state.proposer.model)}
    for role in ("solver", "proposer"):
        assert any(not torch.equal(before[role][k], after[role][k]) for k in before[role]), role
    assert any(not torch.equal(after["solver"][k], after["proposer"][k]) for k in after["solver"])
    assert state.proposer.version == 1 and state.policy_version == 1
    assert "proposer/loss/total" in metrics and "proposer/grad_norm" in metrics and "loss/total" in metrics
    assert metrics["proposer/lr"] == 1e-2
