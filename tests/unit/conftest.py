"""Unit-tier helpers for the update's KL term: a reference policy that differs from the policy, and a check
that the term enters the loss and the gradient with its sign and coefficient (a reference equal to the
policy would make the term and its gradient zero, and a test of it vacuous)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from keelrl.algo.logprobs import completion_logprobs
from keelrl.algo.losses import LossAgg, token_weights

# grads(kl_coef) -> (loss/total, gradients) of one mini-batch update, everything else fixed
Grads = Callable[[float], tuple[float, list[torch.Tensor]]]


def _perturbed_ref_logprobs(model: torch.nn.Module, batch, scale: float = 0.05) -> torch.Tensor:
    """Log-probs [B, T] of the batch's completions under a copy of `model` with noise on every weight."""
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
        lp, _ = completion_logprobs(ref, batch.input_ids, batch.attention_mask, batch.target_mask, 1.0)
    return lp


def _check_kl_term(
    model: torch.nn.Module, batch, grads: Grads, kl_coef: float, agg: LossAgg, max_new_tokens: int
) -> None:
    """The update with `kl_coef` minus the same update without KL must be kl_coef x the default KL term (k3_is:
    the ratio pi / pi_old times the k3 estimate of KL(policy || reference)), computed here from its definition,
    in the loss and in every gradient."""
    loss_kl, g_kl = grads(kl_coef)
    loss_0, g_0 = grads(0.0)
    model.zero_grad(set_to_none=True)
    lp, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.target_mask, 1.0)
    w = token_weights(batch.target_mask, agg, float(batch.target_mask.sum()), len(lp), max_new_tokens)
    log_r = batch.ref_logprobs - lp
    ratio = torch.exp(lp - batch.old_logprobs)
    kl = (ratio * (log_r.exp() - 1 - log_r) * w).sum()
    kl.backward()
    expected = [kl_coef * p.grad for p in model.parameters()]
    assert float(kl.detach()) > 1e-3  # the reference really differs from the policy
    assert loss_kl - loss_0 == pytest.approx(kl_coef * float(kl.detach()), abs=1e-6)
    assert all(torch.allclose(a - b, e, atol=1e-6, rtol=0) for a, b, e in zip(g_kl, g_0, expected))
    assert max(float(e.abs().max()) for e in expected) > 1e-4  # and its gradient is not trivially zero


@pytest.fixture
def perturbed_ref_logprobs():
    return _perturbed_ref_logprobs


@pytest.fixture
def check_kl_term():
    return _check_kl_term
