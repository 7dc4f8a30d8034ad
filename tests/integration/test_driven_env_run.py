"""A multi-turn environment that drives the model itself (the verifiers style: its own `rollout` loop calls
`client.chat.completions.create`), trained for 3 steps by the normal trainer; every trained token is checked byte
for byte against what the sampler returned, in the very context it was sampled in."""

from __future__ import annotations

import json
import random
import sys
import textwrap
from pathlib import Path

import torch

from keelrl.config import TinyModelConfig, load_config
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.rollout.hf import HFSampler
from keelrl.step import update

DRIVER = '''
from keelrl.core.seeds import stable_hash


class GuessDriven:
    """Find a hidden number from 1 to 4; the environment runs the conversation and asks the model for turns."""

    name = "guess_driven"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def problem(self, split: str, index: int) -> dict:
        k = 2 * index + (split == "test")
        return {"id": k, "secret": 1 + stable_hash("guess", self.seed, k) % 4}

    def difficulty(self, problem: dict) -> str:
        return "all"

    async def rollout(self, client, problem: dict, seed: int) -> float:
        messages = [{"role": "user", "content": "Guess my number from 1 to 4."}]
        for turn in range(1, 4):
            response = await client.chat.completions.create(model="policy", messages=messages)
            text = response.choices[0].message.content
            messages.append({"role": "assistant", "content": text})
            digits = [int(c) for c in text if c.isdigit()]
            if digits and digits[0] == problem["secret"]:
                return 1.0 / turn
            hint = "a number, please" if not digits else "higher" if digits[0] < problem["secret"] else "lower"
            messages.append({"role": "user", "content": hint})
        return 0.0
'''


def _guesses(i: int) -> str:
    """Guessing games as the plain format writes them: a random guess, a random hint, another guess."""
    rng = random.Random(i)
    a, b, hint = rng.randint(1, 4), rng.randint(1, 4), rng.choice(["higher", "lower"])
    return f"User: Guess my number from 1 to 4.\nAssistant:{a}<eos>\nUser: {hint}\nAssistant:{b}"


def _segments(mask: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of 1s in `mask`, as (start, end)."""
    runs, start = [], None
    for t, m in enumerate([*mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def test_a_driven_environment_trains_on_exactly_the_sampled_tokens(tmp_path: Path, monkeypatch) -> None:
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=128), len(tok), 0
    )
    pretrain(model, tok, _guesses, steps=60, batch_size=32, lr=1e-2, seed=0)  # it guesses, then stops
    save_hf_dir(model, tok, tmp_path / "model")
    (tmp_path / "guess_driven.py").write_text(textwrap.dedent(DRIVER))

    sampled: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}  # this step's draws, by prompt
    checked: list[int] = []  # trained turns checked, per trained episode
    generate, collate = HFSampler.generate, update.collate

    def recording_generate(self, prompts, settings, seeds):
        out = generate(self, prompts, settings, seeds)
        for p, g in zip(prompts, out):
            sampled.setdefault(tuple(p), []).append((list(g.completion_ids), list(g.logprobs)))
        return out

    def checking_collate(rollouts, pad_id, device):
        """The batch the update trains on, checked against what was sampled for it: every run of trainable
        positions is one sampled turn, byte for byte, with its sampling log-probs, after exactly its prompt."""
        batch = collate(rollouts, pad_id, device)
        for i, r in enumerate(rollouts):
            n = len(r.prompt_ids) + len(r.completion_ids)
            ids, mask = batch.input_ids[i, :n].tolist(), batch.target_mask[i, :n].int().tolist()
            assert r.status == "ok" and sum(mask) == sum(r.trainable) > 0
            # target_mask[t] = 1: position t predicts token t + 1, which the policy sampled
            runs = _segments(mask)
            for a, b in runs:
                prompt, tokens, lp = ids[: a + 1], ids[a + 1 : b + 1], batch.sampler_logprobs[i, a:b]
                drawn = sampled.get(tuple(prompt), [])
                same = [g == tokens and torch.allclose(lp, torch.tensor(glp)) for g, glp in drawn]
                assert any(same), (prompt, tokens)
            checked.append(len(runs))
        sampled.clear()  # the next step samples with new weights
        return batch

    monkeypatch.setattr(HFSampler, "generate", recording_generate)
    monkeypatch.setattr(update, "collate", checking_collate)
    sys.path.insert(0, str(tmp_path))
    try:
        overrides = [
            f'model.path="{tmp_path / "model"}"', 'task.name="guess_driven:GuessDriven"', "task.params={}",
            'task.template="compact"', "rollout.batch_size=16", "rollout.group_size=4", "rollout.max_new_tokens=8",
            "episode.max_turns=3", "episode.max_context_tokens=120", "train.steps=3", "train.micro_batch_size=8",
            "train.threads=1", "eval.at_start=false", "eval.every_steps=0", "checkpoint.every_steps=0",
            "log.progress=false", "supervisor.enabled=false",
        ]  # fmt: skip
        summary = train(load_config("configs/smoke.toml", overrides), tmp_path / "run")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("guess_driven", None)

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["state"] == "finished" and [m["step"] for m in metrics] == [1, 2, 3]
    assert max(m["episode/turns"] for m in metrics) > 1.2 and any(m["reward/std"] > 0 for m in metrics)
    assert all(m["episode/error_frac"] == 0 for m in metrics if "episode/error_frac" in m)
    assert len(checked) == 3 * 16  # every episode of the 3 steps was trained, and checked
    assert sum(checked) > len(checked)  # several turns per episode on average
