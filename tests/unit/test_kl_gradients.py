"""What each `algo.kl_estimator` regularises, proved exactly: over a small vocabulary every outcome y can be
enumerated, so the expected gradient of a per-token loss l over samples of pi_old is the finite sum
sum_y pi_old(y) grad l(y), with no sampling noise. It is compared with autograd of the exact divergence,
sum_y p(y) (log p(y) - log q(y)), computed from its definition.

The loss goes through `compute_loss` itself: one one-token sequence per vocabulary entry, loss weight pi_old(y)
(the probability of drawing it), advantage 0 (no policy term), kl_coef 1. KL-in-reward goes through
`advantage_phase` and the policy-gradient term, over every two-token sequence of a tabular policy.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.losses import KL_LOSSES
from keelrl.algo.objectives import LossInputs, compute_loss
from keelrl.run.distributed import World
from keelrl.step.batch import TrainBatch
from keelrl.step.update import advantage_phase

V = 6
GEN = torch.Generator().manual_seed(0)
THETA0 = torch.randn(V, generator=GEN, dtype=torch.float64)  # the policy's logits
REF = torch.log_softmax(torch.randn(V, generator=GEN, dtype=torch.float64), 0)  # the reference's log-probs
OLD = torch.log_softmax(
    THETA0 + 0.7 * torch.randn(V, generator=GEN, dtype=torch.float64), 0
)  # a stale policy


def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_y p(y) (log p(y) - log q(y)), from its definition."""
    return (p_log.exp() * (p_log - q_log)).sum()


def exact_grad(divergence) -> torch.Tensor:
    theta = THETA0.clone().requires_grad_()
    divergence(torch.log_softmax(theta, 0)).backward()
    return theta.grad


def expected_grad(estimator: str, off_policy: bool) -> torch.Tensor:
    """sum_y pi_old(y) grad l(y): the KL term of `compute_loss` over the V one-token outcomes, each weighted by
    its probability under the policy that drew it (pi itself, or the stale OLD)."""
    theta = THETA0.clone().requires_grad_()
    logprobs = torch.log_softmax(theta, 0)[:, None]  # [V, 1]: outcome y is row y
    old = OLD[:, None] if off_policy else logprobs.detach()
    inputs = LossInputs(
        logprobs=logprobs,
        entropy=torch.zeros(V, 1, dtype=torch.float64),
        old_logprobs=old,
        advantages=torch.zeros(V, dtype=torch.float64),
        mask=torch.ones(V, 1, dtype=torch.float64),
        loss_weights=old.exp(),  # the probability of drawing y: the expectation, exactly
        metric_weights=torch.full((V, 1), 1.0 / V, dtype=torch.float64),
        ref_logprobs=REF[:, None],
    )
    loss, _ = compute_loss(inputs, AlgoConfig(kl_coef=1.0, kl_estimator=estimator))
    loss.backward()
    return theta.grad


FORWARD = exact_grad(lambda lp: kl(lp, REF))  # grad KL(pi || ref)
REVERSE = exact_grad(lambda lp: kl(REF, lp))  # grad KL(ref || pi)


def test_the_two_directions_differ_here() -> None:
    """The case distinguishes every claim below: the two divergences' gradients differ, and neither is 0."""
    assert (FORWARD - REVERSE).abs().max() > 0.05
    assert FORWARD.abs().max() > 0.05 and REVERSE.abs().max() > 0.05


def test_the_default_regularises_kl_pi_to_ref() -> None:
    assert AlgoConfig().kl_estimator == "k3_is"
    torch.testing.assert_close(expected_grad("k3_is", off_policy=False), FORWARD, rtol=0, atol=1e-12)


def test_k3_with_its_importance_weight_is_exact_on_stale_tokens_too() -> None:
    """Drawn from a stale pi_old, k3 times pi / pi_old still has KL(pi || ref)'s gradient; k2 has not."""
    torch.testing.assert_close(expected_grad("k3_is", off_policy=True), FORWARD, rtol=0, atol=1e-12)
    assert (expected_grad("k2", off_policy=True) - FORWARD).abs().max() > 0.01


def test_k2_regularises_kl_pi_to_ref_on_policy() -> None:
    torch.testing.assert_close(expected_grad("k2", off_policy=False), FORWARD, rtol=0, atol=1e-12)


def test_k3_in_the_loss_regularises_the_reverse_kl() -> None:
    """The GRPO papers' k3 in the loss: its expected gradient is that of KL(ref || pi), not KL(pi || ref)."""
    torch.testing.assert_close(expected_grad("k3", off_policy=False), REVERSE, rtol=0, atol=1e-12)


def test_k1_in_the_loss_has_zero_expected_gradient() -> None:
    torch.testing.assert_close(expected_grad("k1", off_policy=False), torch.zeros(V, dtype=torch.float64))


