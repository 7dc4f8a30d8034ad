"""`keelrl ladder CONFIG [--axis KEY=V1,V2 ...] [--seeds S] [--target KEY=V ...] [--out DIR]`: run a grid of
short runs of one config, fit them, predict a held-out target, run it, and compare (issue 28).

OUT/ holds `plan.json` (what was asked: a ladder started again with another config is refused), `runs/NAME/`
(one directory per run: a `keelrl train` run directory, or a pretraining point's), `ladder.json` (every run,
every fit, the prediction and its validation) and `ladder.html` (page.py). Started again, it reuses every
finished run, resumes an interrupted RL run from its checkpoint (the trainer's exact resume), and keeps the
prediction it wrote before the target ran: a prediction is never recomputed once the target has data.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from keelrl.config import Config, ConfigError, config_to_dict, load_config
from keelrl.config.ladder import LadderConfig
from keelrl.ladder import analysis
from keelrl.ladder.kinds import KINDS, Kind, LadderError, rl_flops_per_token_param
from keelrl.ladder.page import write_page
from keelrl.ladder.plan import LadderRun, parse_axis, plan_runs
from keelrl.monitor.run_dir import atomic_write_text
from keelrl.stages import check_run


def _cost(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "ladder_cost.json"
    return json.loads(path.read_text()) if path.is_file() else {"invocations": []}


def run_process(argv: list[str], run_dir: Path) -> int:
    """Run one point's process (output to run_dir/ladder.log) and add its CPU seconds (user + system, with
    the children it waited for: the supervised worker) and wall seconds to run_dir/ladder_cost.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cost = _cost(run_dir)
    # written first, completed after: a ladder killed meanwhile leaves {"exit": None} (CPU seconds unknown)
    cost["invocations"].append({"exit": None, "cpu_seconds": 0.0, "wall_seconds": 0.0})
    atomic_write_text(run_dir / "ladder_cost.json", json.dumps(cost, indent=2) + "\n")
    with open(run_dir / "ladder.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    cost["invocations"][-1] = {
        "exit": code, "cpu_seconds": usage.ru_utime + usage.ru_stime, "wall_seconds": time.time() - t0
    }  # fmt: skip
    atomic_write_text(run_dir / "ladder_cost.json", json.dumps(cost, indent=2) + "\n")
    return code


