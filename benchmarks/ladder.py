"""The recorded scaling ladder (issue 28) on the demo's task, both kinds on one machine:

1. pretraining ladder (configs/ladder_pretrain_tiny.toml): model.tiny widths 96, 128, 160, 192 (4 layers) x
   200, 400, 800 steps of the demo's corpus; Chinchilla's law; the width-224 model at 800 steps predicted, then run;
2. RL ladder (configs/ladder_rl_tiny.toml): the demo's RL stage (100 GRPO steps, 11 held-out evals of the
   same 200 problems) from the four 800-step bases, 6 seeds each; ScaleRL's sigmoid per size, the joint size
   law, and the width-224 base's RL curve predicted before it runs (10 seeds), then run and compared.
   (docs/ladder.json was recorded with the earlier design: widths 96-160, 3 seeds, 3 target seeds.)

Both are `keelrl ladder` commands (resumable: started again, finished runs are reused). This script runs them
and writes one JSON with both ladders' results and the two HTML pages beside it.

    python benchmarks/ladder.py --out runs/ladder_bench --json docs/ladder.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from demo_setup import emit, machine
from keelrl.ladder.runner import run_ladder

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/ladder_bench")
    ap.add_argument("--json", default=None, help="also write the JSON here (HTML pages beside it)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="both ladders at sizes of seconds per point: pretraining widths 16, 32 x 3, 6, 9 steps of 4 lines "
        "(target 48 x 9); RL from the 9-step bases, 1 seed, 3 steps of 16 completions (target: the width-48 base)",
    )
    args = ap.parse_args()
    out = Path(args.out)
    widths, steps, target_width = ((16, 32), (3, 6, 9), 48) if args.quick else ((96, 128, 160, 192), (), 224)
    pre_sets, rl_sets, pre_axes = [], [], []
    if args.quick:
        pre_sets = ["ladder.pretrain_batch=4", "ladder.heldout_lines=16", "ladder.resamples=10"]
        pre_axes = [f"model.tiny.hidden_size={','.join(map(str, widths))}", "ladder.pretrain_steps=3,6,9"]
        pre_axes += [f"model.tiny.hidden_size={target_width}", "ladder.pretrain_steps=9"]
        rl_sets = ["ladder.seeds=1", "ladder.target_seeds=1", "ladder.resamples=10", "train.steps=3"]
        rl_sets += ["eval.every_steps=1"]
        rl_sets += ["eval.problems=8", "rollout.batch_size=16", "train.micro_batch_size=16"]
        rl_sets += ["checkpoint.every_steps=0"]
    last = steps[-1] if steps else 800
    t0 = time.time()
    pre = run_ladder(
        str(ROOT / "configs/ladder_pretrain_tiny.toml"), pre_sets, out / "pretrain", axes=pre_axes[:2],
        target=pre_axes[2:], jobs=args.jobs,
    )  # fmt: skip
    t1 = time.time()
    rl_cfg = ROOT / "configs/ladder_rl_tiny.toml"
    runs_dir = (out / "pretrain" / "runs").resolve()

    def base(name: str) -> str:
        return str(runs_dir / name / "final")

    axis = ",".join(base(f"hidden_size={w}_pretrain_steps={last}__seed0") for w in widths)
    rl = run_ladder(
        str(rl_cfg), rl_sets, out / "rl", axes=[f"model.path={axis}"], jobs=args.jobs,
        target=[f"model.path={base(f'target_hidden_size={target_width}_pretrain_steps={last}__seed0')}"],
    )  # fmt: skip
    t2 = time.time()
    result = {
        "commands": [
            f"python benchmarks/ladder.py --out {args.out}"
            + (f" --json {args.json}" if args.json else "")
            + (" --quick" if args.quick else ""),
            f"keelrl ladder configs/ladder_pretrain_tiny.toml --out {out / 'pretrain'}",
            f"keelrl ladder configs/ladder_rl_tiny.toml --out {out / 'rl'} --axis model.path=<the four 800-step "
            "bases> --target model.path=<the width-224 base>",
        ],
        "quick": args.quick,
        "wall_minutes": {"pretrain": (t1 - t0) / 60, "rl": (t2 - t1) / 60, "total": (t2 - t0) / 60},
        "machine": machine(),
        "pretrain": pre,
        "rl": rl,
    }
    emit(result, args.json)
    if args.json:
        stem = Path(args.json).with_suffix("")
        shutil.copy(out / "pretrain" / "ladder.html", f"{stem}_pretrain.html")
        shutil.copy(out / "rl" / "ladder.html", f"{stem}_rl.html")
    print(json.dumps(result["wall_minutes"]), file=sys.stderr)


if __name__ == "__main__":
    main()
