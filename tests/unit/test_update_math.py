"""The update's invariants on a real (tiny) model: masks keep EOS, the sampler's log-probs are the
trainer's, and micro-batching does not change the loss or the gradient."""

from __future__ import annotations

import copy

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.losses import LossAgg
from keelrl.algo.offpolicy import behaviour_metrics, correction_weights
from keelrl.rollout import Rollout, SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.run.distributed import World
from keelrl.step.batch import collate
from keelrl.step.update import forward_logprobs, minibatch_backward

SETTINGS = SamplingSettings(max_new_tokens=12, temperature=1.0)


def _rollouts(model, tokenizer, n: int = 8, seed: int = 0) -> list[Rollout]:
    prompts = [
        tokenizer(f"{i} {i + 3} -> {2 * i}\n<answer>", add_special_tokens=False)["input_ids"]
        for i in range(n)
    ]
    gens = HFSampler(model, tokenizer).generate(prompts, SETTINGS, [seed * 1000 + i for i in range(n)])
    out = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        out.append(
            Rollout(
                problem_index=i,
                problem={},
                group=i // 2,
                prompt_ids=p,
                completion_ids=g.completion_ids,
                sample_logprobs=g.logprobs,
                trainable=[1] * len(g.completion_ids),
                finish_reason=g.finish_reason,
                policy_version=0,
                sampling=SETTINGS,
                advantage=float(i % 3) - 1.0,
            )
        )
    return out


def test_mask_comes_from_lengths_and_keeps_eos(char_tokenizer) -> None:
    eos = char_tokenizer.eos_token_id
    assert char_tokenizer.pad_token_id == eos  # the hard case: pad == EOS
    common = dict(problem={}, group=0, finish_reason="eos", policy_version=0, sampling=SETTINGS)
    r = Rollout(
        problem_index=0,
        prompt_ids=[5, 6, 7],
        completion_ids=[8, 9, eos],
        sample_logprobs=[-1.0, -2.0, -3.0],
        trainable=[1, 1, 1],
        **common,
    )
    short = Rollout(
        problem_index=1, prompt_ids=[5], completion_ids=[eos], sample_logprobs=[-0.5], trainable=[1], **common
    )
    b = collate([r, short], pad_id=eos, device=torch.device("cpu"))
    # row 0: positions 2, 3, 4 predict tokens 8, 9, EOS
    assert b.target_mask[0].tolist() == [0, 0, 1, 1, 1, 0]
    assert b.input_ids[0, 5] == eos and b.sampler_logprobs[0, 4] == -3.0
    # row 1 is padded with EOS ids, but only its real EOS (position 0 -> 1) is a target
    assert b.target_mask[1].tolist() == [1, 0, 0, 0, 0, 0]
    assert b.input_ids[1].tolist() == [5, eos, eos, eos, eos, eos]


def test_sampler_logprobs_match_trainer(tiny_model, char_tokenizer) -> None:
    rollouts = _rollouts(tiny_model, char_tokenizer)
    batch = collate(rollouts, char_tokenizer.pad_token_id, torch.device("cpu"))
    trainer_lp = forward_logprobs(tiny_model, batch, micro_batch_size=3, temperature=SETTINGS.temperature)
    gap = ((trainer_lp - batch.sampler_logprobs) * batch.target_mask).abs().max()
    assert float(gap) <= 1e-4
    assert batch.target_mask.sum() == sum(len(r.completion_ids) for r in rollouts)


def test_first_epoch_ratio_is_one_and_nothing_is_clipped(tiny_model, char_tokenizer) -> None:
    model = copy.deepcopy(tiny_model)
    batch = collate(_rollouts(model, char_tokenizer), char_tokenizer.pad_token_id, torch.device("cpu"))
    batch.old_logprobs = batch.sampler_logprobs
    stats = minibatch_backward(model, batch, torch.arange(8), AlgoConfig(), 4, 1.0, 12, World())
    assert stats["ratio/max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["clipfrac/low"] == 0.0 and stats["clipfrac/high"] == 0.0
    assert stats["kl/old"] < 1e-8


def _grads(
    model, batch, micro: int, agg: LossAgg, kl_coef: float = 0.5, objective: str = "ppo_clip"
) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    algo = AlgoConfig(
        loss_agg=agg,
        kl_coef=kl_coef,
        entropy_coef=0.01,
        objective=objective,
        seq_clip_low=0.1,
        seq_clip_high=0.1,
    )
    stats = minibatch_backward(
        model, batch, torch.arange(batch.input_ids.shape[0]), algo, micro, 1.0, 12, World()
    )
    return stats["loss/total"], [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "constant"])
