"""The throughput paths compute what the plain paths compute: prefix sharing (sampler and update), the
sampler's in-place cache and lazy row dropping, the padded head rows, and bf16 autocast (close to fp32, not
equal)."""

from __future__ import annotations

import copy

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.logprobs import completion_logprobs, padded_row_count, plan_prefix_sharing, scored_logits
from keelrl.config import TinyModelConfig
from keelrl.models.load import build_tiny_model, compile_decoder
from keelrl.rollout import Rollout, SamplingSettings, hf
from keelrl.rollout.hf import HFSampler
from keelrl.run.distributed import World
from keelrl.step.batch import collate, micro_batches
from keelrl.step.update import forward_logprobs, minibatch_backward

SETTINGS = SamplingSettings(max_new_tokens=16, temperature=1.0)
GROUPS, G = 4, 4


def _prompts(tokenizer) -> list[list[int]]:
    """GROUPS prompts of different lengths, each repeated G times (a GRPO batch)."""
    texts = [f"{i} {i + 3} -> {2 * i}{'0' * i}\n" for i in range(GROUPS)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(G)]


def _rollouts(model, tokenizer, seed: int = 0) -> list[Rollout]:
    prompts = _prompts(tokenizer)
    gens = HFSampler(model, tokenizer).generate(
        prompts, SETTINGS, [seed * 1000 + i for i in range(len(prompts))]
    )
    return [
        Rollout(
            problem_index=i,
            problem={},
            group=i // G,
            prompt_ids=p,
            completion_ids=g.completion_ids,
            sample_logprobs=g.logprobs,
            trainable=[1] * len(g.completion_ids),
            finish_reason=g.finish_reason,
            policy_version=0,
            sampling=SETTINGS,
            advantage=float(i % 3) - 1.0,
        )
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]


