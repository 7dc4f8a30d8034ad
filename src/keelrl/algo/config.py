"""`[algo]`: the RL algorithm's settings (estimator, objective and its clips, importance corrections, optimizer).
Pydantic only (`keelrl.config` imports it without torch); `keelrl.config.AlgoConfig` is this class."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Default bands of algo.correction = 'mis' by level: a token ratio within [1/2, 2] (veRL's typical token threshold 2 and
# its reciprocal); a sequence's geometric-mean ratio within [0.999, 1.001] (veRL's geometric preset):
# ../shared/REFERENCE.md, "Sampler/trainer mismatch".
IS_MASK_BAND = {"token": (0.5, 2.0), "sequence": (0.999, 1.001)}


class AlgoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(1e-6, gt=0.0, le=1.0, description="Learning rate of the policy optimizer (AdamW).")
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"] = Field(
        "grpo",
        description=(
            "Advantage estimator: grpo (group mean/std), dr_grpo (group mean, no std), rloo (leave-one-out mean), "
            "reinforce_pp (REINFORCE++: batch-normalised; with group baseline if algo.group_baseline), gae (PPO "
            "with a learned critic: a value model of the policy's architecture, GAE(gamma, lam) per token)."
        ),
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="gae: discount per token (TinyZero's PPO: 1).")
    lam: float = Field(
        1.0, ge=0.0, le=1.0, description="gae: GAE's lambda (1: Monte-Carlo return minus the value)."
    )
    critic_lr: float = Field(
        1e-5, gt=0.0, le=1.0, description="gae: learning rate of the value model (AdamW)."
    )
    value_clip: float = Field(
        0.5,
        gt=0.0,
        description="gae: the value loss's clip around the values the batch was scored with (PPO).",
    )
    critic: Literal["separate", "shared"] = Field(
        "separate",
        description=(
            "gae: the value model. separate: its own copy of the policy's architecture and starting weights; shared: "
            "a value head on the policy's own trunk, which then also learns from the value loss (times value_coef)."
        ),
    )
    value_coef: float = Field(
        0.1,
        gt=0.0,
        description="gae with critic = 'shared': weight of the value loss in the trunk's gradient.",
    )
    critic_warmup_steps: int = Field(
        0, ge=0, description="gae: RL steps at the start that train the value model only (the policy waits)."
    )
    group_baseline: bool = Field(
        True, description="reinforce_pp only: subtract the group mean before batch normalisation."
    )
    std_eps: float = Field(1e-6, gt=0.0, description="Added to standard deviations before dividing.")
    objective: Literal["ppo_clip", "gspo", "gspo_token", "cispo"] = Field(
        "ppo_clip",
        description=(
            "The policy loss (algo/objectives.py): ppo_clip (PPO-clip with clip_low/clip_high and dual clip), gspo "
            "(one length-normalised ratio per sequence, clipped to seq_clip_low/high, GSPO), gspo_token (GSPO's "
            "token variant), cispo (the detached importance weight clipped to [cispo_min, cispo_max] times the "
            "log-prob, CISPO). All take the IS corrections, KL to the reference and the entropy bonus."
        ),
    )
    seq_clip_low: float = Field(
        3e-4,
        ge=0.0,
        le=1.0,
        description="gspo, gspo_token: sequence ratios under 1 - seq_clip_low stop pushing down.",
    )
    seq_clip_high: float = Field(
        4e-4,
        ge=0.0,
        le=10.0,
        description="gspo, gspo_token: sequence ratios over 1 + seq_clip_high stop pushing up.",
    )
    cispo_min: float = Field(
        0.0,
        ge=0.0,
        description="cispo: lower bound of the detached importance weight (0 = none, as MiniMax-M1).",
    )
    cispo_max: float = Field(
        5.0,
        gt=0.0,
        description="cispo: upper bound of the detached importance weight (ScaleRL's eps_max, 5).",
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "constant"] = Field(
        "token_mean",
        description=(
            "Loss normalisation: token_mean divides the summed token losses by the number of trainable tokens in "
            "the global mini-batch (DAPO); seq_mean_token_mean averages each sequence over its tokens and the "
            "sequences over the global mini-batch (GRPO paper); constant divides the sum by sequences x "
            "rollout.max_new_tokens (Dr. GRPO)."
        ),
    )
    clip_low: float = Field(
        0.2, ge=0.0, le=1.0, description="PPO ratio clip below: ratios under 1 - clip_low stop pushing down."
    )
    clip_high: float = Field(
        0.2, ge=0.0, le=10.0, description="PPO ratio clip above (DAPO clip-higher uses 0.28)."
    )
    dual_clip: float = Field(
        0.0,
        ge=0.0,
        description="Dual-clip constant c > 1 bounding the loss of negative advantages (0 = off).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each sampled batch.")
    minibatches: int = Field(
        1, ge=1, description="Optimizer steps per pass: the batch is split into this many mini-batches."
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="Weight of the KL penalty to the reference model (0 = no reference model)."
    )
    kl_estimator: Literal["k3_is", "k2", "k3", "k1", "k1_reward"] = Field(
        "k3_is",
        description=(
            "How KL(pi || ref) is penalised, per token, with Schulman's estimators (log r = log ref - log pi; k1 = "
            "-log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r) and the gradient each gives in expectation. In the loss: "
            "k3_is (default): k3 times the ratio pi / pi_old: the gradient of KL(pi || ref), also on stale tokens "
            "(DeepSeek-V3.2; TRL's default); k2: the gradient of KL(pi || ref) on-policy; k3: k3 alone, the GRPO "
            "papers' convention, whose gradient is that of the reverse KL(ref || pi); k1: zero expected gradient (it "
            "regularises nothing). In the reward: k1_reward, PPO-RLHF's convention: kl_coef * k1 of each sampled "
            "token is subtracted from the reward before the advantages (outcome estimators: each sequence's sum, "
            "before the group statistics; gae: a reward on each token), so the policy gradient is that of "
            "E[reward] - kl_coef * KL(pi || ref). kl/ref logs k3's value whatever the choice."
        ),
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="Weight of the entropy bonus (subtracted from the loss)."
    )
    grad_clip: float = Field(
        1.0, ge=0.0, description="Clip the global gradient norm to this value (0 = off)."
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in RL steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Learning-rate decay after warm-up, over train.steps."
    )
    old_logprobs: Literal["sampler", "recompute"] = Field(
        "sampler",
        description=(
            "Old-policy (proximal) log-probs for the PPO ratio: 'sampler' reuses the sampler's (exact for the CPU "
            "sampler, saves a forward pass); 'recompute' runs the trainer over the batch before updating (use when "
            "sampler and trainer numerics differ, e.g. vLLM), and algo.correction then corrects for the gap. "
            "rollout.max_staleness >= 1 always recomputes (the sampler ran an older policy)."
        ),
    )
    correction: Literal["off", "decoupled", "tis", "mis"] = Field(
        "tis",
        description=(
            "Off-policy correction (algo/offpolicy.py) for the gap between the policy that sampled a batch and the "
            "one the update starts from, applied whenever that one is recomputed (old_logprobs = 'recompute', or "
            "rollout.max_staleness >= 1): every choice clips against the recomputed (proximal) policy and weights "
            "each token by rho = pi_prox / pi_sampler: decoupled (AReaL, w = rho), tis (w = min(rho, is_cap)), mis "
            "(w = rho inside [is_mask_low, is_mask_high], else 0), off (w = 1: the gap is ignored)."
        ),
    )
    correction_level: Literal["token", "sequence"] = Field(
        "token",
        description="Where rho is taken: per token, or each sequence's geometric-mean ratio on all its tokens.",
    )
    behaviour_clip: bool = Field(
        True,
        description=(
            "With a correction on: also drop tokens whose probability already moved past [1 - clip_low, 1 + "
            "clip_high] of the sampler's in the direction their advantage pushes (PPO's clip against the sampling "
            "policy), so stale feedback cannot overshoot (algo/offpolicy.py)."
        ),
    )
    is_cap: float = Field(
        2.0, gt=1.0, description="correction = 'tis': the cap C of min(rho, C) (the TIS post's C ~ 2)."
    )
    is_mask_low: float | None = Field(
        None,
        gt=0.0,
        description="correction = 'mis': lower bound of the kept ratios; default 0.5 (token), 0.999 (sequence).",
    )
    is_mask_high: float | None = Field(
        None,
        gt=0.0,
        description="correction = 'mis': upper bound of the kept ratios; default 2.0 (token), 1.001 (sequence).",
    )

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, c: float) -> float:
        if 0.0 < c <= 1.0:
            raise ValueError(
                "must be 0 (off) or greater than 1: a negative-advantage token's loss is capped at c * |A|, which "
                "ratio c already reaches, so with c <= 1 those tokens get no gradient at all (Ye et al. use c = 3)"
            )
        return c

    @model_validator(mode="after")
    def _is_mask_band(self) -> AlgoConfig:
        if self.correction == "mis":
            low, high = self.is_mask_band
            if not low < 1.0 < high:
                raise ValueError(
                    f"algo.is_mask_low = {low:g} and is_mask_high = {high:g} must enclose 1 (low < 1 < high): a sampler "
                    "that agrees with the trainer has ratio 1, and its tokens must be kept"
                )
        return self

    @property
    def is_mask_band(self) -> tuple[float, float]:
        """(low, high) of the mis band: the set bounds, else the level's defaults (`IS_MASK_BAND`)."""
        low, high = IS_MASK_BAND[self.correction_level]
        return (
            self.is_mask_low if self.is_mask_low is not None else low,
            self.is_mask_high if self.is_mask_high is not None else high,
        )
