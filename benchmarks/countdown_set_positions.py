"""How a policy does on each problem of a Countdown set: greedy item accuracy by position on held-out x4 sets,
and the operations its equations use. Prints JSON (docs/curriculum.md, "Countdown sets").

    python benchmarks/countdown_set_positions.py MODEL_DIR [MODEL_DIR ...] [--sets 200] [--out FILE]

Reads whether a skill learnt on one-problem prompts carries to the same problems inside longer prompts: a policy
that reads the target of the problem each equation is for scores alike at every position.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from curriculum import BucketView  # benchmarks/
from curriculum_families import FAMILIES
from keelrl.config import ModelConfig
from keelrl.evaluate import run_eval
from keelrl.models import load_policy
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.tasks import get_task
from keelrl.tasks.countdown import score_countdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="HF directories (e.g. a benchmark run's final/)")
    ap.add_argument("--sets", type=int, default=200, help="held-out x4 sets")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    fam = FAMILIES["countdown_set"]
    task = get_task(fam.task, **fam.params)
    bucket = task.buckets()[-1]  # type: ignore[attr-defined]
    out = {}
    for model in a.models:
        policy, tokenizer = load_policy(ModelConfig(path=str(model)))
        results = run_eval(
            sampler=HFSampler(policy, tokenizer),
            tokenizer=tokenizer,
            task=BucketView(task, bucket),  # type: ignore[arg-type]
            template="compact",
            num_problems=a.sets,
            settings=SamplingSettings(fam.max_new_tokens, temperature=0.0),
            batch_size=256,
        )
        solved, ops = [0] * int(bucket[1:]), dict.fromkeys("+-*/", 0)
        for result in results:
            parts = (result.answers[0] or "").split(";")
            for j, (item, part) in enumerate(zip(result.problem["items"], parts)):
                solved[j] += score_countdown(
                    item["numbers"], item["target"], f"<answer>{part}</answer>"
                ).correct
                for op in ops:
                    ops[op] += op in part
        out[str(model)] = {
            f"{bucket}_item_accuracy_by_position": [n / a.sets for n in solved],
            f"{bucket}_set_accuracy": sum(r.correct[0] for r in results) / a.sets,
            "ops_written": ops,
        }
    text = json.dumps(out, indent=1)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