def test_micro_batching_does_not_change_loss_or_gradient(
    tiny_model, char_tokenizer, perturbed_ref_logprobs, check_kl_term, agg: LossAgg
) -> None:
    model = copy.deepcopy(tiny_model)
    batch = collate(
        _rollouts(model, char_tokenizer, n=8, seed=1), char_tokenizer.pad_token_id, torch.device("cpu")
    )
    # an off-policy batch, so clipping and the ratio matter
    batch.old_logprobs = (
        batch.sampler_logprobs + 0.3 * torch.randn_like(batch.sampler_logprobs) * batch.target_mask
    )
    batch.ref_logprobs = perturbed_ref_logprobs(model, batch)  # a KL term with a value and a gradient
    loss_1, g1 = _grads(model, batch, 1, agg)
    loss_4, g4 = _grads(model, batch, 4, agg)
    loss_8, g8 = _grads(model, batch, 8, agg)
    assert loss_1 == pytest.approx(loss_8, abs=1e-6) and loss_4 == pytest.approx(loss_8, abs=1e-6)
    for a, b, c in zip(g1, g4, g8):
        assert torch.allclose(a, c, atol=1e-6, rtol=0) and torch.allclose(b, c, atol=1e-6, rtol=0)
    assert any(float(g.abs().max()) > 1e-4 for g in g8)  # the gradient is not trivially zero
    check_kl_term(model, batch, lambda kl_coef: _grads(model, batch, 4, agg, kl_coef), 0.5, agg, 12)


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "cispo"])
def test_micro_batching_does_not_change_any_objective(tiny_model, char_tokenizer, objective: str) -> None:
    """The real forward path (prefix sharing, padding) with each objective and importance weights that drop
    some tokens: 1, 4 or 8 rows per micro-batch give the same loss and gradient."""
    model = copy.deepcopy(tiny_model)
    batch = collate(
        _rollouts(model, char_tokenizer, n=8, seed=2), char_tokenizer.pad_token_id, torch.device("cpu")
    )
    batch.old_logprobs = (
        batch.sampler_logprobs + 0.2 * torch.randn_like(batch.sampler_logprobs) * batch.target_mask
    )
    batch.is_weights = (torch.rand_like(batch.sampler_logprobs) > 0.2).float()  # an importance mask
    results = [_grads(model, batch, micro, "seq_mean_token_mean", 0.0, objective) for micro in (1, 4, 8)]
    (loss_8, g8) = results[-1]
    for loss, grads in results[:-1]:
        assert loss == pytest.approx(loss_8, abs=1e-6)
        assert all(torch.allclose(a, c, atol=1e-6, rtol=0) for a, c in zip(grads, g8))
    assert any(float(g.abs().max()) > 1e-4 for g in g8)


