"""The off-policy corrections (algo/offpolicy.py) on worked numbers written here, how their weights enter the
loss, the behaviour-ratio metrics (effective sample size), and the config checks around them.

Batch used throughout: rho = pi_prox / pi_behaviour per token, row 0 [1.5, 2.5, 1.0], row 1 [0.9, 1.1] and a
padding position of ratio 100 that must be ignored. Geometric means: row 0 (1.5 * 2.5 * 1)^(1/3) = 1.55362,
row 1 sqrt(0.99) = 0.99499.
"""

from __future__ import annotations

import math

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.losses import token_weights
from keelrl.algo.objectives import LossInputs, compute_loss
from keelrl.algo.offpolicy import (
    CORRECTIONS,
    add_sums,
    behaviour_metrics,
    behaviour_trust_region,
    correction_weights,
)
from keelrl.config import ConfigError, load_config

PROX = torch.tensor([[1.5, 2.5, 1.0], [0.9, 1.1, 100.0]]).log()
BEHAV = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
G0, G1 = 1.5536162529769293, 0.99498743710662


def weights(correction: str, level: str = "token", **kw) -> torch.Tensor:
    algo = AlgoConfig(correction=correction, correction_level=level, **kw)
    return correction_weights(PROX, BEHAV, MASK, algo)[0]


def close(t: torch.Tensor, expected) -> None:
    assert torch.allclose(t, torch.tensor(expected, dtype=t.dtype), atol=1e-5), t


