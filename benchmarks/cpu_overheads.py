"""Three CPU costs that are not compute, found in the second profile pass of issue 10, each measured alone
against what keelrl now does. Prints JSON.

    python benchmarks/cpu_overheads.py [--threads 1] [--repeats 40] [--out docs/cpu_overheads.json]

- `head`: the output head (vs_trl.py's tiny model: hidden 256, 98 tokens) under bf16 autocast, forward and
  backward, at a row count seen before against a new row count on every call. oneDNN builds a kernel per
  new shape; `algo.logprobs.scored_logits` pads the rows so the shapes repeat.
- `cache_rows`: one layer's keys, [32, 4, 31, 64] bf16, repeated to the 256 rows of a group batch, with
  advanced indexing (`tensor[rows]`) against `index_select` (`algo.logprobs.select_cache_rows`).
- `adamw`: one optimizer step over the tiny model's parameter shapes (5.2M fp32), foreach against fused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bf16_attention import seconds

HIDDEN, VOCAB, ROWS = 256, 98, 1015  # one micro-batch of scored positions in vs_trl.py's tiny shape


def head(repeats: int) -> dict[str, float]:
    weight = torch.randn(VOCAB, HIDDEN, requires_grad=True)

    def fwd_bwd_ms(row_counts: list[int]) -> tuple[float, float]:
        inputs = [torch.randn(n, HIDDEN, requires_grad=True) for n in row_counts]
        fwd = bwd = 0.0
        for x in inputs:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                t0 = time.perf_counter()
                y = torch.nn.functional.linear(x, weight)
                fwd += time.perf_counter() - t0
            t0 = time.perf_counter()
            y.float().sum().backward()
            bwd += time.perf_counter() - t0
        return 1e3 * fwd / len(inputs), 1e3 * bwd / len(inputs)

    fwd_bwd_ms([ROWS] * 3)  # the repeated shape's kernels exist before timing
    same = fwd_bwd_ms([ROWS] * repeats)
    new = fwd_bwd_ms([ROWS - 1 - i for i in range(repeats)])  # each row count seen once
    return {
        "repeated_fwd_ms": same[0],
        "repeated_bwd_ms": same[1],
        "new_fwd_ms": new[0],
        "new_bwd_ms": new[1],
    }


def cache_rows(repeats: int) -> dict[str, float]:
    keys = torch.randn(32, 4, 31, 64, dtype=torch.bfloat16)
    rows = torch.arange(32).repeat_interleave(8)
    return {
        "advanced_indexing_ms": 1e3 * seconds(lambda: keys[rows], repeats),
        "index_select_ms": 1e3 * seconds(lambda: keys.index_select(0, rows), repeats),
    }


def adamw(repeats: int) -> dict[str, Any]:
    shapes = [(256, 256)] * 20 + [(1024, 256)] * 15 + [(256,)] * 11  # 5 layers of the tiny Llama
    out: dict[str, Any] = {"parameters": sum(torch.Size(s).numel() for s in shapes)}
    for name, kwargs in (("foreach", {"foreach": True}), ("fused", {"fused": True})):
        params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, **kwargs)
        out[f"{name}_step_ms"] = 1e3 * seconds(opt.step, repeats)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    result = {
        "benchmark": "cpu_overheads",
        "threads": a.threads,
        "load_average_start": os.getloadavg(),
        "head": head(a.repeats),
        "cache_rows": cache_rows(a.repeats),
        "adamw": adamw(a.repeats),
        "load_average_end": os.getloadavg(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
