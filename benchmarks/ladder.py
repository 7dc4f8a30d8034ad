"""The recorded scaling ladder (issue 28) on the demo's task, both kinds on one machine:

1. pretraining ladder (configs/ladder_pretrain_tiny.toml): model.tiny widths 96, 128, 160 (4 layers) x 200,
   400, 800 steps of the demo's corpus; Chinchilla's law; the width-224 model at 800 steps predicted, then run;
2. RL ladder (configs/ladder_rl_tiny.toml): the demo's RL stage (100 GRPO steps, 11 held-out evals of the
   same 200 problems) from the three 800-step bases, 3 seeds each; ScaleRL's sigmoid per size, the joint size
   law, and the width-224 base's RL curve predicted before it runs (3 seeds), then run and compared.

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
    args = ap.parse_args()
    out = Path(args.out)
    t0 = time.time()
    pre = run_ladder(str(ROOT / "configs/ladder_pretrain_tiny.toml"), [], out / "pretrain", jobs=args.jobs)
    t1 = time.time()
    rl_cfg = ROOT / "configs/ladder_rl_tiny.toml"
    runs_dir = (out / "pretrain" / "runs").resolve()

    def base(name: str) -> str:
        return str(runs_dir / name / "final")

    axis = ",".join(base(f"hidden_size={w}_pretrain_steps=800__seed0") for w in (96, 128, 160))
    rl = run_ladder(
        str(rl_cfg), [], out / "rl", axes=[f"model.path={axis}"], jobs=args.jobs,
        target=[f"model.path={base('target_hidden_size=224_pretrain_steps=800__seed0')}"],
    )  # fmt: skip
    t2 = time.time()
    result = {
        "commands": [
            f"python benchmarks/ladder.py --out {args.out}" + (f" --json {args.json}" if args.json else ""),
            f"keelrl ladder configs/ladder_pretrain_tiny.toml --out {out / 'pretrain'}",
            f"keelrl ladder configs/ladder_rl_tiny.toml --out {out / 'rl'} --axis model.path=<the three 800-step "
            "bases> --target model.path=<the width-224 base>",
        ],
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
