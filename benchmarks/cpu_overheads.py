"""CPU costs that are not compute, found in the profile passes of issue 10, each measured alone against what
keelrl now does. Prints JSON.

    python benchmarks/cpu_overheads.py [--threads 1] [--repeats 40] [--parts head,cache_rows,...] [--out FILE]

docs/cpu_overheads.json holds the first three parts, docs/decode_attention.json the fourth (`--parts
decode_attention`), docs/matmul_rows.json the fifth (`--parts matmul_rows`).

- `head`: the output head (vs_trl.py's tiny model: hidden 256, 98 tokens) under bf16 autocast, forward and
  backward, at a row count seen before against a new row count on every call. oneDNN builds a kernel per
  new shape; `algo.logprobs.scored_logits` pads the rows so the shapes repeat.
- `cache_rows`: one layer's keys, [32, 4, 31, 64] bf16, repeated to the 256 rows of a group batch, with
  advanced indexing (`tensor[rows]`) against `index_select` (`algo.logprobs.select_cache_rows`).
- `adamw`: one optimizer step over the tiny model's parameter shapes (5.2M fp32), foreach against fused.
- `decode_attention`: one layer's attention in one decode step of the sampler (256 rows = 32 prompts x 8,
  4 heads, 14 prompt + 16 completion positions, head dim 64) under bf16 autocast:
  - keys cached in fp32 (what the rotary embedding leaves) against bf16 (`rollout.hf.CastingStaticCache`);
  - compiled with the query's rotary embedding computed inside from the positions, against cos/sin passed
    in as tensors (`models.compile_decoder` keeps the rotary embedding eager when sampling);
  - cascade attention (each prompt's keys/values read once per group, then the rows' own completion
    positions) against the plain attention over the repeated cache, eager and compiled. Not adopted.
- `matmul_rows`: one matmul of activations [rows, in] by a weight of the tiny model ([in, out]: attention
  256x256, MLP up 256x1024, MLP down 1024x256), microseconds per call, fp32 against bf16, at 1 to 1024 rows.
  A bf16 call has a fixed cost that fp32 has not (most likely oneDNN reordering the weight for AMX on every
  call), so on this CPU fewer, larger micro-batches are cheaper, and a 256-row decode step's matmuls are a
  third fixed cost.
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


def decode_attention(repeats: int, backend: str = "inductor") -> dict[str, float]:
    prompts, group, heads, prompt_len, completion_len, dim = 32, 8, 4, 14, 16, 64
    rows, length, bf16 = prompts * group, prompt_len + completion_len, torch.bfloat16
    scale = dim**-0.5
    q = torch.randn(rows, heads, 1, dim)  # the rotary embedding's output is fp32
    keys, values = torch.randn(rows, heads, length, dim), torch.randn(rows, heads, length, dim, dtype=bf16)
    mask = torch.zeros(rows, 1, 1, length)

    def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)).float() * scale + mask, dim=-1)
        return torch.matmul(weights, v)

    def autocast(fn: Any) -> Any:
        def run(*args: Any) -> Any:
            with torch.autocast("cpu", dtype=bf16):
                return fn(*args)

        return run

    k16 = keys.to(bf16)
    out = {
        "fp32_keys_ms": 1e3 * seconds(lambda: autocast(plain)(q, keys, values), repeats),
        "bf16_keys_ms": 1e3 * seconds(lambda: autocast(plain)(q, k16, values), repeats),
    }
    # the query's rotary embedding, from positions inside the compiled function or as cos/sin tensors
    raw = torch.randn(rows, heads, 1, dim, dtype=bf16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    positions = torch.full((rows, 1), length - 1)

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = torch.cat((-x[..., dim // 2 :], x[..., : dim // 2]), dim=-1)
        return x * cos[:, None] + half * sin[:, None]

    def cos_sin(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    inside = torch.compile(
        autocast(lambda x, pos: plain(rotate(x, *cos_sin(pos)), k16, values)), dynamic=True, backend=backend
    )
    outside = torch.compile(
        autocast(lambda x, c, s: plain(rotate(x, c, s), k16, values)), dynamic=True, backend=backend
    )
    cos, sin = cos_sin(positions)
    out["compiled_rotary_inside_ms"] = 1e3 * seconds(lambda: inside(raw, positions), repeats)
    out["compiled_rotary_outside_ms"] = 1e3 * seconds(lambda: outside(raw, cos, sin), repeats)
    # cascade: prompt keys/values [prompts, ...] once per group, completion keys/values per row
    kp, vp = k16[::group, :, :prompt_len].contiguous(), values[::group, :, :prompt_len].contiguous()
    kc, vc = k16[:, :, prompt_len:].contiguous(), values[:, :, prompt_len:].contiguous()
    q16 = q.to(bf16)

    def cascade(q: torch.Tensor) -> torch.Tensor:
        grouped = q.view(prompts, group, heads, dim).transpose(1, 2)  # [prompts, heads, group, dim]
        sp = torch.matmul(grouped, kp.transpose(2, 3)).transpose(1, 2).reshape(rows, heads, 1, prompt_len)
        sc = torch.matmul(q, kc.transpose(2, 3))
        weights = torch.softmax(torch.cat([sp, sc], dim=-1).float() * scale + mask, dim=-1).to(bf16)
        wp = weights[..., :prompt_len].reshape(prompts, group, heads, prompt_len).transpose(1, 2)
        op = torch.matmul(wp, vp).transpose(1, 2).reshape(rows, heads, 1, dim)
        return op + torch.matmul(weights[..., prompt_len:], vc)

    for name, fn in (("plain", autocast(lambda q: plain(q, k16, values))), ("cascade", autocast(cascade))):
        out[f"{name}_eager_ms"] = 1e3 * seconds(lambda fn=fn: fn(q16), repeats)
        compiled = torch.compile(fn, dynamic=True, backend=backend)
        out[f"{name}_compiled_ms"] = 1e3 * seconds(lambda c=compiled: c(q16), repeats)
    return out


def matmul_rows(repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    for k, n in ((256, 256), (256, 1024), (1024, 256)):
        weight = torch.randn(k, n)
        w16 = weight.bfloat16()
        for rows in (1, 16, 64, 256, 1024):
            x = torch.randn(rows, k)
            x16 = x.bfloat16()
            out[f"{k}x{n}_rows{rows}"] = {
                "fp32_us": 1e6 * seconds(lambda x=x, w=weight: torch.mm(x, w), repeats),
                "bf16_us": 1e6 * seconds(lambda x16=x16, w16=w16: torch.mm(x16, w16), repeats),
            }
    return out


PARTS = {
    "head": head,
    "cache_rows": cache_rows,
    "adamw": adamw,
    "decode_attention": decode_attention,
    "matmul_rows": matmul_rows,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ",".join(PARTS))
    p.add_argument(
        "--quick",
        action="store_true",
        help="every part, 2 repeats, torch.compile with the eager backend (no C++ compilation): seconds",
    )
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats = 2
    parts = a.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {unknown}; choose from {list(PARTS)}")
    torch.set_num_threads(a.threads)
    result: dict[str, Any] = {
        "benchmark": "cpu_overheads",
        "command": " ".join(
            ["python", "benchmarks/cpu_overheads.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "quick": a.quick,
        "threads": a.threads,
        "load_average_start": os.getloadavg(),
    }
    for name in parts:
        quick_compile = {"backend": "eager"} if a.quick and name == "decode_attention" else {}
        result[name] = PARTS[name](a.repeats, **quick_compile)
    result["load_average_end"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
