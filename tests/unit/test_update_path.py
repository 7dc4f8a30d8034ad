"""The update path against independent references: every expected value here is computed from its definition
with plain torch (the model's own padded forward, log_softmax, the PPO, TIS, behaviour-clip and KL formulas
written out), never by another keelrl code path. Micro-batching tests that compare keelrl with itself cannot
see a slip both paths share (a normaliser over the whole batch, a behaviour ratio inverted, an advantage sign
flipped in the clip); these can.

- `minibatch_backward`: a mini-batch (6 of 8 rows) of a stale batch, its proximal policy from the update's own
  forward, TIS, the behaviour clip and the KL term on: loss and gradient equal the reference for micro-batches
  of 1, 4 and 6 rows.
- `prepare_batch`, recompute path: the proximal log-probs are the model's, the weights min(pi_prox / pi_sampler,
  C) on trainable tokens; stale batches (max_staleness >= 1) recompute too; correction "off" gives no weights.
- `rl_update` on a real run: ppo_epochs x minibatches optimizer steps, the later passes on a moved policy.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.config import load_config
from keelrl.rollout import Rollout, SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.run.distributed import World
from keelrl.step.batch import TrainBatch, collate
from keelrl.step.update import minibatch_backward, prepare_batch, rl_update

SETTINGS = SamplingSettings(max_new_tokens=10, temperature=1.0)
MAX_NEW = 16  # the constant normaliser's length (rollout.max_new_tokens), unlike the completions' 10 tokens
ADV = [1.0, -1.0, 0.5, -2.0, 1.5, -0.5, 2.0, -1.5]


def rollouts(model, tokenizer, seed: int = 0) -> list[Rollout]:
    prompts = [tokenizer(f"{i}+{i * 7 % 10}=", add_special_tokens=False)["input_ids"] for i in range(8)]
    gens = HFSampler(model, tokenizer).generate(prompts, SETTINGS, [seed * 100 + i for i in range(8)])
    return [
        Rollout(
            problem_index=i,
            problem={},
            group=i // 4,
            prompt_ids=p,
            completion_ids=g.completion_ids,
            sample_logprobs=g.logprobs,
            trainable=[1] * len(g.completion_ids),
            finish_reason=g.finish_reason,
            policy_version=0,
            sampling=SETTINGS,
            advantage=ADV[i],
        )
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]


def reference_logprobs(model, batch: TrainBatch) -> torch.Tensor:
    """[B, T] log softmax(logits)[next token] at every position, from the model's plain padded forward
    (position t predicts token t + 1; the last position predicts nothing)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()  # [B, T, V]
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([lp, torch.zeros(lp.shape[0], 1)], dim=1)  # [B, T]


def reference_loss(
    model, batch: TrainBatch, idx: torch.Tensor, algo: AlgoConfig
) -> tuple[torch.Tensor, dict]:
    """PPO-clip normalised over the mini-batch's own rows (token_mean: its trainable tokens; seq_mean_token_mean:
    each row's token mean, averaged over its rows; constant: its rows x MAX_NEW), TIS against the sampler with the
    behaviour clip, k3 times the ratio to the reference; pi_prox = the current policy (one optimizer step)."""
    lp = reference_logprobs(model, batch)[idx]  # [b, T]
    mask, sampler, ref = batch.target_mask[idx], batch.sampler_logprobs[idx], batch.ref_logprobs[idx]
    adv = batch.advantages[idx][:, None]  # [b, 1]
    prox = lp.detach()
    ratio = torch.exp(lp - prox)  # 1, with the gradient of log pi
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high))
    rho = torch.exp(prox - sampler)  # pi_prox / pi_sampler
    weight = rho.clamp(max=algo.is_cap)
    moved = ((adv > 0) & (rho > 1 + algo.clip_high)) | ((adv < 0) & (rho < 1 - algo.clip_low))
    log_r = ref - lp
    kl = ratio * (torch.exp(log_r) - 1 - log_r)
    per_token = (pg * weight * (~moved) + algo.kl_coef * kl) * mask  # [b, T]
    if algo.loss_agg == "token_mean":
        loss = per_token.sum() / mask.sum()
    elif algo.loss_agg == "seq_mean_token_mean":
        loss = (per_token.sum(1) / mask.sum(1)).mean()
    else:
        loss = per_token.sum() / (len(idx) * MAX_NEW)
    facts = {
        "dropped_pos": int(((adv > 0) & moved & (mask > 0)).sum()),
        "dropped_neg": int(((adv < 0) & moved & (mask > 0)).sum()),
        "truncated": int(((rho > algo.is_cap) & ~moved & (mask > 0)).sum()),
    }
    return loss, facts


