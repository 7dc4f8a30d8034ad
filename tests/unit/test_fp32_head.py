"""model.fp32_head: the output head computes in float32 under bf16 autocast and with bf16 weights; names,
tying, deep copies and gradients are unchanged."""

from __future__ import annotations

import copy

import torch

from keelrl.config import ModelConfig, TinyModelConfig
from keelrl.models.load import load_policy, use_fp32_head

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=32, init_seed=2)
IDS = torch.tensor([[3, 5, 7, 9, 11, 2], [4, 6, 8, 10, 12, 14]])


def test_the_head_runs_in_fp32_under_bf16_autocast() -> None:
    plain, _ = load_policy(ModelConfig(path="tiny", tiny=TINY))
    fp32, _ = load_policy(ModelConfig(path="tiny", tiny=TINY, fp32_head=True))
    assert list(fp32.state_dict()) == list(plain.state_dict())  # the same names: checkpoints and pushes agree
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = fp32.get_decoder()(input_ids=IDS).last_hidden_state
        logits = fp32(input_ids=IDS).logits
        assert plain(input_ids=IDS).logits.dtype == torch.bfloat16
    assert logits.dtype == torch.float32
    head = fp32.get_output_embeddings().weight
    torch.testing.assert_close(logits, hidden.float() @ head.float().T, rtol=0, atol=1e-6)  # fp32 matmul
    bf16_head = (hidden.to(torch.bfloat16) @ head.to(torch.bfloat16).T).float()
    assert (bf16_head - logits).abs().max() > 1e-3  # what the plain head would have rounded away


def test_bf16_weights_get_fp32_logits_and_bf16_gradients() -> None:
    model, _ = load_policy(ModelConfig(path="tiny", tiny=TINY, dtype="bfloat16", fp32_head=True))
    logits = model(input_ids=IDS).logits
    assert logits.dtype == torch.float32
    torch.log_softmax(logits, -1)[..., 0].sum().backward()
    grad = model.get_output_embeddings().weight.grad
    assert grad is not None and grad.dtype == torch.bfloat16 and grad.abs().sum() > 0


def test_a_deep_copy_uses_its_own_head() -> None:
    model, _ = load_policy(ModelConfig(path="tiny", tiny=TINY))
    use_fp32_head(model)
    twin = copy.deepcopy(model)
    before = model(input_ids=IDS).logits
    with torch.no_grad():
        twin.get_output_embeddings().weight.mul_(2.0)
    torch.testing.assert_close(model(input_ids=IDS).logits, before)  # the original is untouched
    assert not torch.allclose(twin(input_ids=IDS).logits, before)  # the copy reads its own (doubled) weight
