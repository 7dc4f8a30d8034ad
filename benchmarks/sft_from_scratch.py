"""SFT from scratch: a randomly initialised demo-sized model (1.06M parameters) fine-tuned with `train.stage =
"sft"` on two-number Countdown problems and their reference answers ({problem, completion} records), then
held-out loss and accuracy at every eval. Also measures what a healthy SFT run's loss/nll looks like to the
`loss_spike` guard (largest robust z and ratio of a step against its 20 predecessors), which is where that
rule's defaults come from.

    python benchmarks/sft_from_scratch.py [--steps 300] [--out /tmp/sft_bench]   # ~5 min on one thread
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from keelrl.config import TinyModelConfig, config_from_dict
from keelrl.guards.base import robust_z
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.recipes.demo import DEMO_MODEL, DEMO_TASK_PARAMS
from keelrl.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--examples", type=int, default=4000)
    ap.add_argument("--out", default="/tmp/sft_bench")
    ap.add_argument(
        "--quick", action="store_true", help="22 steps of 8 examples (the loss-spike window is 20): seconds"
    )
    args = ap.parse_args()
    if args.quick:
        args.steps, args.examples = 22, 200
    torch.set_num_threads(1)
    out = Path(args.out)
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(**DEMO_MODEL.model_dump()), len(tok), tok.eos_token_id)
    save_hf_dir(model, tok, out / "base")
    task = get_task("countdown", **DEMO_TASK_PARAMS)
    rows = []
    for i in range(args.examples):
        p = task.problem("train", i)
        rows.append({"problem": p, "completion": f"<answer>{task.reference_answer(p)}</answer>"})
    (out / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "model": {"path": str(out / "base")},
        "task": {"name": "countdown", "template": "compact", "params": DEMO_TASK_PARAMS},
        "rollout": {"max_new_tokens": 24},
        "algo": {"lr": 3e-3, "lr_schedule": "cosine", "warmup_steps": 10},
        "data": {"path": str(out / "data.jsonl"), "batch_size": 64, "max_length": 64, "eval_fraction": 0.05},
        "train": {"stage": "sft", "steps": args.steps, "micro_batch_size": 64, "threads": 1},
        "eval": {"every_steps": 50, "problems": 200, "at_start": True},
        "checkpoint": {"every_steps": 50, "keep_last": 1},
        "log": {"progress": False},
        "supervisor": {"enabled": False},
    }
    if args.quick:
        cfg["data"].update(batch_size=8, eval_fraction=0.1)
        cfg["train"]["micro_batch_size"] = 8
        cfg["eval"].update(every_steps=11, problems=8)
        cfg["checkpoint"]["every_steps"] = 11
    t0 = time.time()
    train(config_from_dict(cfg), out / "run", resume="never")
    records = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    nll = [r["loss/nll"] for r in records if "loss/nll" in r]
    z = [robust_z(nll[i], nll[i - 20 : i]) for i in range(20, len(nll))]
    ratio = [nll[i] / statistics.median(nll[i - 20 : i]) for i in range(20, len(nll))]
    evals = [
        {"step": r["step"], "eval_loss": r["eval/loss"], "eval_accuracy": r.get("eval/accuracy")}
        for r in records
        if "eval/loss" in r
    ]
    print(
        json.dumps(
            {
                "benchmark": "sft_from_scratch",
                "quick": args.quick,
                "steps": len(nll),
                "wall_s": round(time.time() - t0, 1),
                "evals": evals,
                "loss_spike_healthy_max_z": max(z),
                "loss_spike_healthy_max_ratio": max(ratio),
            }
        )
    )


if __name__ == "__main__":
    main()