def test_every_correction_at_token_level() -> None:
    close(weights("off"), [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    close(weights("decoupled"), [[1.5, 2.5, 1.0], [0.9, 1.1, 0.0]])
    close(weights("tis", is_cap=2.0), [[1.5, 2.0, 1.0], [0.9, 1.1, 0.0]])  # 2.5 truncated to C
    close(weights("mis"), [[1.5, 0.0, 1.0], [0.9, 1.1, 0.0]])  # default band [0.5, 2]: 2.5 dropped
    assert set(CORRECTIONS) == {"off", "decoupled", "tis", "mis"}


def test_tis_truncates_only_from_above() -> None:
    """min(rho, C): a ratio far below 1 keeps its weight (0.25 stays 0.25 with C = 2; a two-sided truncation to
    [1/C, C] would raise it to 0.5), only ratios above C are cut."""
    prox = torch.tensor([[0.25, 0.4, 3.0]]).log()
    w, sums = correction_weights(
        prox, torch.zeros(1, 3), torch.ones(1, 3), AlgoConfig(correction="tis", is_cap=2.0)
    )
    close(w, [[0.25, 0.4, 2.0]])
    assert behaviour_metrics(sums)["behaviour/cut_frac"] == pytest.approx(1 / 3)


def test_every_correction_at_sequence_level() -> None:
    close(weights("decoupled", "sequence"), [[G0] * 3, [G1, G1, 0.0]])
    close(weights("tis", "sequence", is_cap=1.5), [[1.5] * 3, [G1, G1, 0.0]])
    # band [0.95, 1.05]: row 0 leaves it and is dropped whole, row 1 is kept with its weight
    close(weights("mis", "sequence", is_mask_low=0.95, is_mask_high=1.05), [[0.0] * 3, [G1, G1, 0.0]])
    close(weights("mis", "sequence"), [[0.0] * 3, [0.0] * 3])  # the default band [0.999, 1.001]


def test_a_sampler_that_agrees_needs_no_correction() -> None:
    for name in CORRECTIONS:
        for level in ("token", "sequence"):
            w, sums = correction_weights(
                BEHAV, BEHAV, MASK, AlgoConfig(correction=name, correction_level=level)
            )
            close(w, MASK.tolist())
            m = behaviour_metrics(sums)
            assert m["behaviour/ess"] == 1.0 and m["mismatch/kl"] == 0.0 and m["behaviour/cut_frac"] == 0.0


def test_behaviour_trust_region_drops_only_tokens_pushed_past_it() -> None:
    """clip 0.2 / 0.28 around the sampler: row 0 (A > 0) rho [1.5, 2.5, 1.25]: 1.5 and 2.5 already rose past
    1.28, dropped, 1.25 (past 1.2, not 1.28) kept; row 1 (A < 0) rho [0.75, 1.1, 0.9]: 0.75 already fell past
    0.8, dropped; with the other signs everything is kept (the policy moved against the advantage: the gradient
    corrects it)."""
    log_rho = torch.tensor([[1.5, 2.5, 1.25], [0.75, 1.1, 0.9]]).log()
    close(behaviour_trust_region(log_rho, torch.tensor([1.0, -1.0]), 0.2, 0.28), [[0, 0, 1], [0, 1, 1]])
    close(behaviour_trust_region(log_rho, torch.tensor([-1.0, 1.0]), 0.2, 0.28), [[1, 1, 1], [1, 1, 1]])
    per_token = torch.tensor([[1.0, -1.0, 0.0], [1.0, 1.0, 1.0]])  # gae: per-token advantages; A = 0 keeps
    close(behaviour_trust_region(log_rho, per_token, 0.2, 0.28), [[0, 1, 1], [1, 1, 1]])


def test_weights_multiply_each_tokens_policy_gradient() -> None:
    """At r = pi / pi_prox = 1 PPO's per-token gradient is -A * w_t / n: the weight scales it, sign kept."""
    algo = AlgoConfig(correction="tis", is_cap=2.0, loss_agg="token_mean")
    w = weights("tis", is_cap=2.0)
    lp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    n = float(MASK.sum())
    inputs = LossInputs(
        logprobs=lp, entropy=torch.zeros(2, 3), old_logprobs=torch.zeros(2, 3), advantages=adv, mask=MASK,
        loss_weights=token_weights(MASK, "token_mean", n, 2.0, 3),
        metric_weights=token_weights(MASK, "token_mean", n, 2.0, 3), is_weights=w,
    )  # fmt: skip
    loss, _ = compute_loss(inputs, algo)
    loss.backward()
    assert lp.grad is not None
    close(lp.grad, [[-1.5 / n, -2.0 / n, -1.0 / n], [2 * 0.9 / n, 2 * 1.1 / n, 0.0]])


def test_behaviour_metrics_and_effective_sample_size() -> None:
    _, sums = correction_weights(PROX, BEHAV, MASK, AlgoConfig(correction="tis", is_cap=2.0))
    m = behaviour_metrics(sums)
    # units 1.5, 2.5, 1.0, 0.9, 1.1: mean 7 / 5, ESS 7^2 / (5 * 11.52) = 0.85069; one of five truncated
    assert m["behaviour/ratio_mean"] == pytest.approx(1.4)
    assert m["behaviour/ess"] == pytest.approx(0.8506944, abs=1e-6)
    assert m["behaviour/cut_frac"] == pytest.approx(0.2)
    assert m["behaviour/ratio_max"] == pytest.approx(2.5)
    # mismatch: k3 = rho - 1 - log rho per token, averaged over the 5 trainable tokens (not the padding's 100)
    k3 = [r - 1 - math.log(r) for r in (1.5, 2.5, 1.0, 0.9, 1.1)]
    assert m["mismatch/kl"] == pytest.approx(sum(k3) / 5, abs=1e-6)
    assert m["mismatch/max_abs"] == pytest.approx(math.log(2.5), abs=1e-6)
    _, sums = correction_weights(
        PROX, BEHAV, MASK, AlgoConfig(correction="decoupled", correction_level="sequence")
    )
    m = behaviour_metrics(sums)
    # one unit per sequence: (G0 + G1)^2 / (2 (G0^2 + G1^2)) = 0.95416; nothing cut by decoupled
    assert m["behaviour/ess"] == pytest.approx(0.954158, abs=1e-6)
    assert m["behaviour/ratio_mean"] == pytest.approx((G0 + G1) / 2, abs=1e-6)
    assert m["behaviour/cut_frac"] == 0.0
    # the sums of two halves of the batch combine to the whole batch's
    halves = [
        correction_weights(PROX[i : i + 1], BEHAV[i : i + 1], MASK[i : i + 1], AlgoConfig())[1]
        for i in (0, 1)
    ]
    whole = correction_weights(PROX, BEHAV, MASK, AlgoConfig())[1]
    assert add_sums(add_sums({}, halves[0]), halves[1]) == pytest.approx(whole)
    # one unit carrying all the weight: ESS = 1 / n
    one = behaviour_metrics({**whole, "n": 4.0, "sum": 1.0, "sum_sq": 1.0})
    assert one["behaviour/ess"] == pytest.approx(0.25)


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="nothing to correct"):
        load_config(None, ['algo.correction="decoupled"'])  # k = 0 and the sampler's log-probs: rho = 1
    load_config(None, ['algo.correction="decoupled"', 'algo.old_logprobs="recompute"'])
    load_config(None, ['algo.correction="decoupled"', "rollout.max_staleness=1"])
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        load_config(None, ["rollout.max_staleness=2", "curriculum.dynamic_sampling=true"])
    with pytest.raises(ConfigError, match="vllm"):
        load_config(None, ["rollout.max_staleness=1", 'rollout.engine="vllm"'])
    with pytest.raises(ConfigError, match="is_cap"):
        load_config(None, ["algo.is_cap=0.5"])
