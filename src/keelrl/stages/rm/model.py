"""A reward model: a decoder with a scalar head (transformers' ...ForSequenceClassification, one label), what it
reads, and the card it leaves beside its weights.

- Input: `rm_ids(tokenizer, prompt, completion)`, the one encoding used both to train a reward model and to
  score RL's completions with it. With a chat template: the user turn `prompt` and the assistant turn
  `completion` through the template; without one: prompt tokens then completion tokens. No EOS is added:
  transformers' own forward (and TRL's) reads the score at the last token that is not the pad token, and many
  tokenizers pad with EOS, so a trailing EOS would be skipped there. Over `max_length` tokens, the *end* is
  kept (the completion is what is scored).
- Score: the head on the decoder's hidden state at each sequence's last token, found from its length (rows are
  right-padded), so padding and the pad token's id never matter.
- Card (`reward_model.json` in the run's final/): the mean and std of the model's scores on its own data (RL's
  fixed normalisation, algo/preference.py), the max_length it was trained with, and its held-out pair accuracy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl.rollout.chat import encode_text

CARD = "reward_model.json"


def rm_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str, max_length: int
) -> tuple[list[int], bool]:
    """The reward model's tokens for (prompt, completion), at most `max_length` (the end kept); and whether
    they were cut."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = encode_text(tokenizer, text)
    else:
        ids = encode_text(tokenizer, prompt) + encode_text(tokenizer, completion)
    return ids[-max_length:], len(ids) > max_length


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows right-padded into [B, T] ids, and their lengths [B]."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    ids = torch.full((len(rows), int(lengths.max()) if len(rows) else 0), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return ids, lengths


def reward_scores(model: PreTrainedModel, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One float32 score per row [B]: the head on the hidden state of the row's last token (lengths - 1)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    mask = (positions[None, :] < lengths[:, None].to(input_ids.device)).long()
    hidden = model.base_model(input_ids=input_ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths.to(hidden.device) - 1]
    return model.score(last).squeeze(-1).float()


@torch.no_grad()
def score_rows(
    model: PreTrainedModel, rows: Sequence[Sequence[int]], pad_id: int, batch_size: int, device: torch.device
) -> torch.Tensor:
    """Scores [N] of token rows, `batch_size` rows per forward (sorted by length: less padding)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = torch.zeros(len(rows))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, lengths = pad_right([rows[i] for i in idx], pad_id)
        out[idx] = reward_scores(model, ids.to(device), lengths).cpu()
    return out


@dataclass(frozen=True)
class RewardCard:
    """What RL needs to know about a reward model beyond its weights (`reward_model.json`)."""

    score_mean: float
    score_std: float
    max_length: int
    held_out_pair_accuracy: float | None
    train_pairs: int
    held_out_pairs: int

    def write(self, directory: Path) -> None:
        (directory / CARD).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @staticmethod
    def read(directory: Path) -> RewardCard | None:
        path = directory / CARD
        return RewardCard(**json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None


def resolve_model_dir(path: str) -> Path:
    """`reward.model` as a model directory: a `keelrl rm train` run directory means its final/."""
    p = Path(path).expanduser()
    return p / "final" if (p / "final" / "config.json").is_file() else p