def test_kl_in_the_reward_regularises_kl_pi_to_ref_over_whole_sequences() -> None:
    """k1_reward: every two-token sequence y = (a, b) of a tabular policy pi(a) pi(b | a) over 3 tokens is one
    rollout of one group (9 rows; the group mean is a constant baseline: no change to the expected gradient).
    `advantage_phase` (dr_grpo, reward 0, kl_coef 0.3) takes kl_coef * sum_t k1_t off each reward; the
    policy-gradient term -A(y) log pi(y), weighted by pi(y), then has the gradient of 0.3 KL(pi || ref) over
    sequences: sum_y pi(y) (log pi(y) - log ref(y))."""
    n, coef = 3, 0.3
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(n + n * n, generator=g, dtype=torch.float64).requires_grad_()  # pi(a), pi(b | a)
    ref_first = torch.log_softmax(torch.randn(n, generator=g, dtype=torch.float64), 0)
    ref_next = torch.log_softmax(torch.randn(n, n, generator=g, dtype=torch.float64), 1)
    first, nxt = torch.log_softmax(theta[:n], 0), torch.log_softmax(theta[n:].view(n, n), 1)
    seqs = [(a, b) for a in range(n) for b in range(n)]
    lp = torch.stack([torch.stack([first[a], nxt[a, b]]) for a, b in seqs])  # [9, 2] log pi per token
    ref = torch.stack([torch.stack([ref_first[a], ref_next[a, b]]) for a, b in seqs])  # [9, 2]
    prob = lp.detach().sum(dim=1).exp()  # [9] pi(y)
    batch = TrainBatch(
        input_ids=torch.zeros(9, 3, dtype=torch.long),
        attention_mask=torch.ones(9, 3, dtype=torch.long),
        target_mask=torch.ones(9, 2, dtype=torch.float64),
        sampler_logprobs=lp.detach(),
        advantages=torch.zeros(9),
        lengths=torch.full((9,), 3),
        ref_logprobs=ref,
    )
    rollouts = [SimpleNamespace(reward=0.0, status="ok", advantage=0.0) for _ in seqs]
    algo = AlgoConfig(advantage="dr_grpo", kl_coef=coef, kl_estimator="k1_reward")
    run = SimpleNamespace(
        cfg=SimpleNamespace(algo=algo, rollout=SimpleNamespace(group_size=9)), world=World()
    )
    advantage_phase(run, SimpleNamespace(critic=None), rollouts, batch)  # type: ignore[arg-type]
    adv = batch.advantages.double()  # [9]
    assert adv.abs().max() > 0.01
    (-(adv * prob)[:, None] * lp).sum().backward()  # sum_y pi(y) * (-A(y) log pi(y)), summed over its tokens
    got = theta.grad.clone()

    theta.grad = None
    first, nxt = torch.log_softmax(theta[:n], 0), torch.log_softmax(theta[n:].view(n, n), 1)
    seq_lp = torch.stack([first[a] + nxt[a, b] for a, b in seqs])  # [9] log pi(y)
    seq_ref = torch.stack([ref_first[a] + ref_next[a, b] for a, b in seqs])
    (coef * kl(seq_lp, seq_ref)).backward()
    torch.testing.assert_close(got, theta.grad, rtol=0, atol=1e-6)  # advantages are float32


@pytest.mark.parametrize("estimator", sorted(KL_LOSSES))
def test_every_loss_estimator_is_proved_above(estimator: str) -> None:
    """A new entry in KL_LOSSES must get its own enumeration test (and a sentence in algo.kl_estimator's docs)."""
    assert estimator in {"k3_is", "k2", "k3", "k1"}


def test_kl_in_the_reward_puts_no_kl_term_in_the_loss_and_still_logs_kl_ref() -> None:
    theta = THETA0.clone().requires_grad_()
    logprobs = torch.log_softmax(theta, 0)[:, None]  # [V, 1]
    common = dict(
        entropy=torch.zeros(V, 1, dtype=torch.float64),
        old_logprobs=OLD[:, None],
        advantages=torch.zeros(V, dtype=torch.float64),
        mask=torch.ones(V, 1, dtype=torch.float64),
        loss_weights=torch.full((V, 1), 1.0 / V, dtype=torch.float64),
        metric_weights=torch.full((V, 1), 1.0 / V, dtype=torch.float64),
    )
    algo = AlgoConfig(kl_coef=1.0, kl_estimator="k1_reward")
    loss, stats = compute_loss(LossInputs(logprobs=logprobs, ref_logprobs=REF[:, None], **common), algo)
    no_ref, _ = compute_loss(LossInputs(logprobs=logprobs, **common), algo)
    assert float(loss.detach()) == float(no_ref.detach()) == 0.0
    log_r = REF - logprobs[:, 0].detach()
    assert stats["kl/ref"] == pytest.approx(float((log_r.exp() - 1 - log_r).mean()))