def run_all(
    kind: Kind,
    runs: Sequence[LadderRun],
    out: Path,
    argv: Callable[[LadderRun, Path], list[str]],
    jobs: int,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Make every run not already finished (`jobs` at a time) and return their records; LadderError naming
    the failed runs and their logs if any failed (the others are kept: starting again reuses them)."""
    lock = threading.Lock()
    done = [0]
    failed: list[str] = []

    def one(run: LadderRun) -> None:
        run_dir = out / "runs" / run.name
        reused = kind.finished(run_dir)
        code = 0 if reused else run_process(argv(run, run_dir), run_dir)
        with lock:
            done[0] += 1
            if code != 0 or not kind.finished(run_dir):
                failed.append(f"{run.name} (exit {code}; log: {run_dir / 'ladder.log'})")
            state = "reused" if reused else ("done" if code == 0 else f"FAILED (exit {code})")
            say(f"[{done[0]}/{len(runs)}] {run.label} seed {run.seed}: {state}")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, runs))
    if failed:
        raise LadderError(
            "these ladder runs did not finish: " + "; ".join(failed) + ". Fix the cause and run the same "
            "command again: finished runs are reused and interrupted RL runs resume."
        )
    records = []
    for run in runs:
        run_dir = out / "runs" / run.name
        cost = _cost(run_dir)["invocations"]
        records.append({
            "name": run.name, "label": run.label, "seed": run.seed, "role": run.role,
            "point": {k: v for k, v in run.point}, "cpu_seconds": sum(c["cpu_seconds"] for c in cost),
            "cpu_seconds_complete": all(c["exit"] is not None for c in cost),
            **kind.record(run_dir),
        })  # fmt: skip
    return records


def _check_plan(out: Path, plan: dict[str, Any]) -> None:
    path = out / "plan.json"
    if path.is_file() and json.loads(path.read_text()) != plan:
        raise ConfigError(
            f"{out} holds a ladder of another plan (plan.json differs: config, overrides or [ladder]); "
            "give another --out, or delete it to start over"
        )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(plan, indent=2) + "\n")


def _ladder_section(
    lad: LadderConfig, axes: Sequence[str], seeds: int | None, target: Sequence[str], jobs: int | None
) -> LadderConfig:
    """The config's [ladder] with the command line's --axis, --target, --seeds and --jobs on top."""
    lad = lad.model_copy(deep=True)
    lad.axes = {**lad.axes, **dict(parse_axis(item) for item in axes)}
    for item in target:
        key, values = parse_axis(item)
        if len(values) != 1:
            raise ConfigError(f"--target {item!r} names {len(values)} values; a target is one point")
        lad.target = {**lad.target, key: values[0]}
    if seeds is not None:
        lad.seeds = seeds
    if jobs is not None:
        lad.jobs = jobs
    if not lad.axes:
        raise ConfigError("a ladder needs at least one axis: --axis KEY=V1,V2,... or [ladder.axes]")
    return lad


def run_ladder(
    config: str | None,
    overrides: Sequence[str] = (),
    out: str | Path = "runs/ladder",
    axes: Sequence[str] = (),
    seeds: int | None = None,
    target: Sequence[str] = (),
    jobs: int | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The whole ladder (see the module docstring); returns what it writes to OUT/ladder.json."""
    overrides = list(overrides)
    cfg = load_config(config, overrides)
    lad = _ladder_section(cfg.ladder, axes, seeds, target, jobs)
    grid, targets = plan_runs(lad)
    if lad.kind == "rl" and not cfg.eval.at_start:
        raise ConfigError(
            "an RL ladder needs eval.at_start = true: R0, the curve's start, is its step-0 eval"
        )
    for run in grid[:: lad.seeds] + targets[:1]:  # every point can run and be fitted before anything starts
        point = load_config(config, overrides + run.overrides())
        if lad.kind == "rl":
            check_run(point)
            e, steps = point.eval, point.train.steps
            evals = {0, steps, *(range(e.every_steps, steps, e.every_steps) if e.every_steps else ())}
            if len(evals) < 4:
                raise ConfigError(
                    f"{run.label}: train.steps = {steps} with eval.every_steps = {e.every_steps} evaluates at steps "
                    f"{sorted(evals)}; ScaleRL's curve needs step 0 and 3 more. Set eval.every_steps to at most "
                    f"{max(1, steps // 3)}."
                )
    out = Path(out)
    plan = {"config": str(config), "overrides": overrides, "ladder": lad.model_dump(mode="json")}
    _check_plan(out, plan)
    kind = KINDS[lad.kind]

    def argv(run: LadderRun, run_dir: Path) -> list[str]:
        return kind.argv(config, overrides, run, run_dir, lad.threads)

    say(
        f"ladder: {len(grid)} runs ({len(grid) // lad.seeds} points x {lad.seeds} seeds), {lad.jobs} at a time"
    )
    records = run_all(kind, grid, out, argv, lad.jobs, say)
    result: dict[str, Any] = {"kind": lad.kind, "plan": plan, "runs": records}
    previous = json.loads((out / "ladder.json").read_text()) if (out / "ladder.json").is_file() else {}
    target_cfg = load_config(config, overrides + targets[0].overrides()) if targets else None
    fits: list[dict[str, Any]] = []
    draws: dict[str, Any] = {}
    if lad.kind == "rl":
        fits, draws = analysis.rl_fits(records, lad.warmup_fraction, lad.resamples, lad.level)
        result["fits"] = fits
        sizes = sorted({f["parameters"]: f for f in fits}.values(), key=lambda f: f["parameters"])
        # a size axis alone (one point per size) gets its size law; with a target, its prediction holds the one used
        if len(sizes) >= 2 and len(sizes) == len(fits) and target_cfg is None:
            problems = int(records[0]["eval_problems"])
            result["size_law"] = analysis.size_law(sizes, problems, lad.resamples, lad.level)[0]
    else:
        at = _pretrain_target(kind, target_cfg, records) if target_cfg is not None else None
        result["chinchilla"] = analysis.pretrain_fits(
            records, at, lad.resamples, lad.level, len(targets) or 1
        )
    if target_cfg is not None:
        if "prediction" in previous:
            result["prediction"] = previous["prediction"]  # written before the target ran: kept as it was
        else:
            result["prediction"] = (
                _rl_predict(lad, kind, target_cfg, records, targets, fits, draws)
                if lad.kind == "rl"
                else result["chinchilla"]["prediction"]
            )
            result["prediction"]["made_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        _write(out, result)
        say(
            f"prediction (made {result['prediction']['made_at']}) is in {out / 'ladder.json'}; now the target runs"
        )
        target_records = run_all(kind, targets, out, argv, lad.jobs, say)
        result["runs"] = records + target_records
        if result["prediction"].get("size_law"):
            result["size_law"] = result["prediction"]["size_law"]
        validate = analysis.rl_validation if lad.kind == "rl" else analysis.pretrain_validation
        result["validation"] = validate(result["prediction"], target_records)
    result["cost"] = {
        "cpu_seconds": sum(r["cpu_seconds"] for r in result["runs"]),
        # False when a ladder was killed while a run's process ran: that invocation's CPU time is unknown
        "cpu_seconds_complete": all(r["cpu_seconds_complete"] for r in result["runs"]),
        "wall_seconds_sum": sum(r["wall_seconds"] for r in result["runs"]),
        "gpu_seconds": sum(r.get("gpu_seconds", 0.0) for r in result["runs"]),
    }
    _write(out, result)
    return result


def _pretrain_target(kind: Kind, target_cfg: Config, records: list[dict[str, Any]]) -> tuple[float, float]:
    """The target's planned (N, D): its model's parameter count, and the grid's tokens per step times its steps."""
    per_step = float(np.mean([r["tokens"] / r["steps"] for r in records]))
    return float(kind.parameters(target_cfg)), per_step * target_cfg.ladder.pretrain_steps


def _rl_predict(
    lad: LadderConfig,
    kind: Kind,
    target_cfg: Config,
    records: list[dict[str, Any]],
    targets: list[LadderRun],
    fits: list[dict[str, Any]],
    draws: dict[str, Any],
) -> dict[str, Any]:
    """The target's prediction from the grid alone: its planned parameters and compute (the grid's mean
    tokens per step times its steps), never its data."""
    params = kind.parameters(target_cfg)
    tokens_per_step = float(np.mean([r["tokens_trained"] / r["train_steps"] for r in records]))
    flops = rl_flops_per_token_param(config_to_dict(target_cfg))  # per parameter and token
    compute = flops * params * tokens_per_step * target_cfg.train.steps
    problems = target_cfg.eval.problems * target_cfg.eval.samples
    point = dict(targets[0].point)
    return analysis.rl_prediction(
        fits, draws, point, set(lad.target), params, compute, len(targets), problems, lad.level
    )


def _write(out: Path, result: dict[str, Any]) -> None:
    atomic_write_text(out / "ladder.json", json.dumps(result, indent=2) + "\n")
    write_page(result, out / "ladder.html")


def add_ladder_options(p: Any) -> None:
    p.add_argument(
        "config", nargs="?", help="TOML config of every run (its [ladder] section: axes, seeds, target)"
    )
    p.add_argument(
        "--axis", action="append", default=[], metavar="KEY=V1,V2", help="an axis of the grid (repeatable)"
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds per grid point (default ladder.seeds)")
    p.add_argument(
        "--target", action="append", default=[], metavar="KEY=V", help="the held-out target's overrides"
    )
    p.add_argument("--jobs", type=int, default=None, help="runs at a time (default ladder.jobs)")
    p.add_argument("--out", default=None, help="ladder directory (default runs/ladder_<config name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    p.add_argument("--page", action="store_true", help="only redraw OUT/ladder.html from OUT/ladder.json")


def cmd_ladder(args: Any) -> int:
    out = Path(args.out or f"runs/ladder_{Path(args.config).stem if args.config else 'defaults'}")
    if args.page:
        if not (out / "ladder.json").is_file():
            raise LadderError(f"{out / 'ladder.json'} does not exist: run the ladder first")
        print(write_page(json.loads((out / "ladder.json").read_text()), out / "ladder.html"))
        return 0
    result = run_ladder(args.config, args.set, out, args.axis, args.seeds, args.target, args.jobs)
    print(_headline(result))
    print(f"ladder: {out / 'ladder.json'}, page: {out / 'ladder.html'}")
    return 0


def _headline(result: dict[str, Any]) -> str:
    lines = [
        f"{f['rank_by_a']}. {f['label']}: A {f['a']:.3f} [{f['a_ci'][0]:.3f}, {f['a_ci'][1]:.3f}], B {f['b']:.2f}, C_mid {f['c_mid']:.3g}"
        for f in result.get("fits", [])
    ]
    p, v = result.get("prediction"), result.get("validation")
    if p and v and result["kind"] == "rl":
        lines.append(
            f"target: predicted {p['final']:.3f} [{p['final_interval'][0]:.3f}, {p['final_interval'][1]:.3f}], measured {v['final_mean']:.3f}"
        )
    if p and v and result["kind"] == "pretrain":
        lines.append(
            f"target: predicted loss {p['loss']:.4f} [{p['interval'][0]:.4f}, {p['interval'][1]:.4f}], measured {v['loss']:.4f}"
        )
    return "\n".join(lines)
