"""Reward-model training as a step of keelrl's one training loop (`train.stage = "rm"`, `keelrl rm train`).

`trainer.train` runs the same loop as for RL and SFT, so a reward-model run has the same run directory,
checkpoints and exact resume, supervisor, guards, sinks and final export. The step: the step's preference pairs
(data.batch_size of them, in the order stages/sft/batches.py gives SFT's examples: a function of the step), their
chosen and rejected sides scored in one forward per micro-batch of `train.micro_batch_size` pairs, and the
Bradley-Terry loss (algo/preference.py) summed over pairs and divided by the step's pair count.

Data (`[data]`): records `{"prompt": str, "chosen": str, "rejected": str, ...}`, what `keelrl judge --export`
writes (other keys are ignored), in any format SFT reads (JSONL, JSON, Parquet, Arrow, save_to_disk);
held out by data.eval_path or data.eval_fraction as for SFT. Each side is encoded by `rm_ids`, the encoding RL's
scoring uses (stages/rm/model.py).

Metrics: `loss/total` and `loss/pair_nll` (the mean pair NLL: heavy-tailed near convergence, so no spike rule
judges it; guards/rules/numerics.py SUPERVISED_LOSSES), `rm/accuracy` and `rm/margin` (the step's pairs),
`grad_norm`, `lr`. Evals: `eval/accuracy` is the held-out *pair* accuracy
(so checkpoint.best_metric and eval_regression apply unchanged), with `eval/loss` and `eval/margin`.
At the end the run's final/ gets `reward_model.json` (stages/rm/model.py's card).

Not built: reward-model training under torchrun, and LoRA on a reward model (both refused at setup).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from keelrl.algo.logprobs import autocast_context
from keelrl.algo.preference import bradley_terry_loss, pair_accuracy
from keelrl.models.load import pad_token_id
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.run.supervisor import pulse
from keelrl.stages.rm.model import RewardCard, pad_right, reward_scores, rm_ids, score_rows
from keelrl.stages.sft.batches import epoch_of, step_indices
from keelrl.stages.sft.data import DataError, Record, read_pairs
from keelrl.step.update import grad_norm_and_clip, supervised_update

CARD_SAMPLE = 512  # completions whose scores give the card's mean and std


@dataclass(frozen=True)
class Pair:
    chosen: list[int]
    rejected: list[int]


@dataclass
class PairData:
    """The encoded training and held-out pairs of a run (built once by setup)."""

    train: list[Pair]
    eval: list[Pair]
    dropped: int  # over data.max_length with too_long = "drop"
    truncated: int
    identical: int = 0  # left out: chosen and rejected are the same text (no preference)

    def describe(self) -> str:
        out = f"{len(self.train)} training pairs, {len(self.eval)} held out"
        if self.identical:
            out += f"; {self.identical} left out (chosen and rejected identical)"
        if self.dropped or self.truncated:
            out += f"; {self.dropped} dropped, {self.truncated} truncated (data.max_length, data.too_long)"
        return out


def encode_pairs(
    records: Sequence[Record], tokenizer: Any, max_length: int, too_long: str, source: str
) -> tuple[list[Pair], int, int]:
    """Encode preference records, applying data.too_long; returns (pairs, dropped, truncated)."""
    out, truncated = [], 0
    for n, record in enumerate(records):
        fields = [record.get(k) for k in ("prompt", "chosen", "rejected")]
        if not all(isinstance(f, str) for f in fields):
            raise DataError(
                f"{source} record {n}: a preference pair needs string fields prompt, chosen and rejected (as "
                f"`keelrl judge --export` writes); it has {sorted(record)}"
            )
        prompt, chosen, rejected = fields
        (c, cut_c), (r, cut_r) = (rm_ids(tokenizer, prompt, side, max_length) for side in (chosen, rejected))
        if cut_c or cut_r:
            if too_long == "error":
                raise DataError(
                    f"{source} record {n} is over data.max_length={max_length} tokens; raise max_length or set "
                    "data.too_long = 'drop' or 'truncate' (truncation keeps each side's end)"
                )
            if too_long == "drop":
                continue
            truncated += 1
        out.append(Pair(c, r))
    return out, len(records) - len(out), truncated  # every record not kept was dropped


def load_pairs(run_cfg: Any, tokenizer: Any) -> PairData:
    """Read and encode [data]'s preference pairs with the reward model's tokenizer."""
    d = run_cfg.data
    train_records, eval_records, identical = read_pairs(d, run_cfg.task.seed)
    train, dropped, truncated = encode_pairs(train_records, tokenizer, d.max_length, d.too_long, d.path)
    held_out, _, _ = encode_pairs(eval_records, tokenizer, d.max_length, d.too_long, d.eval_path or d.path)
    if not train:
        raise DataError(f"{d.path}: no training pairs left ({len(train_records)} records, {dropped} dropped)")
    return PairData(train, held_out, dropped, truncated, identical)


def pair_scores(
    model: Any, pairs: Sequence[Pair], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """(chosen scores [P], rejected scores [P]) from one forward over both sides."""
    ids, lengths = pad_right([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
    scores = reward_scores(model, ids.to(device), lengths)
    return scores[: len(pairs)], scores[len(pairs) :]


def rm_step(run: Run, state: TrainState) -> dict[str, float]:
    """One reward-model step: the step's pairs -> Bradley-Terry loss over micro-batches -> guards -> optimizer."""
    t0 = time.perf_counter()
    cfg, d, data = run.cfg, run.cfg.data, run.stage_data
    assert data is not None, "setup loads the pairs when train.stage = 'rm'"
    run.heartbeat.beat(phase="update")
    indices = step_indices(state.step, len(data.train), d.batch_size, cfg.train.seed, d.shuffle)
    pairs = [data.train[i] for i in indices]
    lr = state.optimizer.param_groups[0]["lr"]
    state.optimizer.zero_grad(set_to_none=True)
    loss_sum = right = margin = 0.0
    mb = cfg.train.micro_batch_size
    for start in range(0, len(pairs), mb):
        pulse()
        with autocast_context(run.world.device, cfg.train.autocast):
            c, r = pair_scores(
                state.policy, pairs[start : start + mb], pad_token_id(run.tokenizer), run.world.device
            )
            loss = bradley_terry_loss(c, r).sum() / len(pairs)
        loss.backward()
        loss_sum += float(loss.detach())
        right += pair_accuracy(c.detach(), r.detach()) * len(c)
        margin += float((c - r).detach().sum())
    run.faults.corrupt_gradients(state.step + 1, state.policy)
    grad_norm = grad_norm_and_clip(state.policy, cfg.algo.grad_clip)
    after = supervised_update(run, state, loss_sum, grad_norm, pair_nll=loss_sum)
    seconds = time.perf_counter() - t0
    return {
        **after,
        "loss/total": loss_sum,
        "loss/pair_nll": loss_sum,
        "rm/accuracy": right / len(pairs),
        "rm/margin": margin / len(pairs),
        "rm/epoch": epoch_of(state.step, len(data.train), d.batch_size),
        "grad_norm": grad_norm,
        "lr": lr,
        "time/train_s": seconds,
        "time/step_s": seconds,
    }