@pytest.fixture
def stale_batch(tiny_model, char_tokenizer):
    """A batch whose sampler log-probs are another policy's (noise 0.5 per token), a reference that differs."""
    model = copy.deepcopy(tiny_model)
    batch = collate(rollouts(model, char_tokenizer), char_tokenizer.pad_token_id, torch.device("cpu"))
    noise = torch.randn(batch.sampler_logprobs.shape, generator=torch.Generator().manual_seed(0))
    batch.sampler_logprobs = batch.sampler_logprobs + 0.5 * noise * batch.target_mask
    with torch.no_grad():
        batch.ref_logprobs = batch.sampler_logprobs + 0.3 * torch.randn(
            batch.sampler_logprobs.shape, generator=torch.Generator().manual_seed(1)
        )
    return model, batch


@pytest.mark.parametrize(
    "micro, agg",
    [(1, "token_mean"), (4, "token_mean"), (6, "token_mean"), (4, "seq_mean_token_mean"), (4, "constant")],
)
def test_minibatch_backward_equals_the_reference(stale_batch, micro: int, agg: str) -> None:
    model, batch = stale_batch
    idx = torch.tensor([0, 2, 3, 5, 6, 7])  # a mini-batch: rows 1 and 4 belong to another
    algo = AlgoConfig(correction="tis", is_cap=1.5, kl_coef=0.2, behaviour_clip=True, loss_agg=agg)
    model.zero_grad(set_to_none=True)
    want, facts = reference_loss(model, batch, idx, algo)
    want.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    # the case exercises every branch: tokens dropped on both sides, tokens truncated at the cap
    assert facts["dropped_pos"] > 0 and facts["dropped_neg"] > 0 and facts["truncated"] > 0, facts
    model.zero_grad(set_to_none=True)
    stats = minibatch_backward(model, batch, idx, algo, micro, 1.0, MAX_NEW, World())
    assert stats["loss/total"] == pytest.approx(float(want.detach()), abs=1e-6)
    assert stats["clipfrac/behaviour"] == pytest.approx(
        (facts["dropped_pos"] + facts["dropped_neg"]) / float(batch.target_mask[idx].sum())
    )
    for got, exp in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-6)
    assert max(float(g.abs().max()) for g in expected) > 1e-3


def test_without_the_behaviour_clip_or_without_a_correction_nothing_is_dropped(stale_batch) -> None:
    model, batch = stale_batch
    idx = torch.arange(8)
    for algo in (AlgoConfig(behaviour_clip=False), AlgoConfig(correction="off")):
        stats = minibatch_backward(model, batch, idx, algo, 4, 1.0, SETTINGS.max_new_tokens, World())
        assert "clipfrac/behaviour" not in stats
    # correction off: the policy term is PPO's on-policy one, -A per token over the token count
    model.zero_grad(set_to_none=True)
    algo = AlgoConfig(correction="off")
    stats = minibatch_backward(model, batch, idx, algo, 4, 1.0, SETTINGS.max_new_tokens, World())
    mask = batch.target_mask
    expected = float((-batch.advantages[:, None] * mask).sum() / mask.sum())
    assert stats["loss/policy"] == pytest.approx(expected, abs=1e-6)


def fake_run(model, tokenizer, **algo_and_rollout) -> tuple[SimpleNamespace, SimpleNamespace]:
    staleness = algo_and_rollout.pop("max_staleness", 0)
    cfg = SimpleNamespace(
        algo=AlgoConfig(**algo_and_rollout),
        rollout=SimpleNamespace(max_staleness=staleness),
        train=SimpleNamespace(micro_batch_size=3, autocast="off"),
    )
    run = SimpleNamespace(
        cfg=cfg,
        world=World(),
        tokenizer=tokenizer,
        settings=SETTINGS,
        update_share_prefix=True,
        train_module=model,
    )
    return run, SimpleNamespace(ref_policy=None)


@pytest.mark.parametrize(
    "settings",
    [
        dict(old_logprobs="recompute", ppo_epochs=2),
        dict(old_logprobs="recompute", minibatches=2),
        dict(old_logprobs="sampler", max_staleness=1, minibatches=2),
    ],
    ids=["recompute_epochs", "recompute_minibatches", "stale"],
)
def test_prepare_batch_recomputes_the_proximal_policy_and_its_weights(
    tiny_model, char_tokenizer, settings: dict
) -> None:
    """pi_prox recomputed by the trainer (the model's own log-probs) and the TIS weights min(pi_prox /
    pi_sampler, C) from it, on trainable tokens only. The sampler here ran another policy."""
    model = copy.deepcopy(tiny_model)
    rolls = rollouts(model, char_tokenizer, seed=1)
    for r in rolls:  # the sampler's numbers: another policy's
        r.sample_logprobs = [lp + 0.4 * ((i * 37) % 5 - 2) for i, lp in enumerate(r.sample_logprobs)]
    run, state = fake_run(model, char_tokenizer, correction="tis", is_cap=1.5, **settings)
    batch, metrics = prepare_batch(run, state, rolls)  # type: ignore[arg-type]
    mask = batch.target_mask
    with torch.no_grad():
        ref_lp = reference_logprobs(model, batch) * mask
    assert batch.old_logprobs is not None and batch.is_weights is not None
    torch.testing.assert_close(batch.old_logprobs * mask, ref_lp, rtol=0, atol=1e-5)
    expected = torch.exp(ref_lp - batch.sampler_logprobs).clamp(max=1.5) * mask
    torch.testing.assert_close(batch.is_weights, expected, rtol=1e-4, atol=1e-6)
    assert 0 < float((expected == 1.5).sum()) and float(((expected < 1) & (mask > 0)).sum()) > 0
    assert 0 < metrics["behaviour/cut_frac"] < 1
    off, _ = prepare_batch(*fake_run(model, char_tokenizer, correction="off", **settings), rolls)  # type: ignore[arg-type]
    assert off.is_weights is None and off.old_logprobs is not None


