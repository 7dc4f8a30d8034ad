"""GAE, the returns, whitening and the clipped value loss on hand-computed numbers; GAE against the Monte-Carlo
return at lambda = 1."""

from __future__ import annotations

import random
import statistics
from types import SimpleNamespace

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.gae import explained_variance, gae, terminal_rewards, value_loss, whiten
from keelrl.run.distributed import World


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


class TableCritic(torch.nn.Module):
    """A value model whose value at each position is its token id / 10, plus a learnable shift (0 at first)."""

    shared = False

    def __init__(self) -> None:
        super().__init__()
        self.shift = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return input_ids.float() / 10 + self.shift  # [B, T]


def critic_batch():
    """Row 0: prompt [1, 2], completion [3, 4, 5] (targets at positions 1-3: values 0.2, 0.3, 0.4), reward 1.
    Row 1: prompt [1], completion [6, 7] (targets at 0-1: values 0.1, 0.6), reward 0; padded with id 9."""
    from keelrl.step.batch import TrainBatch

    batch = TrainBatch(
        input_ids=torch.tensor([[1, 2, 3, 4, 5], [1, 6, 7, 9, 9]]),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        target_mask=torch.tensor([[0.0, 1, 1, 1, 0], [1, 1, 0, 0, 0]]),
        sampler_logprobs=torch.zeros(2, 5),
        advantages=torch.zeros(2),
        lengths=torch.tensor([5, 3]),
    )
    rollouts = [SimpleNamespace(reward=1.0, advantage=0.0), SimpleNamespace(reward=0.0, advantage=0.0)]
    return batch, rollouts


def test_critic_advantages_worked_numbers() -> None:
    """gamma 0.9, lam 0.5 (swapped, they give other numbers):
    row 0, V [0.2, 0.3, 0.4], R 1: delta_2 = 0.6, A_2 = 0.6; delta_1 = 0.9 * 0.4 - 0.3 = 0.06,
      A_1 = 0.06 + 0.45 * 0.6 = 0.33; delta_0 = 0.9 * 0.3 - 0.2 = 0.07, A_0 = 0.07 + 0.45 * 0.33 = 0.2185
    row 1, V [0.1, 0.6], R 0: A_1 = -0.6; delta_0 = 0.9 * 0.6 - 0.1 = 0.44, A_0 = 0.44 + 0.45 * -0.6 = 0.17
    The advantages are these whitened over the 5 trainable tokens (population std); returns = A + V, not
    whitened."""
    from keelrl.step.critic import critic_advantages

    batch, rollouts = critic_batch()
    algo = AlgoConfig(advantage="gae", gamma=0.9, lam=0.5)
    metrics, abs_mean = critic_advantages(TableCritic(), batch, rollouts, algo, World(), 2, "off")
    raw = [0.2185, 0.33, 0.6, 0.17, -0.6]
    mean, std = statistics.fmean(raw), statistics.pstdev(raw)
    white = [(a - mean) / std for a in raw]
    close(batch.advantages, [[0.0, *white[:3], 0.0], [*white[3:], 0.0, 0.0, 0.0]])
    close(batch.returns, [[0.0, 0.4185, 0.63, 1.0, 0.0], [0.27, 0.0, 0.0, 0.0, 0.0]])
    assert metrics["advantage/mean"] == pytest.approx(mean, abs=1e-6)  # before whitening
    assert metrics["critic/value_mean"] == pytest.approx(0.32, abs=1e-6)  # trainable positions only
    assert abs_mean == pytest.approx(statistics.fmean(abs(w) for w in white), abs=1e-6)
    assert rollouts[1].advantage == pytest.approx((white[3] + white[4]) / 2, abs=1e-6)


def test_kl_in_the_reward_is_a_reward_on_every_token_under_gae() -> None:
    """algo.kl_estimator = "k1_reward": a penalty of 0.1 per trainable token comes off each token's reward, so
    with gamma = lam = 1 the return from position t is R - 0.1 * (the tokens from t to the end)."""
    from keelrl.step.critic import critic_advantages

    batch, rollouts = critic_batch()
    penalty = 0.1 * batch.target_mask
    algo = AlgoConfig(advantage="gae", kl_coef=0.1, kl_estimator="k1_reward")
    critic_advantages(TableCritic(), batch, rollouts, algo, World(), 2, "off", penalty)
    close(batch.returns, [[0.0, 0.7, 0.8, 0.9, 0.0], [-0.2, -0.1, 0.0, 0.0, 0.0]])


def test_critic_backward_value_loss_is_a_token_mean() -> None:
    """value_clip 10 (never reached); returns 1 everywhere; the values (token id / 10) at the 5 trainable
    positions are 0.2, 0.3, 0.4, 0.1, 0.6: loss = mean 0.5 (V - 1)^2 = (0.64 + 0.49 + 0.36 + 0.81 + 0.16) / 10
    = 0.246; d loss / d shift = mean (V - 1) = -0.68."""
    from keelrl.step.critic import critic_backward

    batch, _ = critic_batch()
    critic = TableCritic()
    batch.returns = torch.ones(2, 5)
    with torch.no_grad():
        batch.old_values = critic(batch.input_ids, batch.attention_mask)
    weights = batch.target_mask / batch.target_mask.sum()
    stats = critic_backward(critic, batch, weights, AlgoConfig(advantage="gae", value_clip=10.0), 1.0, "off")
    assert stats["critic/value_loss"] == pytest.approx(0.246, abs=1e-6)
    assert stats["critic/clipfrac"] == 0.0
    assert float(critic.shift.grad) == pytest.approx(-0.68, abs=1e-6)
