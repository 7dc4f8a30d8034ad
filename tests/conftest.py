"""Shared fixtures: tiny models built locally (no hub access), and a quiet torch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from keelrl.config import TinyModelConfig
from keelrl.models import build_char_tokenizer, build_tiny_model, save_hf_dir

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(char_tokenizer):
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=128, init_seed=3),
        len(char_tokenizer),
        char_tokenizer.eos_token_id,
    )
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model, char_tokenizer) -> Path:
    out = tmp_path_factory.mktemp("tiny_model")
    save_hf_dir(tiny_model, char_tokenizer, out)
    return out
