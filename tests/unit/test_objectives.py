"""The whole objective as the update calls it (token_weights -> LossInputs -> ppo_clip -> loss, .backward()),
on worked numbers. Every expected value is arithmetic written here; benchmarks/mutate_loss.py checks that
each plausible slip in the assembly (a sign, a swapped bound, a dropped term, a wrong normaliser) fails one.

Convention: old_logprobs = 0 and logprobs = log(ratio), so the PPO ratio of a token is the number written,
and d loss / d logprobs of an unclipped token is -A * ratio * w."""

from __future__ import annotations

import math

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.losses import token_weights
from keelrl.algo.objectives import OBJECTIVES, LossInputs, compute_loss, ppo_clip


def k3(r: float) -> float:
    """Schulman's k3 for a probability ratio r: r - 1 - log r."""
    return r - 1.0 - math.log(r)


def build(
    ratios, adv, lengths, *, agg="token_mean", max_new_tokens=4, ent=None, ref=None, isw=None, counts=None
):
    """Lists -> (LossInputs, logprobs leaf, entropy leaf), the way the update builds them for a micro-batch.
    counts = (global trainable tokens, global sequences) of the mini-batch; this batch's own by default."""
    b, t = len(ratios), len(ratios[0])
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in lengths])  # [b, T]
    g_tokens, g_seqs = counts if counts is not None else (float(sum(lengths)), float(b))
    lp = torch.tensor(ratios).log().requires_grad_()  # [b, T]
    entropy = torch.tensor(ent if ent is not None else [[0.0] * t] * b, requires_grad=True)
    inputs = LossInputs(
        logprobs=lp,
        entropy=entropy,
        old_logprobs=torch.zeros(b, t),
        advantages=torch.tensor(adv),
        mask=mask,
        loss_weights=token_weights(mask, agg, g_tokens, g_seqs, max_new_tokens),
        metric_weights=token_weights(mask, "token_mean", g_tokens, g_seqs, max_new_tokens),
        ref_logprobs=None if ref is None else torch.tensor(ref).log(),
        is_weights=None if isw is None else torch.tensor(isw),
    )
    return inputs, lp, entropy


def run(ratios, adv, lengths, *, algo: AlgoConfig | None = None, **kw):
    """-> (loss, d loss / d logprobs, stats, d loss / d entropy)."""
    inputs, lp, entropy = build(ratios, adv, lengths, agg=(algo or AlgoConfig()).loss_agg, **kw)
    loss, stats = compute_loss(inputs, algo or AlgoConfig())
    loss.backward()
    return float(loss.detach()), lp.grad, stats, entropy.grad


def close(actual: torch.Tensor | None, expected: list[list[float]]) -> None:
    assert actual is not None
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-7)


def test_registry_names_the_function() -> None:
    assert OBJECTIVES["ppo_clip"] is ppo_clip