@pytest.fixture(scope="module")
def eos_model(tiny_model, char_tokenizer):
    """The tiny model with EOS made likely, so rows finish at different steps (exercises row dropping)."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.get_output_embeddings().weight[char_tokenizer.eos_token_id] *= 0.0
        bias = torch.zeros(model.config.vocab_size)
        bias[char_tokenizer.eos_token_id] = 2.5
        head = model.get_output_embeddings()
        head.bias = torch.nn.Parameter(bias)  # a tied head with a bias: still a plain linear head
    return model


def test_plan_worked_example() -> None:
    # rows 0 and 1 share the prefix [5, 6] (their first scored position is 2); row 2 is alone
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 3, 0], [4, 6, 8, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    scored = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0]], dtype=torch.bool)
    plan = plan_prefix_sharing(ids, attn, scored)
    assert plan is not None
    assert plan.prefix_ids.tolist() == [[5, 6], [4, 0]] and plan.prefix_mask.tolist() == [[1, 1], [1, 0]]
    assert plan.rows.tolist() == [0, 0, 1]
    assert plan.suffix_ids.tolist() == [[7, 8, 9], [7, 3, 0], [6, 8, 0]]
    assert plan.suffix_mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 0]]
    assert plan.suffix_positions.tolist() == [[2, 3, 4], [2, 3, 0], [1, 2, 0]]
    assert plan.suffix_scored.tolist() == [[True, True, False], [True, False, False], [True, False, False]]
    # nothing shared: no plan (the plain forward is used)
    assert plan_prefix_sharing(ids[1:], attn[1:], scored[1:]) is None


def test_shared_prefix_forward_equals_padded_forward(tiny_model, char_tokenizer) -> None:
    model = copy.deepcopy(tiny_model)
    b = collate(_rollouts(model, char_tokenizer), char_tokenizer.pad_token_id, torch.device("cpu"))
    out = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = completion_logprobs(
            model,
            b.input_ids,
            b.attention_mask,
            b.target_mask,
            1.0,
            with_entropy=True,
            entropy_grad=True,
            share_prefix=share,
        )
        w = b.target_mask / b.target_mask.sum()
        ((lp * w).sum() + 0.1 * (ent * w).sum()).backward()
        out[share] = (lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()])
    (lp0, ent0, g0), (lp1, ent1, g1) = out[False], out[True]
    assert float((lp1 - lp0).abs().max()) <= 1e-5 and float((ent1 - ent0).abs().max()) <= 1e-5
    assert all(torch.allclose(a, c, atol=1e-6, rtol=0) for a, c in zip(g0, g1))
    assert any(float(g.abs().max()) > 1e-4 for g in g1)
    assert float(lp1.abs().sum()) > 0 and bool(((lp1 != 0) == b.target_mask.bool()).all())


def _grads(model, batch, micro: int, share: bool, kl_coef: float = 0.1) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    algo = AlgoConfig(loss_agg="token_mean", kl_coef=kl_coef, entropy_coef=0.01)
    stats = minibatch_backward(
        model,
        batch,
        torch.arange(batch.input_ids.shape[0]),
        algo,
        micro,
        1.0,
        16,
        World(),
        share_prefix=share,
    )
    return stats["loss/total"], [p.grad.clone() for p in model.parameters()]


def test_micro_batching_with_shared_prefixes_does_not_change_loss_or_gradient(
    tiny_model, char_tokenizer, perturbed_ref_logprobs, check_kl_term
) -> None:
    model = copy.deepcopy(tiny_model)
    batch = collate(
        _rollouts(model, char_tokenizer, seed=1), char_tokenizer.pad_token_id, torch.device("cpu")
    )
    batch.old_logprobs = (
        batch.sampler_logprobs + 0.3 * torch.randn_like(batch.sampler_logprobs) * batch.target_mask
    )
    batch.ref_logprobs = perturbed_ref_logprobs(model, batch)  # a KL term with a value and a gradient
    ref_loss, ref_grad = _grads(model, batch, 16, share=False)
    for micro in (1, 3, 4, 8, 16):
        loss, grad = _grads(model, batch, micro, share=True)
        assert loss == pytest.approx(ref_loss, abs=1e-6), micro
        assert all(torch.allclose(a, c, atol=1e-6, rtol=0) for a, c in zip(grad, ref_grad)), micro
    check_kl_term(model, batch, lambda kl_coef: _grads(model, batch, 4, True, kl_coef), 0.1, "token_mean", 16)


def test_micro_batches_keep_groups_together(tiny_model, char_tokenizer) -> None:
    batch = collate(_rollouts(tiny_model, char_tokenizer), char_tokenizer.pad_token_id, torch.device("cpu"))
    shuffled = torch.randperm(len(batch.lengths), generator=torch.Generator().manual_seed(0))
    for mb in micro_batches(batch, shuffled, G, group_prompts=True):
        first = int(mb.target_mask[0].nonzero()[0])
        assert all(torch.equal(mb.input_ids[i, :first], mb.input_ids[0, :first]) for i in range(G))


def test_sampler_logprobs_match_trainer_with_shared_prefixes(tiny_model, char_tokenizer) -> None:
    batch = collate(_rollouts(tiny_model, char_tokenizer), char_tokenizer.pad_token_id, torch.device("cpu"))
    trainer_lp = forward_logprobs(tiny_model, batch, micro_batch_size=8, temperature=1.0, share_prefix=True)
    assert float(((trainer_lp - batch.sampler_logprobs) * batch.target_mask).abs().max()) <= 1e-4


def test_sampler_rows_do_not_depend_on_batch_sharing_or_dropping(eos_model, char_tokenizer) -> None:
    prompts = _prompts(char_tokenizer)
    seeds = list(range(100, 100 + len(prompts)))
    shared = HFSampler(eos_model, char_tokenizer).generate(prompts, SETTINGS, seeds)
    plain = HFSampler(eos_model, char_tokenizer, share_prefix=False).generate(prompts, SETTINGS, seeds)
    alone = [
        HFSampler(eos_model, char_tokenizer).generate([p], SETTINGS, [s])[0] for p, s in zip(prompts, seeds)
    ]
    lengths = {len(g.completion_ids) for g in shared}
    assert len(lengths) > 3 and any(g.finish_reason == "eos" for g in shared)  # rows end at different steps
    assert any(g.finish_reason == "length" for g in shared)
    for a, b, c in zip(shared, plain, alone):
        assert a.completion_ids == b.completion_ids == c.completion_ids
        assert a.finish_reason == b.finish_reason == c.finish_reason
        assert max((abs(x - y) for x, y in zip(a.logprobs, c.logprobs)), default=0.0) <= 1e-5
        assert (a.finish_reason == "eos") == (a.completion_ids[-1:] == [char_tokenizer.eos_token_id])
    reversed_gens = HFSampler(eos_model, char_tokenizer, chunk_size=5).generate(
        prompts[::-1], SETTINGS, seeds[::-1]
    )
    assert [g.completion_ids for g in reversed_gens[::-1]] == [g.completion_ids for g in shared]


def test_bf16_autocast_is_close_to_fp32(tiny_model, char_tokenizer) -> None:
    batch = collate(_rollouts(tiny_model, char_tokenizer), char_tokenizer.pad_token_id, torch.device("cpu"))
    fp32 = forward_logprobs(tiny_model, batch, 8, 1.0)
    bf16 = forward_logprobs(tiny_model, batch, 8, 1.0, autocast="bf16")
    gap = ((bf16 - fp32) * batch.target_mask).abs()
    assert 0.0 < float(gap.max()) < 0.2  # bf16 numerics differ, by little
    assert float(gap.sum() / batch.target_mask.sum()) < 0.05
    gens = HFSampler(tiny_model, char_tokenizer, autocast="bf16").generate(
        _prompts(char_tokenizer), SETTINGS, list(range(16))
    )
    assert all(len(g.completion_ids) == len(g.logprobs) > 0 for g in gens)
    assert all(lp <= 0.0 for g in gens for lp in g.logprobs)


def test_bf16_sampler_caches_bf16_and_samples_the_same(eos_model, char_tokenizer, monkeypatch) -> None:
    """Under bf16 autocast the sampler stores keys and values in bf16; the attention casts them to bf16
    anyway, so tokens and log-probs are exactly those of an fp32 cache (rows also finish early here)."""
    made, real = [], hf._new_cache
    prompts, seeds = _prompts(char_tokenizer), list(range(16))
    runs = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):

        def new_cache(model, max_len, kv_dtype=None, dtype=dtype):
            assert kv_dtype == torch.bfloat16  # what a bf16-autocast sampler asks for
            made.append(real(model, max_len, dtype))
            return made[-1]

        monkeypatch.setattr(hf, "_new_cache", new_cache)
        runs[name] = HFSampler(eos_model, char_tokenizer, autocast="bf16").generate(prompts, SETTINGS, seeds)
    dtypes = [{(layer.keys.dtype, layer.values.dtype) for layer in cache.layers} for cache in made]
    assert dtypes == [{(torch.bfloat16, torch.bfloat16)}, {(torch.float32, torch.float32)}]
    assert {g.finish_reason for g in runs["bf16"]} == {"eos", "length"}
    assert [g.completion_ids for g in runs["bf16"]] == [g.completion_ids for g in runs["fp32"]]
    assert [g.logprobs for g in runs["bf16"]] == [g.logprobs for g in runs["fp32"]]


def test_padded_row_count_worked_numbers() -> None:
    # below 32 nothing is padded; from there on, steps of 2 ** (bit_length - 5): 16 sizes per power of two
    assert [padded_row_count(n) for n in (0, 1, 31, 32, 33, 63, 64, 65)] == [0, 1, 31, 32, 34, 64, 64, 68]
    assert [padded_row_count(n) for n in (990, 1015, 1024, 1025)] == [992, 1024, 1024, 1088]
    for n in range(1, 5000):
        assert n <= padded_row_count(n) < n + max(1, n / 16)


def test_padded_head_rows_change_no_logit_or_gradient(tiny_model) -> None:
    """Under bf16 autocast on CPU the head runs on padded rows; the logits and the gradients that reach the
    hidden states and the head are those of the scored rows alone."""
    model = copy.deepcopy(tiny_model)  # gradients land on the head: keep the shared fixture clean
    torch.manual_seed(0)
    hidden = torch.randn(5, 13, model.config.hidden_size)
    scored = torch.rand(5, 13) < 0.8
    n = int(scored.sum())
    assert padded_row_count(n) > n  # the test exercises the padding
    weights = torch.randn(n, model.config.vocab_size)
    head = model.get_output_embeddings()
    rows_seen: list[int] = []
    head.register_forward_hook(lambda module, args, out: rows_seen.append(args[0].shape[0]))
    results = []
    for pad in (True, False):
        h = hidden.clone().requires_grad_(True)
        head.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = scored_logits(model, h, scored) if pad else head(h[scored])
        assert logits.shape == (n, model.config.vocab_size)
        (logits.float() * weights).sum().backward()
        results.append((logits.float(), h.grad, head.weight.grad.clone()))
    assert rows_seen == [padded_row_count(n), n]  # the head did run on the padded rows
    (lp, hp, wp), (lu, hu, wu) = results
    torch.testing.assert_close(lp, lu, rtol=0, atol=0)
    torch.testing.assert_close(hp, hu, rtol=0, atol=0)
    assert bool((hp[~scored] == 0).all())
    torch.testing.assert_close(wp, wu, rtol=1e-2, atol=1e-2)  # bf16 sums over other row counts


def test_eager_attention_equals_sdpa(char_tokenizer) -> None:
    """model.attn_implementation picks the kernel, not the maths: log-probs, gradients and samples agree."""
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=128, init_seed=3)
    eos = char_tokenizer.eos_token_id
    models = {a: build_tiny_model(cfg, len(char_tokenizer), eos, a).eval() for a in ("sdpa", "eager")}
    assert {a: m.config._attn_implementation for a, m in models.items()} == {"sdpa": "sdpa", "eager": "eager"}
    batch = collate(
        _rollouts(models["sdpa"], char_tokenizer, seed=2), char_tokenizer.pad_token_id, torch.device("cpu")
    )
    batch.old_logprobs = batch.sampler_logprobs
    out = {a: _grads(m, batch, 8, share=True) for a, m in models.items()}
    assert out["eager"][0] == pytest.approx(out["sdpa"][0], abs=1e-6)
    assert all(torch.allclose(a, c, atol=1e-6, rtol=0) for a, c in zip(out["eager"][1], out["sdpa"][1]))
    prompts, seeds = _prompts(char_tokenizer), list(range(16))
    sdpa, eager = (HFSampler(models[a], char_tokenizer).generate(prompts, SETTINGS, seeds) for a in models)
    assert [g.completion_ids for g in eager] == [g.completion_ids for g in sdpa]


@pytest.mark.slow
def test_compiled_decoder_matches_eager(tiny_model, char_tokenizer) -> None:
    """train.compile changes the kernels, not the maths: the compiled policy samples the same tokens and
    computes the same log-probs, loss and gradients as the eager one (float rounding apart), through the
    sampler's static cache, the shared-prefix update and the plain padded forward."""
    compiled = copy.deepcopy(tiny_model)
    compile_decoder(compiled)
    prompts, seeds = _prompts(char_tokenizer), list(range(16))
    gens = {
        name: HFSampler(m, char_tokenizer).generate(prompts, SETTINGS, seeds)
        for name, m in (("eager", tiny_model), ("compiled", compiled))
    }
    assert [g.completion_ids for g in gens["compiled"]] == [g.completion_ids for g in gens["eager"]]
    gap = max(
        abs(x - y) for a, b in zip(gens["compiled"], gens["eager"]) for x, y in zip(a.logprobs, b.logprobs)
    )
    assert gap <= 1e-4
    batch = collate(
        _rollouts(tiny_model, char_tokenizer, seed=1), char_tokenizer.pad_token_id, torch.device("cpu")
    )
    batch.old_logprobs = batch.sampler_logprobs
    for share in (True, False):
        loss, grad = _grads(compiled, batch, 8, share=share)
        ref_loss, ref_grad = _grads(copy.deepcopy(tiny_model), batch, 8, share=share)
        assert loss == pytest.approx(ref_loss, abs=1e-5), share
        assert all(torch.allclose(a, c, atol=1e-5, rtol=1e-4) for a, c in zip(grad, ref_grad)), share
        assert any(float(g.abs().max()) > 1e-4 for g in grad)
