"""GSPO, GSPO-token and CISPO as the update assembles them (compute_loss), on
worked numbers written here. Convention as in test_objectives.py: old_logprobs = 0 and logprobs =
log(ratio), so a token's ratio is the number written."""

from __future__ import annotations

import math

import pytest
import torch

from keelrl.algo import get_objective
from keelrl.algo.config import AlgoConfig
from keelrl.algo.losses import sequence_log_ratio, token_weights
from keelrl.algo.objectives import OBJECTIVES, LossInputs, compute_loss
from keelrl.config import ConfigError, load_config


def run(ratios, adv, lengths, algo: AlgoConfig, isw=None):
    """-> (loss, d loss / d logprobs, metrics)."""
    b, t = len(ratios), len(ratios[0])
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in lengths])
    lp = torch.tensor(ratios).log().requires_grad_()
    inputs = LossInputs(
        logprobs=lp,
        entropy=torch.zeros(b, t),
        old_logprobs=torch.zeros(b, t),
        advantages=torch.tensor(adv),
        mask=mask,
        loss_weights=token_weights(mask, algo.loss_agg, float(sum(lengths)), float(b), t),
        metric_weights=token_weights(mask, "token_mean", float(sum(lengths)), float(b), t),
        is_weights=None if isw is None else torch.tensor(isw),
    )
    loss, metrics = compute_loss(inputs, algo)
    loss.backward()
    return float(loss.detach()), lp.grad, metrics


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-7)


def test_the_registry_is_reachable_by_name() -> None:
    assert set(OBJECTIVES) == {"ppo_clip", "gspo", "gspo_token", "cispo"}
    assert get_objective("cispo") is OBJECTIVES["cispo"]
    with pytest.raises(ValueError, match="registered: cispo, gspo, gspo_token, ppo_clip"):
        get_objective("gpo")
    with pytest.raises(ConfigError, match=r"algo\.objective"):
        load_config(None, ['algo.objective="gpo"'])


# Two sequences: row 0 has 2 tokens with ratios 1.2 and 0.9 (A = +1), row 1 one token with ratio 0.5 (A = -1).
# GSPO with a sequence clip of [0.8, 1.2]: s_0 = sqrt(1.2 * 0.9) = sqrt(1.08) = 1.039230 (inside: pg = -1.039230
# on both tokens), s_1 = 0.5 (A < 0: max(-A s, -A clip(s)) = max(0.5, 0.8) = 0.8, clipped, no gradient).
S0 = math.sqrt(1.08)
ROWS = ([[1.2, 0.9], [0.5, 1.0]], [1.0, -1.0], [2, 1])
WIDE = dict(seq_clip_low=0.2, seq_clip_high=0.2)


@pytest.mark.parametrize("objective", ["gspo", "gspo_token"])
def test_gspo_worked_numbers_token_mean(objective: str) -> None:
    # token_mean, 3 tokens, w = 1/3: loss = (2 * -1.039230 + 0.8) / 3 = -0.426154.
    # gradient: row 0's 2 terms are -s_0 each; d s_0 / d lp_t = s_0 / 2 (gspo: through the mean) so
    # d loss / d lp_t = 2 * (1/3) * (-s_0 / 2) = -s_0 / 3; gspo_token: d s_0,t / d lp_t = s_0, own term only:
    # (1/3) * -s_0. The same here (equal weights in a row); row 1 is clipped: 0.
    loss, grad, m = run(*ROWS, AlgoConfig(objective=objective, **WIDE))
    assert loss == pytest.approx((-2 * S0 + 0.8) / 3, rel=1e-6)
    close(grad, [[-S0 / 3, -S0 / 3], [0.0, 0.0]])
    assert m["clipfrac/low"] == pytest.approx(1 / 3) and m["clipfrac/high"] == 0.0
    assert m["ratio/max"] == pytest.approx(S0)  # the sequence ratio, not the token's 1.2
    assert "clipfrac/dual" not in m


def test_gspo_with_the_papers_seq_mean_and_default_clips() -> None:
    # seq_mean_token_mean: row 0 weights 1/(2*2) per token, row 1 1/2.
    # wide clips: loss = 0.5 * -s_0 + 0.5 * 0.8; grad row 0 = 2 * 0.25 * (-s_0 / 2) = -s_0 / 4.
    loss, grad, _ = run(*ROWS, AlgoConfig(objective="gspo", loss_agg="seq_mean_token_mean", **WIDE))
    assert loss == pytest.approx(0.5 * -S0 + 0.5 * 0.8, rel=1e-6)
    close(grad, [[-S0 / 4, -S0 / 4], [0.0, 0.0]])
    # default clips [1 - 3e-4, 1 + 4e-4]: s_0 = 1.039 is clipped (A > 0, loss -1.0004), s_1 too (0.9997)
    loss, grad, m = run(*ROWS, AlgoConfig(objective="gspo", loss_agg="seq_mean_token_mean"))
    assert loss == pytest.approx(0.5 * -1.0004 + 0.5 * 0.9997, abs=1e-7)  # float32 bounds
    close(grad, [[0.0, 0.0], [0.0, 0.0]])
    assert m["clipfrac/high"] == pytest.approx(2 / 3) and m["clipfrac/low"] == pytest.approx(1 / 3)


