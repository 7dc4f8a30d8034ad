"""Supervised fine-tuning as a step of keelrl's one training loop (`train.stage = "sft"`, `keelrl sft`).

`trainer.train` runs the same loop for SFT as for RL, so an SFT run has the same run directory, checkpoints
and exact resume, supervisor, guards (non-finite values, gradient spikes, and `loss_spike` on `loss/nll`),
sinks and final export. Only the step differs: `sft_step` takes the step's examples (stages/sft/batches.py), runs
the forward over them in micro-batches of `train.micro_batch_size` rows, and minimises
`sum(-logprob * weight)` over the trained tokens with `algo.loss_agg`'s global-count weights, so micro-batching,
packing and the number of ranks do not change the update. Evals add the held-out loss (`eval/loss`, token
mean) to the task's held-out accuracy (data.task_eval).

Metrics: `loss/total` (the loss as normalised by algo.loss_agg), `loss/nll` (token-mean negative
log-likelihood, whatever the normalisation), `sft/epoch`, `sft/examples`, `tokens/trained`,
`sft/rows` and `sft/fill` (share of row positions holding tokens: what packing saves), `grad_norm`, `lr`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from keelrl.algo.logprobs import autocast_context
from keelrl.models.load import pad_token_id
from keelrl.rollout.chat import chat_format
from keelrl.rollout.prompts import render_prompt
from keelrl.run.distributed import agree_on_norm, all_reduce_stats, all_reduce_sum, grad_sync, loss_scale
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.run.supervisor import pulse
from keelrl.stages.sft.batches import SFTBatch, build_batch, epoch_of, step_indices
from keelrl.stages.sft.data import DataError, Example, encode_all, split_records
from keelrl.step.update import as_logprob_module, grad_norm_and_clip, supervised_update


@dataclass
class SFTData:
    """The encoded training and held-out examples of a run (built once by setup)."""

    train: list[Example]
    eval: list[Example]
    dropped: int  # over data.max_length with too_long = "drop", or with nothing left to train on
    truncated: int

    def describe(self) -> str:
        tokens = sum(e.trained_tokens for e in self.train)
        out = f"{len(self.train)} training examples ({tokens} trained tokens), {len(self.eval)} held out"
        if self.dropped or self.truncated:
            out += f"; {self.dropped} dropped, {self.truncated} truncated (data.max_length, data.too_long)"
        return out


def load_sft_data(run_cfg: Any, tokenizer: Any, task: Any, template: str) -> SFTData:
    """Read and encode [data] (formats: stages/sft/data.py) with the run's tokenizer, template and task."""
    d = run_cfg.data
    chat = chat_format(template, tokenizer)

    def render(problem: dict[str, Any]) -> list[int]:
        return render_prompt(tokenizer, task.prompt(problem, template), template)

    train_records, eval_records = split_records(d.path, d.eval_path, d.eval_fraction, run_cfg.task.seed)
    args = (tokenizer, chat, render, d.max_length, d.too_long)
    train, dropped, truncated = encode_all(train_records, *args, source=str(d.path))
    held_out, _, _ = encode_all(eval_records[: d.eval_examples], *args, source=str(d.eval_path or d.path))
    if not train:
        raise DataError(
            f"{d.path}: no training examples left ({len(train_records)} records, {dropped} dropped as longer than "
            f"data.max_length={d.max_length} or with no answer tokens)"
        )
    return SFTData(train, held_out, dropped, truncated)


def row_logprobs(module: torch.nn.Module, mb: SFTBatch) -> torch.Tensor:
    """Log-probs [b, T] of the trained tokens of rows `mb`, each example attending only to itself."""
    lp, _ = module(
        mb.input_ids,
        (mb.documents >= 0).long(),
        mb.target_mask,
        1.0,
        share_prefix=False,
        documents=mb.documents,
        positions=mb.positions,
    )
    return lp


