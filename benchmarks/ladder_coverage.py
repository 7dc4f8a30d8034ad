"""Do a ladder's 95% intervals hold their validation 95% of the time? (issue 48)

1. simulated (`--simulate N`): N ladders per design drawn from a known truth shaped like the recorded runs (RL:
   each seed rises to a plateau, then jumps to its ceiling at a seed-dependent step, as every recorded seed did;
   pretraining: the recorded law plus a cost of size Chinchilla's form cannot hold), each fitted, predicted from
   its grid alone and validated on fresh target seeds by `keelrl.ladder.analysis`: coverage and widths.
2. real (`--make DIR` runs a pool of ladder runs, `--analyse DIR` reads it): a small pretraining ladder
   (configs/ladder_pretrain_tiny.toml at widths 32, 48, 64 x 50, 100, 200 steps, predicting width 96 at 200 steps)
   with ten target seeds: ladder k is validated on target seed k, its grid the seed-k runs where the pool holds
   them, else each point's run of a seed drawn at random (a different draw per k). `--rl` adds the RL pool (the
   demo's RL ladder from bases of widths 96-192, 6 seeds, and the width-224 target with 10 seeds: ~2 CPU hours),
   which `--analyse` reads as ten ladders of the recorded design, each validated on one target seed. The runs are
   ordinary ladder runs (`keelrl ladder` would reuse them).
3. docs/ladder.json's recorded ladders recomputed under the current intervals.

    python benchmarks/ladder_coverage.py --simulate 30 --json docs/ladder_coverage.json     # ~15 CPU minutes
    nice python benchmarks/ladder_coverage.py --make /tmp/ladder_pool                          # ~20 CPU minutes
    python benchmarks/ladder_coverage.py --analyse /tmp/ladder_pool --no-recorded
    # the pretraining intervals on `--residuals absolute` (the fit before; default relative), or a pool past the
    # first steep stretch (`--pretrain-steps 100,200,400` for --make and --analyse, ~40 CPU minutes)
    python benchmarks/ladder_coverage.py --quick                                               # seconds
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from demo_setup import emit, machine
from keelrl.ladder import analysis
from keelrl.ladder.chinchilla import Residuals
from keelrl.ladder.kinds import KINDS
from keelrl.ladder.plan import LadderRun
from keelrl.ladder.runner import run_all

ROOT = Path(__file__).resolve().parent.parent
PRE_CFG = str(ROOT / "configs/ladder_pretrain_tiny.toml")
RL_CFG = str(ROOT / "configs/ladder_rl_tiny.toml")
RL_WIDTHS, RL_TARGET, RL_SEEDS, LADDERS = (96, 128, 160, 192), 224, 6, 10
PRE_WIDTHS, PRE_STEPS, PRE_TARGET_WIDTH, PRE_SEEDS = (32, 48, 64), (50, 100, 200), 96, 3
W, S = "model.tiny.hidden_size", "ladder.pretrain_steps"


def pretrain_run(width: int, steps: int, seed: int, role: str = "grid") -> LadderRun:
    return LadderRun(((W, width), (S, steps)), seed, role)  # type: ignore[arg-type]


def base_dir(pool: Path, width: int) -> Path:
    role = "target" if width == RL_TARGET else "grid"
    return pool / "bases" / "runs" / pretrain_run(width, 800, 0, role).name / "final"


def rl_run(pool: Path, width: int, seed: int) -> LadderRun:
    role = "target" if width == RL_TARGET else "grid"
    path = str(base_dir(pool, width))
    return LadderRun((("model.path", path),), seed, role, (f"w{width}",))  # type: ignore[arg-type]


def make(pool: Path, jobs: int, rl: bool, steps: tuple[int, ...] = PRE_STEPS) -> None:
    """The pretraining pool (most useful first: a stopped pool still validates); with `rl`, then the RL pool: the
    bases, three seeds of the three recorded sizes and of the target, the target's other seeds, a fourth grid
    seed, the width-192 size, then the other seeds."""
    pre, rlk = KINDS["pretrain"], KINDS["rl"]

    def pre_argv(run: LadderRun, run_dir: Path) -> list[str]:
        return pre.argv(PRE_CFG, [], run, run_dir, 1)

    def rl_argv(run: LadderRun, run_dir: Path) -> list[str]:
        return rlk.argv(RL_CFG, [], run, run_dir, 1)

    def grid(k: int) -> list[LadderRun]:
        return [pretrain_run(w, st, k) for w in PRE_WIDTHS for st in steps]

    target = (PRE_TARGET_WIDTH, max(steps))

    # two whole ladders, every target, then a third grid seed (a pool stopped early still validates ten times)
    runs = [*grid(0), pretrain_run(*target, 0, "target"), *grid(1)]
    runs += [pretrain_run(*target, k, "target") for k in range(1, LADDERS)] + grid(2)
    run_all(pre, runs, pool / "pretrain", pre_argv, jobs, print)
    if not rl:
        return
    bases = [
        pretrain_run(w, 800, 0, "target" if w == RL_TARGET else "grid") for w in (96, 128, 160, 224, 192)
    ]
    run_all(pre, bases, pool / "bases", pre_argv, jobs, print)
    order = [rl_run(pool, w, s) for s in range(3) for w in (96, 128, 160, RL_TARGET)]
    order += [rl_run(pool, RL_TARGET, s) for s in range(3, LADDERS)]
    order += [rl_run(pool, w, 3) for w in (96, 128, 160)] + [rl_run(pool, 192, s) for s in range(4)]
    order += [rl_run(pool, w, s) for s in range(4, RL_SEEDS) for w in RL_WIDTHS]
    run_all(rlk, order, pool / "rl", rl_argv, jobs, print)


# ---- simulated ladders: a known truth shaped like the recorded runs (docs/ladder.json)

STEPS = np.arange(0, 101, 10)  # the RL ladder's evals
PER_STEP = 35400.0  # FLOPs per parameter per RL step: 8 per trained token x 4,425 tokens, as recorded


def params(width: int) -> int:
    """model.tiny's parameter count at 4 layers (600,096 at width 96 ... 3,235,232 at 224, as recorded)."""
    return 64 * width * width + 107 * width


