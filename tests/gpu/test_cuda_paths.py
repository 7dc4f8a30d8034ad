"""The CUDA path's promises on one GPU (marked `gpu`: skipped without CUDA; `benchmarks/gpu_check.sh` runs
them): the trainer's log-probs on CUDA equal the CPU's, the in-process sampler's log-probs on CUDA are the
trainer's (its default decode there: the compiled step, CUDA graphs), the compiled decode samples the eager
decode's tokens in fp32, and the CUDA RNG state is captured and restored with the rest of TrainState's RNGs."""

from __future__ import annotations

import pytest
import torch

from keelrl.config import TinyModelConfig
from keelrl.models.load import build_char_tokenizer, build_tiny_model
from keelrl.rollout import make_sampler
from keelrl.rollout.sync_check import logprob_gap, trainer_logprobs
from keelrl.rollout.types import SamplingSettings
from keelrl.run.state import capture_rng, restore_rng

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _model() -> tuple[torch.nn.Module, object]:
    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4), len(tok), tok.eos_token_id
    )
    return model.eval(), tok


def test_trainer_logprobs_on_cuda_equal_the_cpu() -> None:
    model, tok = _model()
    prompts = [tok("12 7 -> 84\n")["input_ids"], tok("3 9 -> 27\n")["input_ids"]]
    completions = [tok("<answer>12*7</answer>")["input_ids"], tok("<answer>9*3")["input_ids"]]
    cpu = trainer_logprobs(model, prompts, completions, 1.0)
    gpu = trainer_logprobs(model.cuda(), prompts, completions, 1.0)
    assert logprob_gap(cpu, gpu).max < 1e-4


def test_sampler_on_cuda_reports_the_trainers_logprobs() -> None:
    model, tok = _model()
    model = model.cuda()
    sampler = make_sampler(None, model, tok)
    prompts = [tok(f"{a} {b} -> {a * b}\n")["input_ids"] for a, b in ((12, 7), (3, 9), (40, 2))]
    gens = sampler.generate(prompts, SamplingSettings(max_new_tokens=16, temperature=1.0), seeds=[1, 2, 3])
    trainer = trainer_logprobs(model, prompts, [g.completion_ids for g in gens], 1.0)
    gap = logprob_gap(trainer, [g.logprobs for g in gens])
    assert gap.tokens > 0 and gap.max < 1e-3


def test_graph_decode_on_cuda_samples_the_eager_tokens() -> None:
    from keelrl.rollout.hf import HFSampler

    model, tok = _model()
    model = model.cuda()
    prompts = [tok(f"{a} {b} -> {a * b}\n")["input_ids"] for a in (3, 12, 40) for b in (2, 7, 9)] * 2
    settings, seeds = SamplingSettings(max_new_tokens=20, temperature=1.0), list(range(18))
    graph = HFSampler(model, tok, decode="graph")
    got = graph.generate(prompts, settings, seeds)
    want = HFSampler(model, tok, decode="eager").generate(prompts, settings, seeds)
    assert [g.completion_ids for g in got] == [w.completion_ids for w in want]
    assert list(graph._graphs) == [(32, 64)]  # 18 rows padded to 32; the cache rounded up to 64


def test_cuda_rng_is_captured_and_restored() -> None:
    torch.cuda.manual_seed_all(123)
    state = capture_rng()
    assert "cuda" in state
    first = torch.rand(4, device="cuda")
    restore_rng(state)
    assert torch.equal(torch.rand(4, device="cuda"), first)
