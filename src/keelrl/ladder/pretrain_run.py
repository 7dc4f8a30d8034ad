"""One point of a pretraining ladder (`ladder.kind = "pretrain"`), run as its own process by `keelrl ladder`:
`python -m keelrl.ladder.pretrain_run CONFIG --run-dir D --seed S [--set k=v ...]`.

It pretrains model.tiny (init seed S) for ladder.pretrain_steps on the demo's corpus for the config's Countdown
task (`keelrl.recipes.demo.pretrain`, the function `keelrl demo` makes its base models with), measures the mean
per-token loss on ladder.heldout_lines corpus lines of *test* problems, and writes D/final (an HF model dir: a
base an RL ladder can start from) and D/summary.json."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl.config import Config, ConfigError, load_config
from keelrl.monitor.run_dir import atomic_write_text
from keelrl.recipes.demo import corpus_text, pad_lines, pretrain
from keelrl.tasks import TaskError, get_task
from keelrl.tasks.countdown import Countdown


def build_base(cfg: Config, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The untrained model.tiny (init seed `seed`) and the demo's character tokenizer."""
    from keelrl.models.load import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    tiny = cfg.model.tiny.model_copy(update={"init_seed": seed})
    return build_tiny_model(tiny, len(tokenizer), tokenizer.eos_token_id), tokenizer


@torch.no_grad()
def heldout_loss(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> float:
    """Mean next-token loss (nats per token, EOS included) over `texts`, as pretraining's loss counts it."""
    total, count = 0.0, 0
    for start in range(0, len(texts), 64):
        ids, labels = pad_lines(tokenizer, texts[start : start + 64])
        logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
        nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
        mask = labels[:, 1:] != -100  # targets 1..len-1 of each line
        total += float(nll[mask].sum())
        count += int(mask.sum())
    return total / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keelrl.ladder.pretrain_run")
    parser.add_argument("config", nargs="?")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.set)
        task = get_task(cfg.task.name, seed=cfg.task.seed, **cfg.task.params)
        if not isinstance(task, Countdown):
            raise ConfigError(
                f"ladder.kind = 'pretrain' pretrains on the demo's Countdown corpus; task.name is {cfg.task.name!r}"
            )
    except (ConfigError, TaskError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build_base(cfg, args.seed)
    lad = cfg.ladder
    result = pretrain(
        model, tokenizer, lambda i: corpus_text(task, i, args.seed),
        lad.pretrain_steps, lad.pretrain_batch, lad.pretrain_lr, args.seed,
    )  # fmt: skip
    texts = [corpus_text(task, i, args.seed, split="test") for i in range(lad.heldout_lines)]
    loss = heldout_loss(model, tokenizer, texts)
    if not math.isfinite(loss):
        print(f"error: the held-out loss is {loss}", file=sys.stderr)
        return 1
    from keelrl.models.load import save_hf_dir

    save_hf_dir(model, tokenizer, run_dir / "final")
    summary = {
        "state": "finished",
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens": result.tokens,
        "steps": result.steps,
        "train_loss": result.final_loss,
        "heldout_loss": loss,
        "seconds": result.seconds,
        "final_dir": str(run_dir / "final"),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