def sim_rl_runs(
    rng: np.random.Generator, n: float, seeds: int, role: str, label: str
) -> list[dict[str, Any]]:
    """`seeds` RL runs of one base of `n` parameters: from R0 (the base's, drawn once) to a plateau of 0.42 in a
    few steps, then a jump to 0.745 around a seed's own step, log-normal about 65 (n / 1.06M)^0.3 steps with sd
    0.25 (so the target, width 224, is mid-jump at step 100, as measured), evals with noise sd 0.012."""
    r0 = 0.35 + 0.02 * rng.standard_normal()
    out = []
    for seed in range(seeds):
        jump = 65 * (n / 1.06e6) ** 0.3 * np.exp(0.25 * rng.standard_normal())
        pre = r0 + (0.42 - r0) * (1 - np.exp(-STEPS / 4))
        acc = pre + (0.745 - pre) / (1 + np.exp(-(STEPS - jump) / 4)) + rng.normal(0, 0.012, len(STEPS))
        acc[0] = r0
        out.append({
            "label": label, "point": {"model.path": label}, "role": role, "seed": seed, "parameters": int(n),
            "eval_problems": 200, "steps": STEPS.tolist(), "compute": (PER_STEP * n * STEPS).tolist(),
            "accuracy": np.clip(acc, 0, 1).tolist(), "tokens_trained": 4425.0 * 100, "train_steps": 100,
        })  # fmt: skip
    return out