def sft_backward(
    module: torch.nn.Module, batch: SFTBatch, global_tokens: float, micro_batch_size: int, run: Run
) -> dict[str, float]:
    """Accumulate the gradient of the step's loss over micro-batches of rows; returns this rank's sums of
    the loss and of the token-mean NLL over the step's `global_tokens` (the caller reduces them over ranks)."""
    world = run.world
    scale = loss_scale(world)
    chunks = batch.chunks(micro_batch_size)
    loss_sum = nll_sum = 0.0
    for i, chunk in enumerate(chunks):
        pulse()
        mb = chunk.to(world.device)
        with grad_sync(module, i == len(chunks) - 1), autocast_context(world.device, run.cfg.train.autocast):
            lp = row_logprobs(module, mb)  # [b, T]
            loss = -(lp * mb.weights).sum()
            (loss * scale).backward()
        loss_sum += float(loss.detach())
        nll_sum += float(-(lp.detach() * mb.target_mask).sum()) / max(global_tokens, 1.0)
    return {"loss/total": loss_sum, "loss/nll": nll_sum}


def step_batch(run: Run, examples: list[Example]) -> tuple[SFTBatch, float]:
    """This rank's share of `examples` (every world_size-th) as rows, weighted with the global counts; and
    the global count of trained tokens."""
    d, world = run.cfg.data, run.world
    mine = examples[world.rank :: world.world_size]
    g_tokens = all_reduce_sum(float(sum(e.trained_tokens for e in mine)), world)
    pad = pad_token_id(run.tokenizer)
    batch = build_batch(
        mine, run.cfg.algo.loss_agg, g_tokens, float(len(examples)), d.max_length, d.packing, pad
    )
    return batch, g_tokens


def sft_step(run: Run, state: TrainState) -> dict[str, float]:
    """One SFT step: the step's examples -> forward/backward in micro-batches -> guards -> optimizer step."""
    t0 = time.perf_counter()
    cfg, d, data = run.cfg, run.cfg.data, run.stage_data
    assert data is not None, "setup loads the data when train.stage = 'sft'"
    run.heartbeat.beat(phase="update")
    indices = step_indices(state.step, len(data.train), d.batch_size, cfg.train.seed, d.shuffle)
    batch, g_tokens = step_batch(run, [data.train[i] for i in indices])
    lr = state.optimizer.param_groups[0]["lr"]
    state.optimizer.zero_grad(set_to_none=True)
    module = run.train_module or as_logprob_module(state.policy)
    sums = sft_backward(module, batch, g_tokens, cfg.train.micro_batch_size, run)
    stats = all_reduce_stats(
        {
            **sums,
            "tokens/trained": float(batch.target_mask.sum()),
            "tokens/positions": float((batch.documents >= 0).sum()),
            "tokens/row_slots": float(batch.documents.numel()),
            "sft/rows": float(batch.input_ids.shape[0]),
        },
        run.world,
    )
    run.faults.corrupt_gradients(state.step + 1, state.policy)
    grad_norm = agree_on_norm(grad_norm_and_clip(state.policy, cfg.algo.grad_clip), run.world)
    after = supervised_update(run, state, stats["loss/total"], grad_norm, nll=stats["loss/nll"])
    seconds = time.perf_counter() - t0
    fill = stats.pop("tokens/positions") / max(stats.pop("tokens/row_slots"), 1.0)
    return {
        **stats,
        **after,
        "sft/fill": fill,
        "sft/epoch": epoch_of(state.step, len(data.train), d.batch_size),
        "sft/examples": float(d.batch_size),
        "grad_norm": grad_norm,
        "lr": lr,
        "time/train_s": seconds,
        "time/step_s": seconds,
        "throughput/tokens_per_s": stats["tokens/trained"] / max(seconds, 1e-9),
    }


@torch.no_grad()
def held_out_loss(run: Run, state: TrainState) -> dict[str, float]:
    """Token-mean NLL of the held-out examples under the current policy (`eval/loss` once prefixed); rank 0."""
    data = run.stage_data
    if data is None or not data.eval:
        return {}
    pad = pad_token_id(run.tokenizer)
    tokens = float(sum(e.trained_tokens for e in data.eval))
    d = run.cfg.data
    batch = build_batch(data.eval, "token_mean", tokens, float(len(data.eval)), d.max_length, d.packing, pad)
    module = as_logprob_module(run.whole_policy(state))
    total = 0.0
    for chunk in batch.chunks(run.cfg.train.micro_batch_size):
        pulse()
        mb = chunk.to(run.world.device)
        total += float(-(row_logprobs(module, mb) * mb.weights).sum())
    return {"loss": total, "examples": float(len(data.eval))}