def test_gspo_and_gspo_token_differ_where_token_weights_differ() -> None:
    # importance weights [0.5, 1.0] on row 0 (wide clips, token_mean, w = 1/3):
    # gspo: loss row 0 = (1/3)(-0.5 s_0 - s_0); every token's gradient goes through s_0:
    #   d/d lp_t = (1/3)(0.5 + 1.0)(-s_0 / 2) = -0.25 s_0;
    # gspo_token: token t's gradient through its own term only: (1/3) rho_t (-s_0) = [-s_0/6, -s_0/3].
    isw = [[0.5, 1.0], [1.0, 1.0]]
    _, g_seq, _ = run(*ROWS, AlgoConfig(objective="gspo", **WIDE), isw=isw)
    _, g_tok, _ = run(*ROWS, AlgoConfig(objective="gspo_token", **WIDE), isw=isw)
    close(g_seq, [[-0.25 * S0, -0.25 * S0], [0.0, 0.0]])
    close(g_tok, [[-S0 / 6, -S0 / 3], [0.0, 0.0]])


@pytest.mark.parametrize("objective", ["gspo", "gspo_token"])
def test_gspo_asymmetric_sequence_clip(objective: str) -> None:
    """seq_clip_low 0.02, seq_clip_high 0.05: the band [0.98, 1.05]. One-token rows (s = the token's ratio),
    token_mean over 4 tokens, A = +1, +1, -1, -1:
    s 1.04 (A > 0): inside, pg -1.04, grad -1.04 / 4 (the swapped band [0.95, 1.02] would clip it: grad 0)
    s 1.06 (A > 0): above, clipped to -1.05, grad 0
    s 0.97 (A < 0): below, max(0.97, 0.98) = 0.98, grad 0 (inside the swapped band: grad +0.97 / 4)
    s 0.99 (A < 0): inside, pg 0.99, grad +0.99 / 4
    loss = (-1.04 - 1.05 + 0.98 + 0.99) / 4 = -0.03"""
    algo = AlgoConfig(objective=objective, seq_clip_low=0.02, seq_clip_high=0.05)
    loss, grad, m = run([[1.04], [1.06], [0.97], [0.99]], [1.0, 1.0, -1.0, -1.0], [1, 1, 1, 1], algo)
    assert loss == pytest.approx(-0.03, abs=1e-6)
    close(grad, [[-1.04 / 4], [0.0], [0.0], [0.99 / 4]])
    assert m["clipfrac/high"] == pytest.approx(0.25) and m["clipfrac/low"] == pytest.approx(0.25)


def test_cispo_worked_numbers_keeps_every_token() -> None:
    # ratios row 0 [1.2, 6.0] (A = +1), row 1 [0.5] (A = -1); cispo_max 5: weights 1.2, 5.0 (clipped), 0.5.
    # pg = -w A log r: -1.2 log 1.2 = -0.218786, -5 log 6 = -8.958797, -0.5 * -1 * log 0.5 = -0.346574;
    # token_mean: loss = -9.524157 / 3 = -3.174719. d loss / d lp = -w A / 3: -0.4, -5/3 (the clipped token
    # keeps its gradient, at the capped weight: ppo_clip would give it 0), +0.5/3.
    loss, grad, m = run([[1.2, 6.0], [0.5, 1.0]], [1.0, -1.0], [2, 1], AlgoConfig(objective="cispo"))
    want = -1.2 * math.log(1.2) - 5.0 * math.log(6.0) + 0.5 * math.log(0.5)
    assert loss == pytest.approx(want / 3, rel=1e-6)
    close(grad, [[-0.4, -5.0 / 3], [0.5 / 3, 0.0]])
    assert m["clipfrac/high"] == pytest.approx(1 / 3) and m["clipfrac/low"] == 0.0
    assert m["ratio/max"] == pytest.approx(6.0)
    # a lower bound (cispo_min 0.6) lifts row 1's weight to 0.6: its gradient +0.6/3
    _, grad, m = run(
        [[1.2, 6.0], [0.5, 1.0]], [1.0, -1.0], [2, 1], AlgoConfig(objective="cispo", cispo_min=0.6)
    )
    close(grad, [[-0.4, -5.0 / 3], [0.6 / 3, 0.0]])
    assert m["clipfrac/low"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_gradient_sign_follows_the_advantage(objective: str) -> None:
    # near on-policy, any objective: A > 0 pushes the sequence's log-probs up (negative gradient of the loss),
    # A < 0 pushes them down
    _, grad, _ = run(
        [[1.0001, 0.9999], [1.0001, 0.9999]], [1.0, -1.0], [2, 2], AlgoConfig(objective=objective)
    )
    assert (grad[0] < 0).all() and (grad[1] > 0).all()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "constant"])
def test_on_policy_every_objective_has_the_ppo_gradient(agg: str) -> None:
    """Ratio 1 everywhere (the first mini-batch of a step): GSPO, GSPO-token and CISPO give PPO-clip's gradient,
    so they differ only on stale tokens."""
    ratios, adv, lengths = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [0.7, -1.3], [3, 2]
    grads = {o: run(ratios, adv, lengths, AlgoConfig(objective=o, loss_agg=agg))[1] for o in OBJECTIVES}
    for o in ("gspo", "gspo_token", "cispo"):
        close(grads[o], grads["ppo_clip"].tolist())


def test_sequence_log_ratio_is_the_log_of_the_geometric_mean() -> None:
    lp = torch.tensor([[math.log(1.2), math.log(0.9), 5.0], [math.log(0.5), 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # the 5.0 is padding: ignored
    close(sequence_log_ratio(lp, torch.zeros(2, 3), mask).exp(), [S0, 0.5])


def test_mis_band_config_defaults_and_checks() -> None:
    mis = ['algo.correction="mis"', 'algo.old_logprobs="recompute"']
    assert load_config(None, mis).algo.is_mask_band == (0.5, 2.0)
    seq = load_config(None, [*mis, 'algo.correction_level="sequence"', "algo.is_mask_high=1.01"]).algo
    assert seq.is_mask_band == (0.999, 1.01)
    with pytest.raises(ConfigError, match="must enclose 1"):
        load_config(None, [*mis, "algo.is_mask_low=1.2"])
