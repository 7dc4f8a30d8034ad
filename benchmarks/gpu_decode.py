"""The hf engine's decode and the update at a real model's shape (issue 48; part 0 of benchmarks/gpu_check.sh).

A randomly initialised decoder of Qwen2.5-0.5B's trunk (hidden 896, 24 layers, 14 heads, 2 key/value heads,
MLP 4864; 358M parameters with the character vocabulary, no weights to carry), fp32 weights under bf16
autocast, as keelrl trains by default:

1. decode: `HFSampler` on 512 Countdown prompts (64 distinct x 8, the demo's compact template), 24 new tokens
   at temperature 1, eager (`rollout.decode = "eager"`, the engine before issue 48) against graph (a compiled
   step, CUDA graphs): seconds per decode step, generated tokens/s, the compile's one-off seconds, and how many
   rows sampled the same tokens (bf16 compiled kernels round differently, so rows may part after a while);
2. update: keelrl's RL step at that batch (`train_step`, sampling eager), its update profiled with
   torch.profiler: device time by kind of kernel (matmul, attention, element-wise, optimizer, copies), the
   device's busy share of the update's wall time, tokens/s, and TFLOP/s (6 x parameters x trained tokens)
   against the 790 TFLOP/s bf16 measured on an H200 (/work/.library/device/KINDS.md).

    python benchmarks/gpu_decode.py --device cuda --out D.json            # on the GPU (about 3 minutes)
    python benchmarks/gpu_decode.py --quick                               # CPU: a 2-layer model, 16 rows
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from demo_setup import emit, machine
from keelrl.config import config_from_dict
from keelrl.models.load import build_char_tokenizer, save_hf_dir
from keelrl.recipes.demo import DEMO_TASK_PARAMS, demo_rl_config
from keelrl.rollout.hf import HFSampler
from keelrl.rollout.prompts import render_prompt
from keelrl.rollout.types import SamplingSettings
from keelrl.tasks import get_task

SHAPES = {  # Qwen2Config fields
    "qwen05": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "intermediate_size": 4864},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 256},
}  # fmt: skip
PEAK_TFLOPS = 790.0  # bf16 dense, measured on an H200 (KINDS.md)
KINDS = [  # kernel name patterns -> kind, first match wins
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|softmax"),
    ("matmul", r"gemm|cutlass|sm90|matmul|\bmm\b|addmm|bmm|xmma|wgmma|linear"),
    ("optimizer", r"foreach|adam|multi_tensor"),
    ("copy/cast", r"copy|cast|to_copy|memcpy|memset|fill|cat"),
]


def build_model(shape: str, device: str) -> tuple[torch.nn.Module, Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, bos_token_id=None, **SHAPES[shape],
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.eval(), tok


def prompts(tok: Any, distinct: int, group: int) -> list[list[int]]:
    task = get_task("countdown", seed=0, **DEMO_TASK_PARAMS)
    rows = [
        render_prompt(tok, task.prompt(task.problem("train", i), "compact"), "compact")
        for i in range(distinct)
    ]
    return [p for p in rows for _ in range(group)]


def timed_generate(
    sampler: HFSampler, rows: list[list[int]], settings: SamplingSettings, device: str
) -> tuple:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = sampler.generate(rows, settings, list(range(len(rows))))
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def decode(model: torch.nn.Module, tok: Any, device: str, batch: int, new_tokens: int) -> dict[str, Any]:
    rows = prompts(tok, batch // 8, 8)
    settings = SamplingSettings(max_new_tokens=new_tokens, temperature=1.0)
    result: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens, "prompt_tokens": max(map(len, rows))}
    outs = {}
    for mode in ("eager", "graph"):
        sampler = HFSampler(model, tok, autocast="bf16" if device == "cuda" else "off", decode=mode)
        _, first = timed_generate(sampler, rows, settings, device)  # warm-up; graph: compiles
        runs = [timed_generate(sampler, rows, settings, device) for _ in range(3)]
        seconds = sorted(s for _, s in runs)[1]  # the median of three
        outs[mode] = runs[0][0]
        steps = max(len(g.completion_ids) for g in outs[mode])
        tokens = sum(len(g.completion_ids) for g in outs[mode])
        result[mode] = {
            "first_call_s": first, "seconds": seconds, "decode_steps": steps, "tokens": tokens,
            "tokens_per_s": tokens / seconds, "ms_per_step": 1000 * seconds / steps,
        }  # fmt: skip
    result["speedup"] = result["graph"]["tokens_per_s"] / result["eager"]["tokens_per_s"]
    same = [a.completion_ids == b.completion_ids for a, b in zip(outs["eager"], outs["graph"], strict=True)]
    result["rows_with_same_tokens"] = sum(same) / len(same)
    first_diff = [
        next((i for i, (x, y) in enumerate(zip(a.completion_ids, b.completion_ids)) if x != y), None)
        for a, b in zip(outs["eager"], outs["graph"], strict=True)
    ]
    parted = [i for i in first_diff if i is not None]
    result["parted_rows_first_differing_token_median"] = sorted(parted)[len(parted) // 2] if parted else None
    return result


def kind_of(name: str) -> str:
    return next((k for k, pattern in KINDS if re.search(pattern, name, re.IGNORECASE)), "element-wise/other")


def update_profile(model: torch.nn.Module, tok: Any, device: str, batch: int, work: Path) -> dict[str, Any]:
    """keelrl's RL step on this model at `batch` (two warm-up steps, then one with its update profiled)."""
    from torch.profiler import ProfilerActivity, profile

    from keelrl.loop.setup import setup
    from keelrl.stages.rl import step as rl_step

    save_hf_dir(model, tok, work / "model")
    data = demo_rl_config(str(work / "model"), DEMO_TASK_PARAMS, 4, eval_every=0, seed=0)
    data["rollout"].update(batch_size=batch, decode="eager")
    data["train"].update(
        device=device, autocast="bf16" if device == "cuda" else "off", micro_batch_size=min(batch, 128)
    )
    data["eval"] = {"every_steps": 0, "at_start": False, "problems": 8}
    data["checkpoint"] = {"every_steps": 0}
    data["log"]["progress"] = False
    run, state = setup(config_from_dict(data, "gpu_decode"), work / "run", resume="never")
    metrics = [rl_step.train_step(run, state) for _ in range(2)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    original, wall, holder = rl_step.rl_update, [0.0], {}

    def profiled(*args: Any, **kwargs: Any) -> Any:
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            wall[0] = time.perf_counter() - t0
        holder["prof"] = prof
        return out

    rl_step.rl_update = profiled
    try:
        metrics.append(rl_step.train_step(run, state))
    finally:
        rl_step.rl_update = original
    last = metrics[-1]
    # kernels by kind (on CPU, where there are none, the operators by their own CPU time)
    averages = holder["prof"].key_averages()
    kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]

    def ms(e: Any) -> float:
        if not kernels:
            return e.self_cpu_time_total / 1000
        return (getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)) / 1000

    by_kind: dict[str, float] = defaultdict(float)
    for e in kernels or averages:
        by_kind[kind_of(e.key)] += ms(e)
    top = sorted(kernels or averages, key=lambda e: -ms(e))[:12]
    busy = sum(by_kind.values())
    params = sum(p.numel() for p in model.parameters())
    unprofiled = metrics[-2]  # the last warm-up step: wall time without the profiler's overhead
    tflops = 6 * params * unprofiled["tokens/trained"] / unprofiled["time/train_s"] / 1e12
    return {
        "batch": batch,
        "parameters": params,
        "step_s": unprofiled["time/step_s"],
        "generation_s": unprofiled["time/gen_s"],
        "update_s": unprofiled["time/train_s"],
        "update_tokens": unprofiled["tokens/trained"],
        "update_tokens_per_s": unprofiled["tokens/trained"] / unprofiled["time/train_s"],
        "update_tflops": tflops,
        "share_of_peak": tflops / PEAK_TFLOPS if device == "cuda" else None,
        "profiled_update_wall_ms": 1000 * wall[0],
        "profiled_update_tokens": last["tokens/trained"],
        "device_busy_ms": busy,
        "device_busy_share": busy / (1000 * wall[0]) if busy else None,
        "device_ms_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "top_kernels_ms": {e.key[:90]: ms(e) for e in top},
        "cpu_ops_top": [
            {"name": e.key, "cpu_ms": e.self_cpu_time_total / 1000, "calls": e.count}
            for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:10]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--shape", default="qwen05", choices=list(SHAPES))
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--parts", default="decode,update")
    ap.add_argument("--quick", action="store_true", help="CPU, the tiny shape, 16 rows, 8 new tokens")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.device, args.shape, args.batch, args.new_tokens = "cpu", "tiny", 16, 8
    model, tok = build_model(args.shape, args.device)
    result: dict[str, Any] = {"device": args.device, "shape": args.shape, **SHAPES[args.shape]}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    parts = args.parts.split(",")
    if "decode" in parts:
        result["decode"] = decode(model, tok, args.device, args.batch, args.new_tokens)
    if "update" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            result["update"] = update_profile(model, tok, args.device, args.batch, Path(tmp))
    result["machine"] = machine()
    emit(result, args.out)


if __name__ == "__main__":
    main()