def rl_ladder(
    grid: list[dict[str, Any]], targets: list[dict[str, Any]], resamples: int, seed: int = 0
) -> dict[str, Any]:
    """Fit, predict (from the grid alone) and validate one RL ladder; the per-point intervals are not needed."""
    fits, draws = analysis.rl_fits(grid, 0.1, 3, 0.95)
    n, steps = targets[0]["parameters"], targets[0]["train_steps"]
    p = analysis.rl_prediction(
        fits, draws, {"model.path": "target"}, {"model.path"}, n, PER_STEP * n * steps, len(targets), 200, 0.95,
        seed=seed, resamples=resamples,
    )  # fmt: skip
    v = analysis.rl_validation(p, targets)
    return {
        "predicted": p["final"], "interval": p["final_interval"], "fit_interval": p["final_fit_interval"],
        "measured": v["final_mean"], "inside": v["inside_interval"], "seed_noise": p["seed_noise"],
    }  # fmt: skip


def coverage(ladders: list[dict[str, Any]]) -> dict[str, Any]:
    inside = [bool(x["inside"]) for x in ladders]
    widths = [x["interval"][1] - x["interval"][0] for x in ladders]
    out = {"validations": len(inside), "inside": sum(inside), "coverage": float(np.mean(inside))}
    out["width_median"], out["width_max"] = float(np.median(widths)), float(np.max(widths))
    return out


def simulate_rl(ladders: int, widths: tuple[int, ...], seeds: int, target_seeds: int, resamples: int) -> dict:
    rows = []
    for k in range(ladders):
        rng = np.random.default_rng(1000 + k)
        grid = [r for w in widths for r in sim_rl_runs(rng, params(w), seeds, "grid", f"w{w}")]
        rows.append(
            rl_ladder(grid, sim_rl_runs(rng, params(RL_TARGET), target_seeds, "target", "t"), resamples)
        )
        print(
            json.dumps({"ladder": k, **{key: rows[-1][key] for key in ("interval", "measured")}}),
            file=sys.stderr,
        )
    design = {"widths": list(widths), "seeds": seeds, "target_seeds": target_seeds, "resamples": resamples}
    return {"design": design, **coverage(rows), "ladders": rows}


def sim_pretrain_points(rng: np.random.Generator, seeds: int, target_seeds: int) -> tuple[list, list]:
    """The recorded pretraining ladder's shape (docs/ladder.json): L = 0.31 + 2.2e4 D^-0.93 plus a cost of size
    that Chinchilla's form cannot hold (0.04 ln(N / 0.6M) x 0.44M / D: at a fixed learning rate larger models
    converge later), seed noise sd 0.008 (0.44M / D)^0.5; widths 96, 128, 160 x 200, 400, 800 steps; target
    width 224 at 800 steps (the law says 0.344 there, the truth 0.361, the measured 0.3603)."""

    def runs(width: int, steps: int, count: int, role: str) -> list[dict[str, Any]]:
        n, d = params(width), 2220.0 * steps
        mean = 0.31 + 2.2e4 * d**-0.93 + 0.04 * np.log(n / 6e5) * 4.44e5 / d
        sd = 0.008 * (4.44e5 / d) ** 0.5
        return [
            {"label": f"{role}{width}x{steps}", "role": role, "seed": s, "parameters": n, "tokens": d,
             "loss": float(mean + sd * rng.standard_normal())}
            for s in range(count)
        ]  # fmt: skip

    grid = [r for w in (96, 128, 160) for st in (200, 400, 800) for r in runs(w, st, seeds, "grid")]
    return grid, runs(224, 800, target_seeds, "target")


def pretrain_ladder(grid: list, targets: list, resamples: int, kind: Residuals) -> dict[str, Any]:
    at = (float(targets[0]["parameters"]), float(targets[0]["tokens"]))
    p = analysis.pretrain_fits(grid, at, resamples, 0.95, len(targets), kind)["prediction"]
    v = analysis.pretrain_validation(p, targets)
    return {
        "predicted": p["loss"],
        "interval": p["interval"],
        "measured": v["loss"],
        "inside": v["inside_interval"],
    }


