"""TRL as the oracle: the same synthetic batch through TRL's `GRPOTrainer._compute_loss` (called on a stand-in
trainer, with the model's log-probs given) and through keelrl's `compute_loss`; losses and gradients with
respect to the log-probs must agree to 1e-6. TRL's loss types map to keelrl's settings:

| TRL | keelrl |
|---|---|
| loss_type grpo (each sequence's token mean, then the mean over sequences) | ppo_clip, loss_agg seq_mean_token_mean |
| bnpo, dapo (token mean over the batch) | ppo_clip, loss_agg token_mean |
| dr_grpo (token sum / (sequences x max_completion_length)) | ppo_clip, loss_agg constant |
| cispo (clamp(r, max=epsilon_high), detached, times log pi) | cispo, cispo_max = epsilon_high, cispo_min 0 |
| importance_sampling_level "sequence" with grpo (GSPO) | gspo, loss_agg seq_mean_token_mean |

Differences on purpose, each shown by a test below:
- The KL term: keelrl's default `algo.kl_estimator = "k3_is"` is TRL's default (k3 times the ratio,
  `use_bias_correction_kl` on); keelrl's "k3" is TRL's with it off. Both pairs agree.
- TRL's entropy bonus is a token mean; keelrl normalises it like the loss: the same under token_mean.
- TRL's sequence-level importance correction (`vllm_importance_sampling_mode = "sequence_mask"`) bounds the
  *product* of the token ratios; keelrl's `algo.correction = "mis"` at sequence level bounds their geometric mean (length-
  independent bands, as veRL's "geometric" level): the same for one-token sequences only. TRL computes its mask
  inside generation, so here its output (the weights) is given to both and the test checks the assembly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from keelrl.algo.config import AlgoConfig
from keelrl.algo.losses import token_weights
from keelrl.algo.objectives import LossInputs, compute_loss
from keelrl.algo.offpolicy import correction_weights

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer", reason="TRL (a dev dependency) is not installed")

B, T = 4, 5
LENGTHS = [5, 3, 1, 4]


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Log-probs off-policy enough that some ratios leave [0.8, 1.28], and advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS])
    old = -torch.rand(B, T, generator=g) * 3 - 0.1
    new = old + torch.randn(B, T, generator=g) * 0.3
    return {
        "mask": mask,
        "old": old,
        "new": new,
        "ref": old + torch.randn(B, T, generator=g) * 0.2,
        "adv": torch.tensor([1.0, -0.5, 2.0, -1.5]),
        "entropy": torch.rand(B, T, generator=g) * 2,
    }


def trl_loss(
    b,
    loss_type: str,
    level: str = "token",
    eps=(0.2, 0.28),
    beta=0.0,
    entropy_coef=0.0,
    isw=None,
    kl_ratio=False,
):
    """TRL's loss and d loss / d log-probs on batch `b`."""
    lp = b["new"].clone().requires_grad_()
    n_tokens = b["mask"].sum()
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, b["entropy"], None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps[0],
        epsilon_high=eps[1],
        args=SimpleNamespace(
            delta=None,
            use_bias_correction_kl=kl_ratio,
            steps_per_generation=1,
            sapo_temperature_pos=1.0,
            sapo_temperature_neg=1.0,
        ),
        use_vllm=isw is not None,
        vllm_importance_sampling_correction=isw is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=SimpleNamespace(
            num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x, sync_gradients=True
        ),
        max_completion_length=T,
        _entropy_bonus_enabled=entropy_coef > 0,
        entropy_coef=entropy_coef,
        use_adaptive_entropy=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 0, dtype=torch.long),
        "prompt_mask": torch.zeros(B, 0, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": b["mask"],
        "advantages": b["adv"],
        "old_per_token_logps": b["old"],
        "ref_per_token_logps": b["ref"],
        "num_items_in_batch": n_tokens,
    }
    if isw is not None:
        inputs["importance_sampling_ratio"] = isw
    loss = trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)
    loss.backward()
    return float(loss.detach()), lp.grad


def keelrl_loss(b, algo: AlgoConfig, isw=None):
    lp = b["new"].clone().requires_grad_()
    mask = b["mask"]
    inputs = LossInputs(
        logprobs=lp,
        entropy=b["entropy"],
        old_logprobs=b["old"],
        advantages=b["adv"],
        mask=mask,
        loss_weights=token_weights(mask, algo.loss_agg, float(mask.sum()), float(B), T),
        metric_weights=token_weights(mask, "token_mean", float(mask.sum()), float(B), T),
        ref_logprobs=b["ref"] if algo.kl_coef > 0 else None,
        is_weights=isw,
    )
    loss, _ = compute_loss(inputs, algo)
    loss.backward()
    return float(loss.detach()), lp.grad * mask  # TRL's gradient is 0 off the mask too


def agree(trl, ours) -> None:
    assert ours[0] == pytest.approx(trl[0], abs=1e-6)
    torch.testing.assert_close(ours[1], trl[1] * batch()["mask"], rtol=0, atol=1e-6)


CASES = {
    "grpo": dict(loss_agg="seq_mean_token_mean"),
    "bnpo": dict(loss_agg="token_mean"),
    "dapo": dict(loss_agg="token_mean"),
    "dr_grpo": dict(loss_agg="constant"),
}


@pytest.mark.parametrize("loss_type", list(CASES))
def test_ppo_clip_matches_each_trl_loss_type(loss_type: str) -> None:
    b = batch()
    ours = keelrl_loss(b, AlgoConfig(objective="ppo_clip", clip_low=0.2, clip_high=0.28, **CASES[loss_type]))
    assert ours[1].abs().sum() > 0
    agree(trl_loss(b, loss_type), ours)