def test_micro_batching_does_not_change_the_critic(tiny_model, char_tokenizer) -> None:
    """gae: per-token advantages from a value model; the policy's and the critic's gradients and the value loss
    are the same for 1, 4 or 8 rows per micro-batch."""
    from keelrl.step.critic import ValueModel, critic_advantages

    model = copy.deepcopy(tiny_model)
    rollouts = _rollouts(model, char_tokenizer, n=8, seed=3)
    for i, r in enumerate(rollouts):
        r.reward = float(i % 3)
    batch = collate(rollouts, char_tokenizer.pad_token_id, torch.device("cpu"))
    batch.old_logprobs = batch.sampler_logprobs
    critic = ValueModel(copy.deepcopy(tiny_model))
    torch.nn.init.normal_(critic.head.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    algo = AlgoConfig(advantage="gae", lam=0.9, value_clip=0.05)
    metrics, abs_mean = critic_advantages(critic, batch, rollouts, algo, World(), 4, "off")
    assert batch.advantages.shape == batch.target_mask.shape and abs_mean > 0
    assert metrics["critic/value_mean"] != 0.0
    with torch.no_grad():  # the critic moves away from the values the batch was scored with: clipping matters
        critic.head.weight.add_(0.3)
    results = []
    for micro in (1, 4, 8):
        model.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        stats = minibatch_backward(
            model, batch, torch.arange(8), algo, micro, 1.0, 12, World(), critic=critic
        )
        policy_grads = [p.grad.clone() for p in model.parameters()]
        critic_grads = [p.grad.clone() for p in critic.parameters()]
        results.append((stats["critic/value_loss"], stats["critic/clipfrac"], policy_grads, critic_grads))
    loss_8, clip_8, p8, c8 = results[-1]
    assert loss_8 > 0 and 0 < clip_8 < 1
    for loss, clip, pg, cg in results[:-1]:
        assert loss == pytest.approx(loss_8, rel=1e-6) and clip == pytest.approx(clip_8, abs=1e-6)
        assert all(torch.allclose(a, c, atol=1e-6, rtol=0) for a, c in zip(pg, p8))
        # the critic's gradients reach 46 here (the policy's 0.2): padding to other lengths moves their last bits
        assert all(torch.allclose(a, c, atol=1e-5, rtol=1e-4) for a, c in zip(cg, c8))


def test_a_shared_critic_sends_the_value_loss_into_the_policy_trunk(tiny_model, char_tokenizer) -> None:
    """critic = "shared": the head sits on the policy's own decoder; the value loss's gradient reaches the
    trunk, scaled by value_coef (double it, double the gradient), and only the head is the critic's to save."""
    from keelrl.algo.losses import token_weights
    from keelrl.step.critic import ValueModel, critic_advantages, critic_backward

    model = copy.deepcopy(tiny_model)
    rollouts = _rollouts(model, char_tokenizer, n=8, seed=4)
    for i, r in enumerate(rollouts):
        r.reward = float(i % 2)
    batch = collate(rollouts, char_tokenizer.pad_token_id, torch.device("cpu"))
    critic = ValueModel(model, shared=True)
    assert set(critic.state_dict()) == {"head.weight", "head.bias"}
    assert {id(p) for p in critic.parameters()} == {id(critic.head.weight), id(critic.head.bias)}
    torch.nn.init.normal_(critic.head.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    critic_advantages(critic, batch, rollouts, AlgoConfig(advantage="gae"), World(), 4, "off")
    mw = token_weights(batch.target_mask, "token_mean", float(batch.target_mask.sum()), 8.0, 12)
    grads = {}
    for coef in (0.1, 0.2):
        model.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        algo = AlgoConfig(advantage="gae", critic="shared", value_coef=coef)
        critic_backward(critic, batch, mw, algo, 1.0, "off")
        grads[coef] = [p.grad.clone() for p in model.get_decoder().parameters() if p.grad is not None]
    assert grads[0.1] and any(float(g.abs().max()) > 1e-6 for g in grads[0.1])  # the trunk learns from it
    for a, b in zip(grads[0.1], grads[0.2], strict=True):
        torch.testing.assert_close(b, 2 * a, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("correction", ["tis", "decoupled", "mis", "off"])
def test_proximal_from_the_update_forward_equals_a_recompute(
    tiny_model, char_tokenizer, correction: str
) -> None:
    """One optimizer step per batch: pi_prox is the policy the update's forward runs, so taking its log-probs
    from that forward (old_logprobs None) gives the recompute path's loss, gradient and behaviour metrics, on a
    stale batch (sampler log-probs from another policy) with micro-batches cut differently from the recompute."""
    model = copy.deepcopy(tiny_model)
    batch = collate(
        _rollouts(model, char_tokenizer, n=8, seed=2), char_tokenizer.pad_token_id, torch.device("cpu")
    )
    batch.sampler_logprobs = (
        batch.sampler_logprobs + 0.4 * torch.randn_like(batch.sampler_logprobs) * batch.target_mask
    )
    algo = AlgoConfig(correction=correction, is_cap=1.5)
    results = []
    for deferred in (True, False):
        model.zero_grad(set_to_none=True)
        batch.old_logprobs, batch.is_weights = None, None
        extra: dict[str, float] = {}
        if not deferred:
            batch.old_logprobs = forward_logprobs(model, batch, micro_batch_size=3, temperature=1.0)
            w, sums = correction_weights(batch.old_logprobs, batch.sampler_logprobs, batch.target_mask, algo)
            batch.is_weights = w if correction != "off" else None
            extra = behaviour_metrics(sums)
        stats = minibatch_backward(model, batch, torch.arange(8), algo, 4, 1.0, 12, World())
        results.append(({**stats, **extra}, [p.grad.clone() for p in model.parameters()]))
    (deferred_stats, g_deferred), (recompute_stats, g_recompute) = results
    for key in ("loss/total", "behaviour/ess", "behaviour/ratio_mean", "behaviour/cut_frac", "mismatch/kl"):
        assert deferred_stats[key] == pytest.approx(recompute_stats[key], abs=1e-5), key
    assert deferred_stats["behaviour/ess"] < 0.99  # the batch really is off-policy
    for a, b in zip(g_deferred, g_recompute):
        assert torch.allclose(a, b, atol=1e-6)