def simulate_pretrain(ladders: int, seeds: int, resamples: int, kind: Residuals) -> dict[str, Any]:
    rows = [pretrain_ladder(*sim_pretrain_points(np.random.default_rng(2000 + k), seeds, 1), resamples, kind)
            for k in range(ladders)]  # fmt: skip
    return {
        "design": {"seeds": seeds, "target_seeds": 1, "resamples": resamples, "residuals": kind},
        **coverage(rows),
        "ladders": rows,
    }


# ---- the real pool


def records(kind_name: str, out: Path, runs: list[LadderRun]) -> list[dict[str, Any]]:
    """The records of the runs in `runs` that finished (as `keelrl ladder` reads them)."""
    kind = KINDS[kind_name]
    found = []
    for run in runs:
        run_dir = out / "runs" / run.name
        if kind.finished(run_dir):
            point = {k: v for k, v in run.point}
            found.append(
                {
                    "label": run.label,
                    "seed": run.seed,
                    "role": run.role,
                    "point": point,
                    **kind.record(run_dir),
                }
            )
    return found


def real_rl(pool: Path, resamples: int) -> dict[str, Any]:
    """Ladder k: the recorded design (widths 96, 128, 160, three seeds each, a different 3 of the pool's seeds
    for every k) validated on the target's seed k alone; and the widest ladder the pool holds."""
    every = [rl_run(pool, w, s) for w in (*RL_WIDTHS, RL_TARGET) for s in range(LADDERS)]
    recs = records("rl", pool / "rl", every)
    by = {(r["parameters"], r["seed"]): r for r in recs}
    targets = sorted(s for n, s in by if n == params(RL_TARGET))
    common = sorted(set.intersection(*({s for n, s in by if n == params(w)} for w in (96, 128, 160))))
    rows = []
    for k, subset in zip(targets, itertools.cycle(list(itertools.combinations(common, 3)))):
        grid = [by[(params(w), s)] for w in (96, 128, 160) for s in subset]
        rows.append(
            {
                "target_seed": k,
                "grid_seeds": list(subset),
                **rl_ladder(grid, [by[(params(RL_TARGET), k)]], resamples),
            }
        )
    widest = [r for r in recs if r["role"] == "grid"]
    sizes = sorted({r["parameters"] for r in widest})
    full = rl_ladder(widest, [by[(params(RL_TARGET), k)] for k in targets], resamples) if targets else None
    design = {"sizes": sizes, "grid_runs": len(widest), "target_seeds": len(targets)}
    return {
        "repeated": {**coverage(rows), "ladders": rows} if rows else None,
        "widest": full and {**full, **design},
    }


def real_pretrain(
    pool: Path, resamples: int, kind: Residuals, steps: tuple[int, ...] = PRE_STEPS
) -> dict[str, Any]:
    """Ladder k validated on the target's seed-k run, from the grid's seed-k runs where the pool holds them all
    (ladders with seeds of their own), else from each grid point's run of a seed drawn at random among those
    it holds (a different draw for every k)."""
    grid = [pretrain_run(w, st, s) for w in PRE_WIDTHS for st in steps for s in range(PRE_SEEDS)]
    recs = {(r["label"], r["seed"]): r for r in records("pretrain", pool / "pretrain", grid)}
    labels = sorted({run.label for run in grid})
    held = {label: [s for s in range(PRE_SEEDS) if (label, s) in recs] for label in labels}
    rows = []
    targets = records(
        "pretrain",
        pool / "pretrain",
        [pretrain_run(PRE_TARGET_WIDTH, max(steps), k, "target") for k in range(LADDERS)],
    )
    for t in targets:
        if not all(held.values()):
            break
        rng = np.random.default_rng(t["seed"])
        own = all(t["seed"] in seeds for seeds in held.values())
        pick = [t["seed"] if own else int(rng.choice(held[label])) for label in labels]
        chosen = [recs[(label, s)] for label, s in zip(labels, pick, strict=True)]
        rows.append(
            {
                "seed": t["seed"],
                "own_grid": own,
                "grid_seeds": pick,
                **pretrain_ladder(chosen, [t], resamples, kind),
            }
        )
    return {"residuals": kind, "repeated": {**coverage(rows), "ladders": rows} if rows else None}