def test_the_batch_exercises_the_clips() -> None:
    b = batch()
    r = torch.exp(b["new"] - b["old"])[b["mask"].bool()]
    assert (r > 1.28).any() and (r < 0.8).any()  # both bounds are hit: the clip paths are compared


def test_cispo_matches_trl() -> None:
    b = batch(1)
    b["new"] = b["old"] + torch.randn(B, T, generator=torch.Generator().manual_seed(5))  # some ratios above 2
    ours = keelrl_loss(b, AlgoConfig(objective="cispo", cispo_max=2.0, loss_agg="token_mean"))
    assert (torch.exp(b["new"] - b["old"])[b["mask"].bool()] > 2.0).any()
    agree(trl_loss(b, "cispo", eps=(0.2, 2.0)), ours)


def test_gspo_matches_trl_sequence_level_importance_sampling() -> None:
    """Sequence ratios placed on purpose around an asymmetric band [0.98, 1.05] (token noise of zero mean per row
    keeps each row's geometric mean exact): A > 0 above it (clipped, no gradient), A < 0 below it (clipped), A > 0
    inside it but outside the swapped band [0.95, 1.02], A < 0 below it but inside the swapped band. So the
    comparison runs through both clip paths and would see bounds swapped on either side."""
    b = batch(2)
    noise = 0.05 * torch.randn(B, T, generator=torch.Generator().manual_seed(6)) * b["mask"]
    noise = noise - (noise.sum(1, keepdim=True) / b["mask"].sum(1, keepdim=True)) * b["mask"]
    log_s = torch.tensor([0.1, -0.1, 0.03, -0.03])  # s = 1.105, 0.905, 1.030, 0.970
    b["new"] = b["old"] + (log_s[:, None] + noise) * b["mask"]
    b["adv"] = torch.tensor([1.0, -0.5, 2.0, -1.5])
    eps = (0.02, 0.05)
    seq = torch.exp(((b["new"] - b["old"]) * b["mask"]).sum(1) / b["mask"].sum(1))
    torch.testing.assert_close(seq, log_s.exp())
    algo = AlgoConfig(
        objective="gspo", seq_clip_low=eps[0], seq_clip_high=eps[1], loss_agg="seq_mean_token_mean"
    )
    ours = keelrl_loss(b, algo)
    agree(trl_loss(b, "grpo", level="sequence", eps=eps), ours)
    # rows 0, 1 and 3 are clipped (no gradient), row 2 is not
    assert [bool(ours[1][i].abs().sum() > 0) for i in range(B)] == [False, False, True, False]


@pytest.mark.parametrize("estimator", ["k3_is", "k3"])
def test_kl_term_matches_trl(estimator: str) -> None:
    """k3_is = TRL's default (k3 times the ratio to the old policy, with its gradient); k3 = TRL's without it."""
    b = batch(3)
    algo = AlgoConfig(
        objective="ppo_clip",
        clip_low=0.2,
        clip_high=0.28,
        loss_agg="token_mean",
        kl_coef=0.1,
        kl_estimator=estimator,
    )
    agree(trl_loss(b, "dapo", beta=0.1, kl_ratio=estimator == "k3_is"), keelrl_loss(b, algo))


def test_entropy_bonus_matches_trl_under_token_mean() -> None:
    b = batch(4)
    b["entropy"] = b["entropy"].requires_grad_()
    algo = AlgoConfig(
        objective="ppo_clip", clip_low=0.2, clip_high=0.28, loss_agg="token_mean", entropy_coef=0.01
    )
    agree(trl_loss(b, "dapo", entropy_coef=0.01), keelrl_loss(b, algo))


def test_importance_weights_enter_like_trls() -> None:
    """keelrl's masked-IS weights (token level: rho inside [0.5, 2], else 0; TRL's token_mask) given to both as
    the sampler correction: the same loss."""
    b = batch(5)
    sampler = b["old"] + 0.5 * torch.randn(B, T, generator=torch.Generator().manual_seed(7))
    algo = AlgoConfig(
        objective="ppo_clip", clip_low=0.2, clip_high=0.28, loss_agg="token_mean", correction="mis"
    )
    w, _ = correction_weights(b["old"], sampler, b["mask"], algo)
    assert 0 < (w[b["mask"].bool()] > 0).sum() < b["mask"].sum()  # some tokens dropped, some kept
    agree(trl_loss(b, "dapo", isw=w), keelrl_loss(b, algo, isw=w))


def test_sequence_mask_bounds_the_geometric_mean_where_trl_bounds_the_product() -> None:
    # a 4-token sequence with every token ratio 1.2: product 2.07, geometric mean 1.2; band [0.5, 1.5]
    old = torch.zeros(1, 4)
    sampler = torch.full((1, 4), -math.log(1.2))
    mask = torch.ones(1, 4)
    algo = AlgoConfig(correction="mis", correction_level="sequence", is_mask_low=0.5, is_mask_high=1.5)
    assert (correction_weights(old, sampler, mask, algo)[0] > 0).sum() == 4  # kept here
    product = math.exp(float((old - sampler).sum()))
    assert not 0.5 <= product <= 1.5  # TRL's sequence_mask would drop it
    # one token: the two agree
    narrow = algo.model_copy(update={"is_mask_high": 1.1})
    assert correction_weights(old[:, :1], sampler[:, :1], mask[:, :1], narrow)[0].sum() == 0