@torch.no_grad()
def held_out_pairs(run: Run, state: TrainState) -> dict[str, float]:
    """Held-out pair accuracy, mean loss and margin (`eval/accuracy`, `eval/loss`, `eval/margin`); rank 0."""
    data = run.stage_data
    if data is None or not data.eval:
        return {}
    c, r = _all_pair_scores(run, state, data.eval)
    return {
        "accuracy": pair_accuracy(c, r),
        "loss": float(bradley_terry_loss(c, r).mean()),
        "margin": float((c - r).mean()),
        "pairs": float(len(data.eval)),
    }


def _all_pair_scores(run: Run, state: TrainState, pairs: Sequence[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    scores = score_rows(
        state.policy, rows, pad_token_id(run.tokenizer), run.cfg.train.micro_batch_size, run.world.device
    )
    return scores[: len(pairs)], scores[len(pairs) :]


def write_card(run: Run, state: TrainState, final_eval: dict[str, float]) -> RewardCard:
    """`reward_model.json` in final/: score statistics over up to CARD_SAMPLE completions of the pairs (held-out
    ones first), train.max_length, the held-out pair accuracy."""
    data = run.stage_data
    assert data is not None
    sample = (data.eval + data.train)[: CARD_SAMPLE // 2]
    scores = torch.cat(_all_pair_scores(run, state, sample))
    card = RewardCard(
        score_mean=float(scores.mean()),
        score_std=max(float(scores.std(correction=0)), 1e-6),
        max_length=run.cfg.data.max_length,
        held_out_pair_accuracy=final_eval.get("eval/accuracy"),
        train_pairs=len(data.train),
        held_out_pairs=len(data.eval),
    )
    card.write(run.run_dir.final_dir)
    return card