def test_advantage_sign_per_token_and_per_row() -> None:
    # on-policy (ratio 1), rows of 3 and 2 tokens, A = +1 and -2, token_mean over 5 tokens: w = 1/5.
    # loss = (3 * (-1) + 2 * (+2)) / 5 = 0.2   (reversed rows would give (3 * 2 + 2 * (-1)) / 5 = 0.8)
    # grad = -A * w: -0.2 on row 0 (pushed up), +0.4 on row 1's two tokens (pushed down), 0 on the pad.
    loss, grad, stats, _ = run([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [1.0, -2.0], [3, 2])
    assert loss == pytest.approx(0.2)
    close(grad, [[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0]])
    assert stats["loss/policy"] == stats["loss/total"] == pytest.approx(0.2)
    assert stats["ratio/max"] == 1.0 and stats["kl/old"] == 0.0 and "kl/ref" not in stats
    assert stats["clipfrac/low"] == stats["clipfrac/high"] == stats["clipfrac/dual"] == 0.0


def test_ratio_max_reads_trainable_tokens_only() -> None:
    # row 1's second position is padding with ratio 50: it is neither trained nor the largest ratio
    _, _, stats, _ = run([[1.5, 1.0], [1.2, 50.0]], [1.0, -1.0], [2, 1])
    assert stats["ratio/max"] == pytest.approx(1.5)


def test_asymmetric_clip_bounds() -> None:
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]; 6 tokens, w = 1/6.
    # row 0, A = +1: r 1.5 -> clipped to 1.28, loss -1.28, no grad (clipfrac/high)
    #                r 1.25 -> inside (a swapped range [0.72, 1.2] would clip it), loss -1.25, grad -1.25/6
    #                r 0.5 -> below with A > 0: max(-0.5, -0.8) = -0.5 unclipped, grad -0.5/6
    # row 1, A = -1: r 0.5 -> max(0.5, 0.8) = 0.8, no grad (clipfrac/low)
    #                r 0.75 -> max(0.75, 0.8) = 0.8, no grad (clipfrac/low; inside a swapped range)
    #                r 2.0 -> max(2.0, 1.28) = 2.0 unclipped, grad +2/6
    # loss = (-1.28 - 1.25 - 0.5 + 0.8 + 0.8 + 2.0) / 6 = 0.57 / 6 = 0.095
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28)
    loss, grad, stats, _ = run([[1.5, 1.25, 0.5], [0.5, 0.75, 2.0]], [1.0, -1.0], [3, 3], algo=algo)
    assert loss == pytest.approx(0.095, rel=1e-5)
    close(grad, [[0.0, -1.25 / 6, -0.5 / 6], [0.0, 0.0, 2.0 / 6]])
    assert stats["clipfrac/high"] == pytest.approx(1 / 6) and stats["clipfrac/low"] == pytest.approx(2 / 6)
    assert stats["ratio/max"] == pytest.approx(2.0)


def test_dual_clip_caps_negative_advantages() -> None:
    # dual_clip c = 3, range [0.8, 1.28], 4 tokens, w = 1/4.
    # row 0, A = +1: r 10 -> -1.28 (clipped high, no grad); r 1 -> -1, grad -1/4
    # row 1, A = -1: r 10 -> max(10, 1.28) = 10, capped at -c * A = 3, no grad (clipfrac/dual)
    #                     (without the cap: loss 10, grad +10/4)
    #                r 2 -> max(2, 1.28) = 2 < 3, grad +2/4
    # loss = (-1.28 - 1 + 3 + 2) / 4 = 2.72 / 4 = 0.68   (without the cap: (-2.28 + 12) / 4 = 2.43)
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss, grad, stats, _ = run([[10.0, 1.0], [10.0, 2.0]], [1.0, -1.0], [2, 2], algo=algo)
    assert loss == pytest.approx(0.68, rel=1e-5)
    close(grad, [[0.0, -0.25], [0.0, 0.5]])
    assert stats["clipfrac/dual"] == stats["clipfrac/high"] == 0.25 and stats["clipfrac/low"] == 0.0
    assert stats["ratio/max"] == pytest.approx(10.0)


def test_kl_to_a_reference_that_differs() -> None:
    # on-policy, A = +1 / -1 on two rows of 2: the policy term is (-1 - 1 + 1 + 1) / 4 = 0.
    # ref probabilities / policy probabilities r = [[0.5, 2], [2, 2]] (policy prob 1, logprobs 0).
    # k3 per token = r - 1 - log r; kl_term = (k3(0.5) + 3 k3(2)) / 4; loss = 0.1 * kl_term.
    # d k3 / d logprobs = 1 - r (log r = ref - logprobs): +0.5 where r = 0.5, -1 where r = 2, so
    # grad = (-A + 0.1 * (1 - r)) / 4 = [[(-1 + 0.05) / 4, (-1 - 0.1) / 4], [(1 - 0.1) / 4] * 2]
    kl_term = (k3(0.5) + 3 * k3(2.0)) / 4  # = (0.19315 + 3 * 0.30685) / 4 = 0.27843
    algo = AlgoConfig(kl_coef=0.1, kl_estimator="k3")
    loss, grad, stats, _ = run(
        [[1.0, 1.0], [1.0, 1.0]], [1.0, -1.0], [2, 2], algo=algo, ref=[[0.5, 2.0], [2.0, 2.0]]
    )
    assert loss == pytest.approx(0.1 * kl_term, rel=1e-5)
    close(grad, [[-0.2375, -0.275], [0.225, 0.225]])
    assert stats["kl/ref"] == pytest.approx(kl_term, rel=1e-5)
    assert stats["loss/policy"] == pytest.approx(0.0, abs=1e-7)
    assert stats["loss/total"] == pytest.approx(0.1 * kl_term, rel=1e-5)


