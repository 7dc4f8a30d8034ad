"""LoRA (keelrl/models/lora.py): the config's checks, the adapters going in (base frozen, policy starting as the base),
the merged weights (what engines with their own copy and the final export get) equal to base + adapters in
log-probs to 1e-5 (fp32), the peft adapter directory loading with peft, and exact adapter round trips."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from pydantic import ValidationError

from keelrl.algo.logprobs import completion_logprobs
from keelrl.config import Config, LoraConfig, ModelConfig
from keelrl.models import lora
from keelrl.models.load import load_policy, save_hf_dir
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.run.checkpoint import weights_sha256

peft = pytest.importorskip("peft")

LORA = LoraConfig(rank=4, alpha=8.0)


def _adapted(model: torch.nn.Module, cfg: LoraConfig = LORA, scale: float = 0.3) -> torch.nn.Module:
    """A LoRA copy of `model` whose B matrices are non-zero (as after training), so the adapters matter."""
    policy = copy.deepcopy(model)
    lora.apply_lora(policy, cfg, "tiny")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return policy


def _batch(vocab: int, rows: int = 3, length: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    target = torch.zeros_like(ids)
    target[:, 5:] = 1  # positions 5.. predict "completion" tokens
    return ids, mask, target


def _logprobs(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = completion_logprobs(model, *batch, temperature=1.0)
    return lp


def test_config_defaults_off_and_refuses_what_cannot_work() -> None:
    assert Config().model.lora.rank == 0 and Config().model.lora.target_modules == "all-linear"
    with pytest.raises(ValidationError, match=r"would never act.*eval mode"):
        LoraConfig(rank=8, dropout=0.05)
    with pytest.raises(ValidationError, match="at least one module"):
        LoraConfig(rank=8, target_modules=[""])
    with pytest.raises(ValidationError):
        LoraConfig(rank=-1)
    with pytest.raises(ValidationError):
        LoraConfig(rank=8, alpha=0)
    assert LoraConfig(rank=8, target_modules=["q_proj", "v_proj"]).target_modules == ["q_proj", "v_proj"]


def test_apply_freezes_the_base_and_starts_as_the_base(tiny_model) -> None:
    batch = _batch(tiny_model.config.vocab_size)
    policy = copy.deepcopy(tiny_model)
    record = lora.apply_lora(policy, LORA, "tiny")
    assert record == {"path": "tiny", "weights_sha256": weights_sha256(tiny_model)}
    assert lora.base_sha256(policy) == weights_sha256(tiny_model)  # the base's hash, adapters or not
    trained = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    # every linear projection of both layers (attention q k v o, MLP gate up down), not the head
    assert len(trained) == 2 * 2 * 7 and not any("lm_head" in n for n in trained)
    assert lora.has_lora(policy) and not lora.has_lora(tiny_model)
    assert torch.equal(_logprobs(policy, batch), _logprobs(tiny_model, batch))  # B = 0: the base exactly
    # the adapters' initial A comes from model.lora.init_seed, whatever the global RNG holds
    again, other = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    torch.manual_seed(123)
    lora.apply_lora(again, LORA, "tiny")
    lora.apply_lora(other, LORA.model_copy(update={"init_seed": 1}), "tiny")
    assert weights_sha256(again) == weights_sha256(policy) != weights_sha256(other)
    summary = lora.lora_summary(policy)
    assert summary["adapter_parameters"] == sum(
        p.numel() for n, p in policy.named_parameters() if n in trained
    )


def test_target_modules_that_match_nothing_name_the_layers(tiny_model) -> None:
    with pytest.raises(lora.LoraError, match=r"q_proj.*use 'all-linear'"):
        lora.apply_lora(copy.deepcopy(tiny_model), LoraConfig(rank=4, target_modules=["qkv"]), "tiny")
    policy = copy.deepcopy(tiny_model)
    lora.apply_lora(policy, LoraConfig(rank=4, target_modules=["q_proj", "v_proj"]), "tiny")
    assert {n.split(".")[-4] for n, p in policy.named_parameters() if p.requires_grad} == {"q_proj", "v_proj"}


def test_missing_peft_says_how_to_install(monkeypatch, tiny_model) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(ImportError, match=r"pip install keelrl\[peft\]"):
        lora.apply_lora(copy.deepcopy(tiny_model), LORA, "tiny")


def test_merged_weights_equal_base_plus_adapters_and_leave_the_policy(tiny_model) -> None:
    batch = _batch(tiny_model.config.vocab_size)
    policy = _adapted(tiny_model)
    before = weights_sha256(policy)
    merged = lora.merged_state_dict(policy)
    assert weights_sha256(policy) == before  # nothing in the policy changed
    assert merged.keys() == untied_state_dict(tiny_model).keys()  # the base model's names
    plain = copy.deepcopy(tiny_model)
    plain.load_state_dict(merged, strict=False)
    expected = _logprobs(policy, batch)
    assert float((expected - _logprobs(tiny_model, batch)).abs().max()) > 1e-2  # the adapters matter
    assert float((_logprobs(plain, batch) - expected).abs().max()) < 1e-5
    # a single adapted weight is W + (alpha / r) B @ A, by hand
    q = policy.model.layers[0].self_attn.q_proj
    by_hand = q.base_layer.weight + (8.0 / 4) * q.lora_B["default"].weight @ q.lora_A["default"].weight
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], by_hand, atol=1e-7)
    assert not any(t.requires_grad for t in merged.values())


def test_merged_export_loads_as_a_plain_model_with_the_same_logprobs(
    tiny_model, char_tokenizer, tmp_path
) -> None:
    """final/: merged HF weights, loadable by transformers and keelrl as a normal model directory, equal in
    log-probs to base + adapters (1e-5, fp32); final/adapter/: loads onto the base with peft, the same."""
    batch = _batch(tiny_model.config.vocab_size)
    policy = _adapted(tiny_model)
    expected = _logprobs(policy, batch)
    save_hf_dir(lora.merged_model(policy), char_tokenizer, tmp_path / "final")
    assert lora.has_lora(policy)  # the export did not unmerge or strip the policy
    loaded, _ = load_policy(ModelConfig(path=str(tmp_path / "final")))
    assert not lora.has_lora(loaded) and not (tmp_path / "final" / lora.ADAPTER_CONFIG).exists()
    assert float((_logprobs(loaded, batch) - expected).abs().max()) < 1e-5

    lora.save_adapter_dir(policy, tmp_path / "adapter", "tiny")
    with_peft = peft.PeftModel.from_pretrained(copy.deepcopy(tiny_model), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        logits = with_peft(input_ids=batch[0], attention_mask=batch[1]).logits
        mine = policy(input_ids=batch[0], attention_mask=batch[1]).logits
    assert torch.allclose(logits, mine, atol=1e-6)
    merged_by_peft = with_peft.merge_and_unload()
    assert float((_logprobs(merged_by_peft, batch) - expected).abs().max()) < 1e-5


def test_adapter_round_trip_is_exact_and_refuses_other_shapes(tiny_model) -> None:
    trained = _adapted(tiny_model)
    fresh = copy.deepcopy(tiny_model)
    lora.apply_lora(fresh, LORA, "tiny")
    saved = {k: v.clone() for k, v in lora.adapter_state_dict(trained).items()}
    assert all(k.startswith("base_model.model.") and ".default." not in k for k in saved)
    lora.load_adapter(fresh, saved)
    assert weights_sha256(fresh) == weights_sha256(trained)
    wider = copy.deepcopy(tiny_model)
    lora.apply_lora(wider, LoraConfig(rank=8), "tiny")
    with pytest.raises(lora.LoraError, match="other shapes"):
        lora.load_adapter(wider, saved)
    fewer = copy.deepcopy(tiny_model)
    lora.apply_lora(fewer, LoraConfig(rank=4, target_modules=["q_proj"]), "tiny")
    with pytest.raises(lora.LoraError, match="unexpected"):
        lora.load_adapter(fewer, saved)


def test_a_sampler_with_its_own_copy_samples_what_the_adapted_policy_samples(
    tiny_model, char_tokenizer
) -> None:
    """The in-process sampler samples the LoRA policy itself; an engine holding the base architecture gets the
    merged weights pushed (as weight_sync does) and samples the same tokens, with log-probs within 1e-5."""
    policy = _adapted(tiny_model)
    own = HFSampler(policy, char_tokenizer)
    own.update_weights(untied_state_dict(policy).items(), 1)  # its own tensors: nothing copied
    other = HFSampler(copy.deepcopy(tiny_model), char_tokenizer)
    other.update_weights(lora.sampler_weights(policy).items(), 1)
    prompts = [char_tokenizer.encode(p) for p in ("3*4\n", "7*8\n", "2*9\n")]
    settings, seeds = SamplingSettings(max_new_tokens=12, temperature=1.0), [11, 12, 13]
    a, b = own.generate(prompts, settings, seeds), other.generate(prompts, settings, seeds)
    base = HFSampler(copy.deepcopy(tiny_model), char_tokenizer).generate(prompts, settings, seeds)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    assert [g.completion_ids for g in a] != [g.completion_ids for g in base]  # the adapters change sampling
    for x, y in zip(a, b):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
