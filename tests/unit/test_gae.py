"""GAE, the returns, whitening and the clipped value loss on hand-computed numbers; GAE against the Monte-Carlo
return at lambda = 1."""

from __future__ import annotations

import random

import pytest
import torch

from keelrl.algo.gae import explained_variance, gae, terminal_rewards, value_loss, whiten


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-6)


def test_terminal_reward_sits_on_the_last_trainable_position() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    close(terminal_rewards(mask, torch.tensor([1.0, 0.1, 5.0])), [[0, 0, 1, 0], [0, 0, 0, 0.1], [0, 0, 0, 0]])


def test_gae_worked_numbers() -> None:
    # values [0.5, 0.6, 0.7], reward 1 at the end, gamma 1, lam 0.5:
    # delta = [0.6 - 0.5, 0.7 - 0.6, 1 - 0.7] = [0.1, 0.1, 0.3]
    # A_2 = 0.3; A_1 = 0.1 + 0.5 * 0.3 = 0.25; A_0 = 0.1 + 0.5 * 0.25 = 0.225; returns = A + V
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # 9.0 sits on padding: never read
    adv, ret = gae(terminal_rewards(mask, torch.tensor([1.0])), values, mask, gamma=1.0, lam=0.5)
    close(adv, [[0.225, 0.25, 0.3, 0.0]])
    close(ret, [[0.725, 0.85, 1.0, 0.0]])
    # gamma 0.9, lam 1: A_2 = 1 - 0.7 = 0.3; A_1 = 0.9 * 0.7 - 0.6 + 0.9 * 0.3 = 0.3;
    # A_0 = 0.9 * 0.6 - 0.5 + 0.9 * 0.3 = 0.31 (= 0.9^2 * 1 - 0.5: the discounted return minus V_0)
    adv, _ = gae(terminal_rewards(mask, torch.tensor([1.0])), values, mask, gamma=0.9, lam=1.0)
    close(adv, [[0.31, 0.3, 0.3, 0.0]])


def test_gae_skips_positions_an_environment_inserted() -> None:
    # trainable positions 0 and 2 (1 was inserted context): the episode is [V 0.5, V 0.7], reward 1:
    # A at 2 = 1 - 0.7 = 0.3; A at 0 = 0.7 - 0.5 + lam * 0.3 = 0.2 + 0.15 = 0.35 (lam 0.5)
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    adv, _ = gae(
        terminal_rewards(mask, torch.tensor([1.0])), torch.tensor([[0.5, 123.0, 0.7]]), mask, 1.0, 0.5
    )
    close(adv, [[0.35, 0.0, 0.3]])


def test_lambda_one_is_the_monte_carlo_return_minus_the_value() -> None:
    rng = random.Random(0)
    lengths = [5, 3, 1, 4]
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in lengths])
    values = torch.tensor([[rng.uniform(-1, 1) for _ in range(5)] for _ in lengths])
    rewards = torch.tensor([1.0, 0.1, 0.0, -0.5])
    gamma = 0.95
    adv, ret = gae(terminal_rewards(mask, rewards), values, mask, gamma=gamma, lam=1.0)
    for i, n in enumerate(lengths):
        for t in range(n):
            mc = gamma ** (n - 1 - t) * float(rewards[i])  # the only reward comes at the last position
            assert float(adv[i, t]) == pytest.approx(mc - float(values[i, t]), abs=1e-6)
            assert float(ret[i, t]) == pytest.approx(mc, abs=1e-6)
    assert float(adv[mask == 0].abs().sum()) == 0.0


def test_whiten_uses_the_given_global_sums() -> None:
    x = torch.tensor([[1.0, 5.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # mean 6 / 2 = 3, variance 26 / 2 - 9 = 4 (std 2) over the two masked entries: (x - 3) / 2
    close(whiten(x, mask, total=6.0, total_sq=26.0, count=2.0), [[-1.0, 1.0, 0.0]])


def test_value_loss_worked_numbers() -> None:
    # clip 0.2; old value 0.5 everywhere, returns 1.0:
    # V 0.6: inside the clip: 0.5 * 0.4^2 = 0.08, the plain term
    # V 1.2: clipped to 0.7; plain 0.5 * 0.2^2 = 0.02, clipped 0.5 * 0.3^2 = 0.045 -> 0.045 (flag 1: no gradient)
    # V 0.0: clipped to 0.3; plain 0.5, clipped 0.5 * 0.7^2 = 0.245 -> 0.5 (the plain term: gradient V - R = -1)
    v = torch.tensor([[0.6, 1.2, 0.0]], requires_grad=True)
    loss, flag = value_loss(v, torch.full((1, 3), 0.5), torch.ones(1, 3), clip=0.2)
    close(loss, [[0.08, 0.045, 0.5]])
    close(flag, [[0.0, 1.0, 0.0]])
    loss.sum().backward()
    close(v.grad, [[-0.4, 0.0, -1.0]])


def test_explained_variance() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    ret = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.0), ret, mask) == pytest.approx(0.0)
