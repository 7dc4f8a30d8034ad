"""RL with a learned reward (`reward.model`): after the task's verifier has scored a batch, the reward model scores
each completion, and the reward RL trains on becomes
`reward.verifier_weight * verifier + reward.model_weight * (raw - mean) / std` (algo/preference.py).

- What the reward model reads is what a person judging the rollout reads (`Prompter.shown`), encoded by
  `rm_ids` exactly as its training pairs were (stages/rm/model.py), cut to the max_length it was trained with.
- mean and std: `reward.score_mean` / `reward.score_std`, else the reward model's card (measured on its own
  data at the end of `keelrl rm train`); fixed for the run, so the raw score's growth stays visible.
- Each rollout keeps both parts: `info["verifier_reward"]` and `info["reward_model"]` (the raw score);
  `correct` stays the verifier's. The batch's means are logged as `reward/verifier` and `reward/model`, which
  the reward_hacking rule compares with the verifier's held-out eval/accuracy, and the report plots.
- Evals are unchanged: eval/accuracy is the verifier's, on held-out problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from keelrl.algo.preference import combine_rewards, normalise_scores
from keelrl.config.reward import RewardConfig
from keelrl.models.load import ModelLoadError, load_policy, pad_token_id
from keelrl.rollout import Rollout
from keelrl.rollout.episodes import Prompter
from keelrl.stages.rm.model import CARD, RewardCard, resolve_model_dir, rm_ids, score_rows

# a reward model without a card: its inputs are cut to this many tokens (the end kept)
DEFAULT_MAX_LENGTH = 2048


class LearnedReward:
    """A reward model loaded for RL, with the normalisation and weights of [reward]."""

    def __init__(self, cfg: RewardConfig, model_cfg: Any, device: torch.device) -> None:
        path = resolve_model_dir(cfg.model)
        card = RewardCard.read(path)
        mean = cfg.score_mean if cfg.score_mean is not None else (card.score_mean if card else None)
        std = cfg.score_std if cfg.score_std is not None else (card.score_std if card else None)
        if mean is None or std is None:
            raise ModelLoadError(
                f"reward.model = {cfg.model!r} has no {CARD} (a `keelrl rm train` run writes one in final/), so the "
                "scale of its scores is unknown: set reward.score_mean and reward.score_std (e.g. the mean and std "
                "of its scores on your data; 0 and 1 use raw scores)"
            )
        rm_cfg = model_cfg.model_copy(update={"path": str(path), "lora": type(model_cfg.lora)()})
        self.model, self.tokenizer = load_policy(rm_cfg, head="reward")
        self.model.to(device).eval().requires_grad_(False)
        self.device, self.cfg = device, cfg
        self.mean, self.std = float(mean), float(std)
        self.max_length = card.max_length if card else DEFAULT_MAX_LENGTH
        self.pad_id = pad_token_id(self.tokenizer)

    def raw_scores(self, texts: Sequence[tuple[str, str]]) -> torch.Tensor:
        """The reward model's scores [N] of (prompt, completion) texts."""
        rows = [rm_ids(self.tokenizer, p, c, self.max_length)[0] for p, c in texts]
        return score_rows(self.model, rows, self.pad_id, self.cfg.batch_size, self.device)

    def apply(self, prompter: Prompter, rollouts: Sequence[Rollout]) -> None:
        """Replace each scored rollout's reward by the combined one, keeping both parts in its info."""
        if not rollouts:
            return
        raw = self.raw_scores([prompter.shown(r) for r in rollouts])
        verifier = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        z = normalise_scores(raw, self.mean, self.std)
        combined = combine_rewards(verifier, z, self.cfg.verifier_weight, self.cfg.model_weight)
        for r, v, s, c in zip(rollouts, verifier.tolist(), raw.tolist(), combined.tolist()):
            r.info["verifier_reward"], r.info["reward_model"], r.reward = v, s, c