def test_prepare_batch_uses_the_sampler_log_probs_when_on_policy(tiny_model, char_tokenizer) -> None:
    run, state = fake_run(tiny_model, char_tokenizer, minibatches=2)
    batch, _ = prepare_batch(run, state, rollouts(tiny_model, char_tokenizer))  # type: ignore[arg-type]
    assert batch.old_logprobs is batch.sampler_logprobs and batch.is_weights is None
    run, state = fake_run(tiny_model, char_tokenizer, old_logprobs="recompute", correction="tis")
    batch, _ = prepare_batch(run, state, rollouts(tiny_model, char_tokenizer))  # type: ignore[arg-type]
    assert batch.old_logprobs is None  # one optimizer step: the update's own forward is pi_prox


@pytest.fixture
def real_run(tiny_model_dir: Path, tmp_path: Path):
    from keelrl.loop.setup import setup

    def make(*sets: str):
        cfg = load_config(
            "configs/smoke.toml",
            [
                f'model.path="{tiny_model_dir}"',
                "rollout.batch_size=8",
                "rollout.group_size=4",
                "rollout.max_new_tokens=8",
                "train.micro_batch_size=4",
                "algo.lr=1e-2",
                "eval.every_steps=0",
                "log.progress=false",
                "supervisor.enabled=false",
                *sets,
            ],
        )
        run, state = setup(cfg, tmp_path / f"run{len(made)}")
        made.append(run)
        return run, state

    made: list = []
    yield make
    for run in made:
        for sink in run.sinks:
            sink.close()
        if run.lock is not None:
            run.lock.release()


@pytest.mark.parametrize("epochs, minibatches", [(2, 1), (1, 2), (2, 2)])
def test_the_update_makes_epochs_times_minibatches_optimizer_steps(
    real_run, epochs: int, minibatches: int
) -> None:
    """ppo_epochs passes over the batch, each cut into `minibatches` optimizer steps: AdamW counts them; every
    step after the first sees a policy the earlier ones moved (ratio/max above 1)."""
    from keelrl.step.collect import sample_phase

    run, state = real_run(f"algo.ppo_epochs={epochs}", f"algo.minibatches={minibatches}")
    rolls = sample_phase(run, state)
    for i, r in enumerate(rolls):
        r.reward = float(i % 2)
    metrics = rl_update(run, state, rolls)
    steps = {int(s["step"]) for s in state.optimizer.state.values()}
    assert steps == {epochs * minibatches}
    assert metrics["ratio/max"] > 1.0 + 1e-3
    # the step's grad_norm is the mean of its optimizer steps' norms; grad_norm/max (the guards' yardstick for
    # one mini-batch) is the largest of them
    assert metrics["grad_norm/max"] > metrics["grad_norm"] > 0


def test_metrics_are_token_means_whatever_the_loss_normaliser(stale_batch) -> None:
    """Under loss_agg = "constant" the loss divides by sequences x max_new_tokens, but kl/ref and entropy are
    still means over the trainable tokens: here from the reference forward."""
    model, batch = stale_batch
    algo = AlgoConfig(loss_agg="constant", kl_coef=0.1)
    stats = minibatch_backward(model, batch, torch.arange(8), algo, 3, 1.0, MAX_NEW, World())
    with torch.no_grad():
        lp = reference_logprobs(model, batch)
    mask = batch.target_mask
    log_r = batch.ref_logprobs - lp
    assert stats["kl/ref"] == pytest.approx(
        float(((log_r.exp() - 1 - log_r) * mask).sum() / mask.sum()), rel=1e-5
    )


def test_collate_gives_an_unscored_rollout_no_target_tokens(tiny_model, char_tokenizer) -> None:
    rolls = rollouts(tiny_model, char_tokenizer)[:2]
    rolls[1].status = "verifier_error"
    batch = collate(rolls, char_tokenizer.pad_token_id, torch.device("cpu"))
    assert float(batch.target_mask[0].sum()) == len(rolls[0].completion_ids)
    assert float(batch.target_mask[1].sum()) == 0.0 and float(batch.sampler_logprobs[1].abs().sum()) == 0.0
