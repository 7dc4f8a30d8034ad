"""How a policy does on each problem of a Countdown set: greedy item accuracy by position on held-out x4 sets,
and the operations its equations use. Prints JSON (docs/curriculum.md, "Countdown sets").

    python benchmarks/countdown_set_positions.py MODEL_DIR [MODEL_DIR ...] [--family countdown_set] [--sets 200]
                                                 [--out FILE]

Reads whether a skill learnt on one-problem prompts carries to the same problems inside longer prompts: a policy
that reads the target of the problem each equation is for scores alike at every position. With a scratchpad
(`--family countdown_set_restated`: each problem's line again with its equation before the answer block) it
also reports how faithfully the model copies: restated lines equal to the prompt's, and answer equations equal
to the scratchpad's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from curriculum import BucketView  # benchmarks/
from curriculum_families import FAMILIES
from keelrl.config import ModelConfig, TinyModelConfig
from keelrl.evals import run_eval
from keelrl.models.load import build_char_tokenizer, build_tiny_model, load_policy, save_hf_dir
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.tasks import get_task
from keelrl.tasks.countdown import score_countdown


def count_copies(copies: dict[str, int], problem: dict, text: str, parts: list[str], task: object) -> None:
    """Add one completion's scratchpad lines (`line = equation`, before `<answer>`) to the copy counts."""
    worked = [line.split(" = ", 1) for line in text.split("<answer>")[0].splitlines() if " = " in line]
    prompt_lines = task.prompt(problem, "compact").user.splitlines()  # type: ignore[attr-defined]
    for j, (line, equation) in enumerate(worked):
        copies["lines"] += 1
        copies["lines_faithful"] += j < len(prompt_lines) and line.strip() == prompt_lines[j]
        if j < len(parts):
            copies["equations"] += 1
            copies["equations_as_in_scratchpad"] += parts[j].strip() == equation.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path, help="HF directories (e.g. a benchmark run's final/)")
    ap.add_argument("--family", choices=["countdown_set", "countdown_set_restated"], default="countdown_set")
    ap.add_argument("--sets", type=int, default=200, help="held-out x4 sets")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--quick", action="store_true", help="4 sets; without MODEL_DIR, a random 1-layer model: seconds"
    )
    a = ap.parse_args()
    if a.quick:
        a.sets = 4
        if not a.models:
            tok = build_char_tokenizer()
            shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, max_positions=256)
            scratch = tempfile.TemporaryDirectory(prefix="keelrl_positions_")  # removed when main returns
            a.models = [Path(scratch.name) / "random"]
            save_hf_dir(build_tiny_model(shape, len(tok), tok.eos_token_id), tok, a.models[0])
    if not a.models:
        ap.error("give at least one MODEL_DIR (or --quick)")
    torch.set_num_threads(1)
    fam = FAMILIES[a.family]
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
        copies = {"lines": 0, "lines_faithful": 0, "equations": 0, "equations_as_in_scratchpad": 0}
        for result in results:
            parts = (result.answers[0] or "").split(";")
            count_copies(copies, result.problem, result.texts[0], parts, task)
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
            **({"copies": copies} if a.family == "countdown_set_restated" else {}),
        }
    text = json.dumps(out, indent=1)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
