"""Checkpoint size with and without LoRA: one step of configs/smoke.toml per tiny-model shape and LoRA rank
(0: full fine-tuning), and the bytes of its step-1 checkpoint (every file the manifest lists: weights or
adapters, optimizer state, RNG, state.json, tokenizer). Prints JSON; docs/RESULTS.md, "LoRA (issue 26)".

    python benchmarks/lora_sizes.py [--out /tmp/lora_sizes]   # about a minute
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keelrl.config import load_config
from keelrl.loop.trainer import train
from keelrl.run.checkpoint import read_manifest

SETTINGS = [
    "train.steps=1", "checkpoint.every_steps=1", "eval.every_steps=0", "eval.at_start=false",
    "supervisor.enabled=false", "log.progress=false", "rollout.batch_size=8", "rollout.max_new_tokens=8",
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/lora_sizes")
    ap.add_argument("--quick", action="store_true", help="one 1-layer shape, ranks 0 and 8: seconds")
    args = ap.parse_args()
    out = Path(args.out)
    results = {}
    shapes, ranks = (((32, 1),), (0, 8)) if args.quick else (((128, 4), (256, 2)), (0, 8, 16))
    for hidden, layers in shapes:
        for rank in ranks:
            name = f"h{hidden}_l{layers}_r{rank}"
            extra = [f"model.tiny.hidden_size={hidden}", f"model.tiny.num_layers={layers}"]
            extra += [f"model.lora.rank={rank}"] if rank else []
            summary = train(load_config("configs/smoke.toml", SETTINGS + extra), out / name, resume="never")
            files = read_manifest(out / name / "checkpoints" / "step_00000001")["files"]
            results[name] = {
                "bytes": sum(int(f["bytes"]) for f in files.values()),
                "parameters": summary["model"]["parameters"],
                "lora": summary.get("lora"),
            }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