@pytest.mark.parametrize("coef", [0.0, 0.1])
def test_entropy_bonus_value_and_direction(coef: float) -> None:
    # rows of 2 and 1 tokens, A = +1 / -1, on-policy, w = 1/3: policy term (-1 - 1 + 1) / 3 = -1/3.
    # entropy of the trainable tokens 1, 2, 3 (the pad's 9 is ignored): token mean 6 / 3 = 2.
    # loss = -1/3 - coef * 2; d loss / d entropy = -coef / 3 per trainable token (descent raises entropy).
    algo = AlgoConfig(entropy_coef=coef)
    loss, grad, stats, ent_grad = run(
        [[1.0, 1.0], [1.0, 1.0]], [1.0, -1.0], [2, 1], algo=algo, ent=[[1.0, 2.0], [3.0, 9.0]]
    )
    assert loss == pytest.approx(-1 / 3 - coef * 2, rel=1e-5)
    assert stats["entropy"] == pytest.approx(2.0) and stats["loss/policy"] == pytest.approx(-1 / 3)
    close(grad, [[-1 / 3, -1 / 3], [1 / 3, 0.0]])
    if coef > 0:
        close(ent_grad, [[-coef / 3, -coef / 3], [-coef / 3, 0.0]])
    else:
        assert ent_grad is None  # the entropy does not enter the loss


def test_truncated_importance_weight_scales_the_policy_term() -> None:
    # A = +2 / -1, on-policy, w = 1/4, is weights [[0.5, 1], [1, 0.25]]:
    # loss = (-2 * 0.5 - 2 * 1 + 1 * 1 + 1 * 0.25) / 4 = -1.75 / 4 = -0.4375
    #   (ignored: (-4 + 2) / 4 = -0.5; inverted: (-4 - 2 + 1 + 4) / 4 = -0.25)
    # grad = -A * rho / 4 = [[-0.25, -0.5], [0.25, 0.0625]]
    loss, grad, _, _ = run([[1.0, 1.0], [1.0, 1.0]], [2.0, -1.0], [2, 2], isw=[[0.5, 1.0], [1.0, 0.25]])
    assert loss == pytest.approx(-0.4375)
    close(grad, [[-0.25, -0.5], [0.25, 0.0625]])


# rows of 3 and 1 trainable tokens in T = 4 positions, max_new_tokens 5 (neither T nor a length),
# A = +1 / -2, on-policy: per-token losses -1, -1, -1 and +2.
AGG_CASES = {
    # w = 1/4: loss (-3 + 2) / 4 = -0.25; grad -1/4 on row 0, +2/4 on row 1.
    "token_mean": (-0.25, -0.25, 0.5),
    # w = 1 / (len * 2): row 0 1/6, row 1 1/2: loss -3/6 + 2/2 = 0.5; grad -1/6 and +2/2.
    "seq_mean_token_mean": (0.5, -1 / 6, 1.0),
    # w = 1 / (2 seqs * 5): loss (-3 + 2) / 10 = -0.1; grad -1/10 and +2/10.
    "constant": (-0.1, -0.1, 0.2),
}


@pytest.mark.parametrize("agg", list(AGG_CASES))
def test_loss_aggregation_with_unequal_lengths(agg: str) -> None:
    want, g0, g1 = AGG_CASES[agg]
    loss, grad, stats, _ = run(
        [[1.0] * 4, [1.0] * 4],
        [1.0, -2.0],
        [3, 1],
        algo=AlgoConfig(loss_agg=agg),
        max_new_tokens=5,
        ent=[[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]],
    )
    assert loss == pytest.approx(want, rel=1e-5)
    close(grad, [[g0, g0, g0, 0.0], [g1, 0.0, 0.0, 0.0]])
    assert stats["entropy"] == pytest.approx((1 + 2 + 3 + 4) / 4)  # a token mean whatever the loss does


