"""PPO-clip, dual clip, KL estimators and loss normalisation on worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from keelrl.algo.losses import kl_penalty, kl_reward_penalty, ppo_clip_loss, token_weights


def _loss(ratio: float, adv: float, lo: float = 0.2, hi: float = 0.28, dual: float = 0.0):
    lp = torch.tensor([[math.log(ratio)]])
    loss, stats = ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([[adv]]), lo, hi, dual)
    return float(loss), {k: float(v) for k, v in stats.items()}


def test_ppo_clip_worked_numbers() -> None:
    loss, s = _loss(1.5, 1.0)  # clipped at 1 + 0.28
    assert loss == pytest.approx(-1.28) and s["clipped_high"] == 1.0 and s["clipped_low"] == 0.0
    loss, s = _loss(0.5, -1.0)  # max(0.5, 0.8): clipped at 1 - 0.2
    assert loss == pytest.approx(0.8) and s["clipped_low"] == 1.0
    loss, s = _loss(0.5, 1.0)  # below the range with A > 0: unclipped objective, gradient flows
    assert loss == pytest.approx(-0.5) and s["clipped_low"] == s["clipped_high"] == 0.0
    loss, s = _loss(1.1, 2.0)  # inside the range
    assert loss == pytest.approx(-2.2)


def test_dual_clip_caps_negative_advantage_loss() -> None:
    assert _loss(10.0, -1.0)[0] == pytest.approx(10.0)  # without dual clip
    loss, s = _loss(10.0, -1.0, dual=3.0)
    assert loss == pytest.approx(3.0) and s["dual_clipped"] == 1.0
    assert _loss(10.0, 1.0, dual=3.0)[0] == pytest.approx(-1.28)  # positive advantages untouched


def test_ppo_gradient_is_zero_when_clipped() -> None:
    lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 1), torch.ones(1, 1), 0.2, 0.2)
    loss.sum().backward()
    assert lp.grad is not None and float(lp.grad) == 0.0


def test_kl_estimators_worked_numbers() -> None:
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])  # log r = log 0.5
    assert float(kl_penalty(lp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_penalty(lp, ref, "k2")) == pytest.approx(0.5 * math.log(2) ** 2)
    assert float(kl_penalty(lp, ref, "k3")) == pytest.approx(0.5 - 1 + math.log(2))
    assert float(kl_penalty(lp, lp, "k3")) == 0.0


def test_token_weights_worked_numbers() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    w = token_weights(mask, "token_mean", global_tokens=3, global_seqs=2, max_new_tokens=4)
    assert torch.allclose(w, mask / 3)
    w = token_weights(mask, "seq_mean_token_mean", global_tokens=3, global_seqs=2, max_new_tokens=4)
    assert torch.allclose(w, torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]))
    w = token_weights(mask, "constant", global_tokens=3, global_seqs=2, max_new_tokens=4)
    assert torch.allclose(w, mask / 8)


def test_a_row_without_trainable_tokens_weighs_nothing_and_makes_no_nan() -> None:
    """A rollout left out of training (status not "ok", or an empty completion) has an all-zero mask row: under
    seq_mean_token_mean its weights are 0, not 0 / 0, and the loss over the batch stays finite."""
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    w = token_weights(mask, "seq_mean_token_mean", global_tokens=2, global_seqs=1, max_new_tokens=2)
    assert torch.equal(w, torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    per_token = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    assert float((per_token * w).sum()) == 2.0


def test_kl_reward_penalty_is_k1_of_the_sampled_tokens_on_the_mask() -> None:
    # sampler log-probs log 0.5, log 0.25; reference log 0.25 on both: k1 = log 2, 0; the padding's value is 0
    sampler = torch.tensor([[math.log(0.5), math.log(0.25), 3.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.25), -3.0]])
    penalty = kl_reward_penalty(sampler, ref, torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(penalty, torch.tensor([[math.log(2), 0.0, 0.0]]))
    assert not penalty.requires_grad  # a reward: no gradient through it
