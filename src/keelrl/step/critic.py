"""PPO's learned critic (`algo.advantage = "gae"`): the value model, the advantages it gives a batch, and its
share of each micro-batch's backward. The math (GAE, whitening, the clipped value loss) is in algo/gae.py.

- The value model is a scalar head on a decoder's final hidden state, zero-initialised (every value starts at
  0, so the first advantages are the whitened returns). `algo.critic = "separate"`: the decoder is its own copy
  of the policy's architecture and starting weights (`model.path`); "shared": it is the policy's own decoder,
  which then gets the value loss's gradient too (times `algo.value_coef`) and trains with the policy's optimizer.
  The model lives in `TrainState.critic` with its own AdamW over its own parameters (`critic_optimizer`, lr
  `algo.critic_lr`; shared: the head only), checkpointed in `trainer_state.pt`, restored on resume and rollback.
- `critic_advantages`: values of the batch (no grad) -> GAE with the outcome reward on the last trainable
  position (with `algo.kl_estimator = "k1_reward"`, minus kl_coef * k1 on every trainable token: PPO-RLHF's
  per-token KL reward) -> advantages whitened over the global batch's trainable tokens. Each rollout's logged advantage is
  its token mean.
- `critic_backward`: the clipped value loss of a micro-batch, a token mean over the global mini-batch (so
  micro-batching does not change it), backward into the value model; its optimizer steps when the policy's
  does (a guard's skip drops both), and alone during `algo.critic_warmup_steps`.

Not built yet: the critic under torchrun (refused at setup). The shared trunk runs its own forward for the
values (not fused with the log-prob forward): simpler, one more trunk pass per micro-batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from keelrl.algo.config import AlgoConfig
from keelrl.algo.gae import explained_variance, gae, terminal_rewards, value_loss, whiten
from keelrl.algo.logprobs import Autocast, autocast_context
from keelrl.config import ModelConfig
from keelrl.run.distributed import World, all_reduce_sum

if TYPE_CHECKING:
    from keelrl.rollout import Rollout
    from keelrl.step.batch import TrainBatch


class ValueModel(torch.nn.Module):
    """A decoder (the policy's architecture) and a scalar head: values [B, T], one per position. `shared`: the
    decoder is `backbone`'s own and not a submodule here, so `parameters()` and `state_dict()` are the head's."""

    def __init__(self, backbone: PreTrainedModel, shared: bool = False) -> None:
        super().__init__()
        if shared:
            self.shared_body = [backbone.get_decoder()]  # a list: not registered, it belongs to the policy
        else:
            self.body = backbone.get_decoder()
        self.head = torch.nn.Linear(backbone.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @property
    def shared(self) -> bool:
        return hasattr(self, "shared_body")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        body = self.shared_body[0] if self.shared else self.body
        hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
        return self.head(hidden).squeeze(-1).float()  # [B, T]


def build_critic(
    model: ModelConfig, algo: AlgoConfig, policy: PreTrainedModel, device: torch.device
) -> tuple[ValueModel, torch.optim.Optimizer]:
    """The value model (`algo.critic`: its own copy of the starting weights, or a head on `policy`'s trunk) and
    its optimizer."""
    from keelrl.models.load import load_policy

    backbone = policy if algo.critic == "shared" else load_policy(model)[0]
    critic = ValueModel(backbone, shared=algo.critic == "shared").to(device).eval()  # eval: deterministic
    return critic, torch.optim.AdamW(
        critic.parameters(),
        lr=algo.critic_lr,
        betas=(algo.adam_beta1, algo.adam_beta2),
        weight_decay=algo.weight_decay,
    )


def critic_advantages(
    critic: ValueModel,
    batch: TrainBatch,
    rollouts: list[Rollout],
    algo: AlgoConfig,
    world: World,
    micro_batch_size: int,
    autocast: Autocast,
    kl_penalty: torch.Tensor | None = None,
) -> tuple[dict[str, float], float]:
    """Set `batch.advantages` ([B, T], whitened), `batch.returns` and `batch.old_values`; returns the metrics and
    the mean |advantage| (the per-step guards' scale). `kl_penalty` [B, T]: a reward per token to subtract
    (algo.kl_estimator = "k1_reward": each token's KL penalty, PPO-RLHF's per-token reward)."""
    mask = batch.target_mask
    values = batch.per_token_no_grad(
        micro_batch_size, autocast, lambda mb: critic(mb.input_ids, mb.attention_mask)
    )
    values = values * mask
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32, device=mask.device)
    token_rewards = terminal_rewards(mask, rewards)  # [B, T]
    if kl_penalty is not None:
        token_rewards = token_rewards - kl_penalty
    adv, returns = gae(token_rewards, values, mask, algo.gamma, algo.lam)
    count = all_reduce_sum(float(mask.sum()), world)
    total = all_reduce_sum(float(adv.sum()), world)
    total_sq = all_reduce_sum(float(adv.square().sum()), world)
    white = whiten(adv, mask, total, total_sq, count)
    batch.advantages, batch.returns, batch.old_values = white, returns, values
    per_row = (white.sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)).tolist()
    for r, a in zip(rollouts, per_row, strict=True):
        r.advantage = a
    abs_mean = all_reduce_sum(float(white.abs().sum()), world) / max(count, 1.0)
    metrics = {
        "advantage/mean": total / max(count, 1.0),  # before whitening
        "advantage/abs_mean": abs_mean,
        "critic/value_mean": all_reduce_sum(float(values.sum()), world) / max(count, 1.0),
        "critic/return_mean": all_reduce_sum(float(returns.sum()), world) / max(count, 1.0),
        "critic/explained_variance": explained_variance(values, returns, mask),  # this rank's tokens
    }
    return metrics, abs_mean


def critic_backward(
    critic: ValueModel,
    mb: TrainBatch,
    metric_weights: torch.Tensor,
    algo: AlgoConfig,
    scale: float,
    autocast: Autocast,
) -> dict[str, float]:
    """The micro-batch's clipped value loss (token-mean weights with global counts), backward into the critic
    (shared: into the head and, times `algo.value_coef`, the policy's trunk)."""
    assert mb.returns is not None and mb.old_values is not None
    with autocast_context(mb.input_ids.device, autocast):
        values = critic(mb.input_ids, mb.attention_mask)[:, : mb.returns.shape[1]]  # [b, T]
    per_token, clipped = value_loss(values, mb.old_values, mb.returns, algo.value_clip)
    loss = (per_token * metric_weights).sum()
    (loss * scale * (algo.value_coef if critic.shared else 1.0)).backward()
    return {
        "critic/value_loss": float(loss.detach()),
        "critic/clipfrac": float((clipped * metric_weights).sum()),
    }
