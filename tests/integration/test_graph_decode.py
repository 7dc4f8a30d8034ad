"""The hf engine's compiled decode (`decode = "graph"`, what `auto` picks on CUDA), run on CPU: the same
torch.compile(mode="reduce-overhead") step over a static batch and a cache at one address that a GPU runs
as CUDA graphs (there inductor's kernels are captured; here they run as compiled C++). It must sample what
the eager decode samples for the same seeds, token for token, while rows end at different steps, prompts
share prefixes and a chunk is padded to the compiled shape, and compile each shape once."""

from __future__ import annotations

import copy

import pytest
import torch

from keelrl.config import config_from_dict
from keelrl.rollout import SamplingSettings, make_sampler
from keelrl.rollout.hf import HFSampler


@pytest.fixture(scope="module")
def eos_model(tiny_model, char_tokenizer):
    """The tiny model with EOS made likely, so rows finish at different steps."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        bias = torch.zeros(model.config.vocab_size)
        bias[char_tokenizer.eos_token_id] = 2.0
        model.get_output_embeddings().bias = torch.nn.Parameter(bias)
    return model


def test_graph_decode_samples_what_eager_decode_samples(eos_model, char_tokenizer) -> None:
    enc = char_tokenizer.encode
    prompts = [enc(f"{a}+{b}=") for a, b in [(3, 14), (27, 5), (100, 9), (8, 61)]] * 3  # groups of 3
    prompts += [enc("12*34=")]  # one longer prompt: the batch is left-padded
    seeds = list(range(200, 200 + len(prompts)))
    settings = SamplingSettings(max_new_tokens=20, temperature=1.0)
    eager = HFSampler(eos_model, char_tokenizer, decode="eager").generate(prompts, settings, seeds)
    graph_sampler = HFSampler(eos_model, char_tokenizer, chunk_size=8, decode="graph")
    graph = graph_sampler.generate(prompts, settings, seeds)  # chunks of 8 and 5 rows, the 5 padded to 8
    again = graph_sampler.generate(prompts, settings, seeds)
    assert {len(g.completion_ids) for g in eager} != {20}  # some rows end early, at different steps
    assert any(g.finish_reason == "eos" for g in eager) and any(g.finish_reason == "length" for g in eager)
    for e, g, a in zip(eager, graph, again, strict=True):
        assert e.completion_ids == g.completion_ids == a.completion_ids
        assert e.finish_reason == g.finish_reason
        assert max((abs(x - y) for x, y in zip(e.logprobs, g.logprobs)), default=0.0) < 1e-4
    # one compiled step per (rows padded to a power of two, cache length rounded up to 64), reused
    assert list(graph_sampler._graphs) == [(8, 64)]
    # greedy decoding: the same tokens as eager, and as the sampler built from a config that asks for graph
    greedy = SamplingSettings(max_new_tokens=12, temperature=0.0)
    cfg = config_from_dict({"rollout": {"decode": "graph", "chunk_size": 8}}, "graph_decode")
    from_cfg = make_sampler(cfg, eos_model, char_tokenizer)
    assert from_cfg.decode == "graph"
    want = HFSampler(eos_model, char_tokenizer).generate(prompts, greedy, seeds)  # auto: eager on CPU
    got = from_cfg.generate(prompts, greedy, seeds)
    assert [g.completion_ids for g in got] == [w.completion_ids for w in want]