# A mini-batch of 3 rows (3, 1 and 2 trainable tokens of T = 4; 6 tokens), max_new_tokens 5,
# constant normaliser (loss w = 1/15), clip [0.8, 1.28], dual clip 3, reference probability 0.5 everywhere.
MINI = {
    "ratios": [[1.5, 1.0, 1.0, 1.0], [10.0, 1.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0]],
    "adv": [1.0, -1.0, -1.0],
    "lengths": [3, 1, 2],
    "ent": [[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [5.0, 6.0, 9.0, 9.0]],
    "ref": [[0.5] * 4] * 3,
}
MINI_ALGO = dict(loss_agg="constant", clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.1)


def test_metrics_are_token_means_under_constant_normaliser() -> None:
    # trainable ratios: row 0 (A=+1) 1.5, 1, 1; row 1 (A=-1) 10; row 2 (A=-1) 0.5, 1.
    # per-token pg: -1.28 (clipped high), -1, -1; 3 (dual cap, from 10); 0.8 (clipped low), 1 -> sum 1.52.
    # kl/old: k3 of old/new = 1/ratio; kl/ref: k3 of ref/new = 0.5/ratio; each a mean over the 6 tokens.
    # The loss's KL term (k3_is, the default) is each token's ratio times its k3, over the constant normaliser.
    kl_ref_sum = k3(0.5 / 1.5) + 3 * k3(0.5) + k3(0.05) + k3(1.0)
    kl_loss_sum = 1.5 * k3(0.5 / 1.5) + 3 * k3(0.5) + 10 * k3(0.05) + 0.5 * k3(1.0)
    loss, _, s, _ = run(**MINI, algo=AlgoConfig(**MINI_ALGO), max_new_tokens=5)
    assert s["loss/policy"] == pytest.approx(1.52 / 15, rel=1e-5)
    assert loss == s["loss/total"] == pytest.approx(1.52 / 15 + 0.1 * kl_loss_sum / 15, rel=1e-5)
    assert s["entropy"] == pytest.approx((1 + 2 + 3 + 4 + 5 + 6) / 6)  # 3.5, not 21/15 = 1.4
    assert s["clipfrac/high"] == s["clipfrac/low"] == s["clipfrac/dual"] == pytest.approx(1 / 6)
    assert s["kl/old"] == pytest.approx((k3(1 / 1.5) + k3(0.1) + k3(2.0)) / 6, rel=1e-5)
    assert s["kl/ref"] == pytest.approx(kl_ref_sum / 6, rel=1e-5)
    assert s["ratio/max"] == pytest.approx(10.0)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_micro_batches_add_up_to_the_mini_batch(objective: str) -> None:
    # rows [0] and [1, 2] weighted with the mini-batch's counts (6 tokens, 3 sequences): losses, gradients
    # and every metric but ratio/max (a max) add up to the whole mini-batch's, for every objective (wide
    # sequence clips, so gspo's clipped and unclipped sequences both occur).
    algo = AlgoConfig(**MINI_ALGO, objective=objective, seq_clip_low=0.2, seq_clip_high=0.28)
    full_loss, full_grad, full, _ = run(**MINI, algo=algo, max_new_tokens=5)
    parts = [
        run(
            **{k: [v[i] for i in rows] for k, v in MINI.items()},
            algo=algo,
            max_new_tokens=5,
            counts=(6.0, 3.0),
        )
        for rows in ([0], [1, 2])
    ]
    assert sum(p[0] for p in parts) == pytest.approx(full_loss, rel=1e-6)
    close(torch.cat([p[1] for p in parts]), full_grad.tolist())
    for key, value in full.items():
        got = [p[2][key] for p in parts]
        assert (max(got) if key == "ratio/max" else sum(got)) == pytest.approx(value, rel=1e-6, abs=1e-9), key
