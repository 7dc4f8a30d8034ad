"""How far bf16 log-probs are from fp32 ones, with and without `model.fp32_head`: one batch of Countdown prompts
with sampled completions (fp32 sampler), scored by the trainer's log-prob path in fp32 (the reference), under
bf16 autocast, and under bf16 autocast with the head in fp32. Prints JSON: mean and max |log-prob - reference|
over the completion tokens, and the seconds of each scoring pass.

    python benchmarks/fp32_head.py --model smollm2 --out docs/fp32_head.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    from keelrl.algo.logprobs import autocast_context, completion_logprobs
    from keelrl.config import ModelConfig, TinyModelConfig
    from keelrl.models.load import load_policy, use_fp32_head
    from keelrl.rollout import SamplingSettings, make_sampler, render_prompt
    from keelrl.step.batch import TrainBatch, collate
    from keelrl.tasks import get_task

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument(
        "--quick", action="store_true", help="a random 1-layer model, 2 rows of 4 tokens: seconds"
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.quick:
        args.model, args.rows, args.tokens = "tiny", 2, 4
        model = ModelConfig(path="tiny", tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2))
    else:
        model = ModelConfig(path=args.model)
    policy, tok = load_policy(model)
    task = get_task("countdown")
    template = "chat" if args.model == "smollm2" else "compact"
    prompts = [
        render_prompt(tok, task.prompt(task.problem("test", i), template), template) for i in range(args.rows)
    ]
    gens = make_sampler(None, policy, tok).generate(
        prompts, SamplingSettings(args.tokens, 1.0), list(range(args.rows))
    )
    from keelrl.rollout import Rollout

    rollouts = [
        Rollout(
            problem_index=i,
            problem={},
            group=i,
            prompt_ids=p,
            completion_ids=g.completion_ids,
            sample_logprobs=g.logprobs,
            trainable=[1] * len(g.completion_ids),
            finish_reason=g.finish_reason,
            policy_version=0,
            sampling=SamplingSettings(args.tokens, 1.0),
        )
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]
    batch: TrainBatch = collate(rollouts, tok.pad_token_id or 0, torch.device("cpu"))
    mask = batch.target_mask.bool()

    def score(mode: str) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        with torch.no_grad(), autocast_context(batch.input_ids.device, mode):  # type: ignore[arg-type]
            lp, _ = completion_logprobs(policy, batch.input_ids, batch.attention_mask, batch.target_mask, 1.0)
        return lp[mask], time.perf_counter() - t0

    reference, ref_s = score("off")
    bf16, bf16_s = score("bf16")
    use_fp32_head(policy)
    fp32_head, head_s = score("bf16")
    out = {
        "benchmark": "fp32_head",
        "quick": args.quick,
        "model": args.model,
        "tokens": int(mask.sum()),
        "bf16": {
            "mean_abs": float((bf16 - reference).abs().mean()),
            "max_abs": float((bf16 - reference).abs().max()),
        },
        "bf16_fp32_head": {
            "mean_abs": float((fp32_head - reference).abs().mean()),
            "max_abs": float((fp32_head - reference).abs().max()),
        },
        "seconds": {"fp32": round(ref_s, 2), "bf16": round(bf16_s, 2), "bf16_fp32_head": round(head_s, 2)},
        "command": "python benchmarks/fp32_head.py "
        + ("--quick" if args.quick else f"--model {args.model} --rows {args.rows} --tokens {args.tokens}"),
    }
    text = json.dumps(out, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
