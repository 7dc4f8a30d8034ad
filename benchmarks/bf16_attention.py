"""Where bf16 time goes on this CPU: matmul throughput fp32 vs bf16, and one forward+backward of vs_trl.py's
tiny shape in fp32 and under bf16 autocast, with SDPA and with eager attention. Prints JSON.

    python benchmarks/bf16_attention.py [--threads 1] [--repeats 4] [--out docs/bf16_attention.json]

A lead for issue 10, not a keelrl setting: keelrl trains with the model's default attention (SDPA).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch

from keelrl.config import ModelConfig, TinyModelConfig
from keelrl.models.load import load_policy

MATMUL_SHAPES = [(4096, 256, 256), (4096, 256, 1024), (4096, 1024, 256), (2048, 2048, 2048)]
TINY = TinyModelConfig(hidden_size=256, num_layers=5, num_heads=4, max_positions=128, init_seed=0)  # vs_trl's
ROWS, SEQ = 64, 28  # one micro-batch of vs_trl's tiny shape (prompt ~13 + completion 16 tokens)


def seconds(fn: Any, repeats: int) -> float:
    for _ in range(2):
        fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def matmuls(repeats: int, shapes: list[tuple[int, int, int]] = MATMUL_SHAPES) -> list[dict[str, Any]]:
    out = []
    for m, k, n in shapes:
        row: dict[str, Any] = {"shape": [m, k, n]}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            row[f"{str(dtype).removeprefix('torch.')}_gflop_per_s"] = round(
                2 * m * k * n / seconds(lambda a=a, b=b: a @ b, 5 * repeats) / 1e9, 1
            )
        out.append(row)
    return out


def forward_backward(repeats: int, tiny: TinyModelConfig = TINY) -> dict[str, float]:
    """Seconds per 256 sequences (4 micro-batches of 64) for one forward+backward of the tiny model."""
    model, _ = load_policy(ModelConfig(path="tiny", tiny=tiny))
    ids = torch.randint(0, model.config.vocab_size, (ROWS, SEQ), generator=torch.Generator().manual_seed(0))
    out = {}
    for attention in ("sdpa", "eager"):
        model.set_attn_implementation(attention)
        for precision in ("fp32", "bf16"):

            def step(bf16: bool = precision == "bf16") -> None:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    logits = model(input_ids=ids).logits
                logits.float().log_softmax(-1).mean().backward()

            out[f"{attention}_{precision}_s_per_256_seqs"] = round(seconds(step, repeats) * 256 / ROWS, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="one small matmul and a 1-layer model: seconds")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shapes, tiny = MATMUL_SHAPES, TINY
    if a.quick:
        a.repeats, shapes = 1, [(64, 32, 32)]
        tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, max_positions=128)
    result = {
        "benchmark": "bf16_attention",
        "command": f"python benchmarks/bf16_attention.py --threads {a.threads} --repeats {a.repeats}"
        + (" --quick" if a.quick else "")
        + (f" --out {a.out}" if a.out else ""),
        "quick": a.quick,
        "torch": torch.__version__,
        "threads": a.threads,
        "load_average_start": os.getloadavg(),
        "matmul": matmuls(a.repeats, shapes),
        "forward_backward": forward_backward(a.repeats, tiny),
        "load_average_end": os.getloadavg(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
