"""`Sampler.update_weights`: the in-process sampler loads another model's named tensors (and then samples
exactly what that model samples), copies nothing when given its own model's tensors, and names what does not
fit; `make_sampler` builds it and calls `on_progress` once per decode step."""

from __future__ import annotations

import pytest

from keelrl.config import TinyModelConfig
from keelrl.models.load import build_tiny_model
from keelrl.models.weights import WeightsMismatch, untied_state_dict
from keelrl.rollout import SamplingSettings, hf, make_sampler
from keelrl.rollout.hf import HFSampler

SETTINGS = SamplingSettings(max_new_tokens=12, temperature=1.0)


def _model(tok, seed: int):
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=64, init_seed=seed)
    return build_tiny_model(cfg, len(tok), tok.eos_token_id).eval()


def _prompts(tok) -> list[list[int]]:
    return [tok(f"{i} {i + 3} -> {2 * i}\n", add_special_tokens=False)["input_ids"] for i in range(6)]


def test_loads_another_models_weights_and_then_samples_like_it(char_tokenizer) -> None:
    a, b = _model(char_tokenizer, 1), _model(char_tokenizer, 2)
    prompts, seeds = _prompts(char_tokenizer), list(range(6))
    sampler = HFSampler(a, char_tokenizer)
    before = sampler.generate(prompts, SETTINGS, seeds)
    expected = HFSampler(b, char_tokenizer).generate(prompts, SETTINGS, seeds)
    assert before != expected  # the two models sample differently
    sampler.update_weights(untied_state_dict(b).items(), 1)
    assert sampler.policy_version == 1 and sampler.model is a
    assert sampler.generate(prompts, SETTINGS, seeds) == expected  # token for token, log-prob for log-prob


def test_own_tensors_are_not_copied(char_tokenizer, monkeypatch) -> None:
    model = _model(char_tokenizer, 1)
    sampler = make_sampler(None, model, char_tokenizer)

    def no_copy(*args, **kwargs):
        raise AssertionError("the sampler copied its own model's weights")

    monkeypatch.setattr(hf, "load_untied", no_copy)
    sampler.update_weights(untied_state_dict(model).items(), 3)
    sampler.update_weights(model.state_dict(), 4)  # a Mapping, tied duplicates included
    assert sampler.policy_version == 4
    other = {name: t.clone() for name, t in untied_state_dict(model).items()}  # same values, other storage
    with pytest.raises(AssertionError, match="copied"):
        sampler.update_weights(other, 5)


def test_wrong_name_says_what_does_not_fit(char_tokenizer) -> None:
    model = _model(char_tokenizer, 1)
    sampler = HFSampler(model, char_tokenizer)
    weights = {
        name.replace("embed_tokens", "embed_tokenz"): t.clone()
        for name, t in untied_state_dict(model).items()
    }
    with pytest.raises(WeightsMismatch, match=r"missing \[.*embed_tokens.*unexpected.*same architecture"):
        sampler.update_weights(weights, 1)
    assert sampler.policy_version == 0


def test_on_progress_is_called_once_per_decode_step(char_tokenizer) -> None:
    steps: list[int] = []
    sampler = make_sampler(
        None, _model(char_tokenizer, 1), char_tokenizer, on_progress=lambda: steps.append(1)
    )
    gen = sampler.generate(_prompts(char_tokenizer)[:1], SETTINGS, [0])[0]
    assert len(steps) == len(gen.completion_ids) > 0