def recorded(resamples: int, kind: Residuals) -> dict[str, Any]:
    """docs/ladder.json's two ladders again under the new intervals (a recomputation after the fact: the
    predictions written before their targets ran used the old ones)."""
    doc = json.loads((ROOT / "docs/ladder.json").read_text())
    rl = [r for r in doc["rl"]["runs"]]
    grid, targets = [r for r in rl if r["role"] == "grid"], [r for r in rl if r["role"] == "target"]
    pre = doc["pretrain"]["runs"]
    return {
        "rl": {
            "old_interval": doc["rl"]["prediction"]["final_interval"],
            **rl_ladder(grid, targets, resamples),
        },
        "pretrain": {
            "old_interval": doc["pretrain"]["chinchilla"]["prediction"]["interval"],
            **pretrain_ladder(
                [r for r in pre if r["role"] == "grid"],
                [r for r in pre if r["role"] == "target"],
                resamples,
                kind,
            ),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--make", metavar="DIR", help="run the real pool into DIR (resumable)")
    ap.add_argument("--rl", action="store_true", help="with --make: the RL pool too (about 2 CPU hours)")
    ap.add_argument("--analyse", metavar="DIR", help="the real pool's repeated ladders")
    ap.add_argument("--simulate", type=int, default=0, metavar="N", help="simulated ladders per design")
    ap.add_argument("--resamples", type=int, default=40, help="bootstrap resamples per ladder")
    ap.add_argument("--designs", default="", help="with --simulate: which (comma-separated; default all)")
    ap.add_argument("--no-recorded", action="store_true", help="skip docs/ladder.json's recomputation")
    ap.add_argument("--quick", action="store_true", help="a few small simulated ladders (the default suite)")
    ap.add_argument("--residuals", choices=["relative", "absolute"], default="relative",
                    help="the pretraining fit's residuals (ladder/chinchilla.py)")  # fmt: skip
    ap.add_argument("--pretrain-steps", default=",".join(map(str, PRE_STEPS)),
                    help="the real pretraining pool's steps per grid point (the target: the most)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    steps = tuple(int(x) for x in args.pretrain_steps.split(","))
    if args.make:
        make(Path(args.make), args.jobs, args.rl, steps)
        return
    t0 = time.time()
    if args.quick:
        result: dict[str, Any] = {
            "rl": simulate_rl(2, (96, 128, 160), 3, 3, 10),
            "pretrain": simulate_pretrain(2, 1, 10, args.residuals),
        }
    else:
        result = {} if args.no_recorded else {"recorded": recorded(args.resamples, args.residuals)}
        if args.simulate:
            n, r = args.simulate, args.resamples
            designs = {
                "rl_recorded_design": lambda: simulate_rl(n, (96, 128, 160), 3, 3, r),
                "rl_one_target_seed": lambda: simulate_rl(n, (96, 128, 160), 3, 1, r),
                "rl_widened": lambda: simulate_rl(n, RL_WIDTHS, 6, LADDERS, r),
                "pretrain_recorded_design": lambda: simulate_pretrain(n, 1, 100, args.residuals),
            }
            names = args.designs.split(",") if args.designs else list(designs)
            result["simulated"] = {name: designs[name]() for name in names}
        if args.analyse:
            result["real"] = {"rl": real_rl(Path(args.analyse), args.resamples),
                              "pretrain": real_pretrain(Path(args.analyse), 100, args.residuals, steps)}  # fmt: skip
    result["seconds"], result["machine"] = time.time() - t0, machine()
    emit(result, args.json)


if __name__ == "__main__":
    main()
