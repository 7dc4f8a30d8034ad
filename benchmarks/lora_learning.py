"""Does RL with LoRA learn? The demo's RL stage (two-number Countdown, the tiny model pretrained by `keelrl demo`'s
recipe) with `model.lora` on: held-out accuracy (greedy, 500 problems) of the base and of the final merged export
(final/), the paired change with its 95% interval, the in-run evals (200 problems every 20 steps), the adapter's
share of the parameters and the checkpoint size against a full fine-tuning checkpoint of the same run. An arm is
`rank:lr` (rank 0: full fine-tuning, the demo as it is); alpha is 2 x rank. Prints JSON (and writes --json).

    python benchmarks/lora_learning.py --arms 16:3e-3 16:1e-3 --out /tmp/lora_learn --json docs/lora_learning.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from demo_setup import QUICK_PLAN, quick_rl
from objectives_learning import base_model, evaluate  # the same base and held-out eval as the objectives'


def merged_checkpoint(cfg: Any, checkpoint: Path, out: Path) -> Path:
    """A checkpoint as a model directory: itself (full fine-tuning), or its base with its adapters merged."""
    from keelrl.models import lora
    from keelrl.models.load import load_policy, save_hf_dir

    if not (checkpoint / lora.ADAPTER_WEIGHTS).exists():
        return checkpoint
    policy, tok = load_policy(cfg.model)
    lora.apply_lora(policy, cfg.model.lora, cfg.model.path)
    lora.load_adapter(policy, lora.read_adapter(checkpoint))
    save_hf_dir(lora.merged_model(policy), tok, out)
    return out


def one_run(
    out: Path, base: Path, base_report: Any, seed: int, rank: int, lr: float, quick: bool = False
) -> dict[str, Any]:
    from keelrl.config import config_from_dict
    from keelrl.evals import compare_results
    from keelrl.loop.trainer import train
    from keelrl.recipes.demo import DEMO_TASK_PARAMS, DemoPlan, demo_rl_config
    from keelrl.run.checkpoint import committed, read_manifest
    from keelrl.run.run import GuardStop

    plan = QUICK_PLAN if quick else DemoPlan.for_minutes(12.0)
    rl = demo_rl_config(str(base), DEMO_TASK_PARAMS, plan.rl_steps, plan.eval_every, seed)
    if quick:
        quick_rl(rl)
    rl["algo"]["lr"] = lr
    if rank:
        rl["model"]["lora"] = {"rank": rank, "alpha": 2.0 * rank}
    rl["log"]["progress"] = False
    run_dir = out / f"seed{seed}" / f"rank{rank}_lr{lr:g}"
    t0 = time.time()
    cfg = config_from_dict(rl, "lora_learning")
    try:
        summary = train(cfg, run_dir, resume="auto")
        model_dir, state = run_dir / "final", "finished"
    except GuardStop as err:  # evaluate where it stopped: its newest checkpoint, merged
        summary, state = {}, f"stopped by the guards: {err}"
        model_dir = merged_checkpoint(cfg, committed(run_dir / "checkpoints")[0], run_dir / "stopped_merged")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(int(m["step"]), float(m["eval/accuracy"])) for m in metrics if "eval/accuracy" in m]
    final = evaluate(model_dir, seed, quick)
    diff = compare_results(base_report, final)["metrics"]["accuracy"]
    f = final.summary()["metrics"]["accuracy"]
    newest = committed(run_dir / "checkpoints")[0]
    return {
        "seed": seed,
        "rank": rank,
        "lr": lr,
        "state": state,
        "final": f["value"],
        "final_ci95": f["ci95"],
        "change": diff["diff"],
        "change_ci95": diff["ci"],
        "verdict": diff["verdict"],
        "evals": evals,
        "checkpoint_bytes": sum(int(x["bytes"]) for x in read_manifest(newest)["files"].values()),
        "lora": summary.get("lora"),
        "wall_s": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=["16:3e-3"], help="rank:lr (rank 0: full fine-tuning)")
    ap.add_argument("--out", default="/tmp/lora_learn")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="sizes of seconds (benchmarks/demo_setup.py's QUICK_*), the arms given",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    results: list[dict[str, Any]] = []
    bases: dict[int, float] = {}
    for seed in args.seeds:
        base = base_model(out, seed, args.quick)
        base_report = evaluate(base, seed, args.quick)
        bases[seed] = base_report.summary()["metrics"]["accuracy"]["value"]
        for arm in args.arms:
            rank, lr = arm.split(":")
            results.append(one_run(out, base, base_report, seed, int(rank), float(lr), args.quick))
            print(json.dumps(results[-1]), flush=True)
    doc = {
        "command": "python benchmarks/lora_learning.py "
        + " ".join(
            f"--{k}" if v is True else f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if v
        ),
        "quick": args.quick,
        "base_accuracy": bases,
        "runs": results,
    }
    text = json.dumps(doc, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
