"""`keelrl tasks ...`: see before training which tasks are broken, and prepare a machine for them.

keelrl tasks check PATH... [--json] [--backend B] [--runtime R] [--workers N]   per task: the oracle (solution/solve.sh, or the
    gold patch) then the verifier, and the untouched environment (the verifier alone); a good task has oracle 1
    and untouched 0. PATH: a Harbor task directory, a folder of them, or a SWE-bench .jsonl file. --json prints
    one list of {task, oracle_reward, untouched_reward, oracle_status, untouched_status, good, ...} (statuses as
    episodes have them, plus load_error; rewards null where there is none). Exit 1 when a task is not good.
keelrl tasks images [NAME...] [--json]   local stand-ins for common base images (sandbox/images.py)
keelrl tasks swe-mini OUT [--count N]    swe_mini's repositories as git repositories + SWE-bench instances
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from keelrl.tasks.base import Score


def _side(score: Score | None, error: str) -> dict[str, Any]:
    if score is None:
        return {"reward": None, "status": "load_error", "error": error}
    ok, miss = score.status == "ok", score.info.get("missing")
    error = score.info.get("error") or (f"the verifier could not find `{miss}`" if miss else "")
    return {"reward": score.reward if ok else None, "status": score.status, "error": error}


def check_row(name: str, oracle: Score | None, untouched: Score | None, error: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"task": name}
    for side, score in (("oracle", oracle), ("untouched", untouched)):
        row |= {f"{side}_{k}": v for k, v in _side(score, error).items()}
    row["good"] = row["oracle_reward"] == 1.0 and row["untouched_reward"] == 0.0
    return row


def check_tasks(
    paths: list[str], workers: int = 2, sandbox: Any = None, **params: Any
) -> list[dict[str, Any]]:
    """One row per task of every PATH (see the module docstring); `sandbox`: the [sandbox] section (or its dict)."""
    from keelrl.tasks import TaskError, get_task

    rows: list[dict[str, Any]] = []
    for path in paths:
        kind = "swebench" if path.endswith(".jsonl") else "dir"
        try:
            env: Any = get_task(f"{kind}:{path}", sandbox=sandbox, validate_oracle=False, **params)
        except TaskError as err:
            rows.append(check_row(Path(path).name, None, None, str(err)))
            continue
        rows += [check_row(n, None, None, why) for n, why in env.excluded.items()]
        with ThreadPoolExecutor(workers) as pool:
            rows += pool.map(lambda n, env=env: check_row(n, env.oracle(n), env.untouched(n)), env.names)
    return rows


def _cell(row: dict[str, Any], side: str) -> str:
    reward = row[f"{side}_reward"]
    return f"{'-' if reward is None else f'{reward:g}'} ({row[f'{side}_status']})"


def cmd_check(args: argparse.Namespace) -> int:
    rows = check_tasks(args.paths, args.workers, {"backend": args.backend, "runtime": args.runtime})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max([4, *(len(r["task"]) for r in rows)])
        print(f"{'task':{width}}  {'oracle':24}  {'untouched':24}  verdict")
        for r in rows:
            why = [f"{s}: {r[s + '_error']}" for s in ("oracle", "untouched") if r[s + "_error"]]
            verdict = "good" if r["good"] else "BROKEN" + (f" ({'; '.join(why)[:200]})" if why else "")
            print(f"{r['task']:{width}}  {_cell(r, 'oracle'):24}  {_cell(r, 'untouched'):24}  {verdict}")
        print(f"{sum(r['good'] for r in rows)} of {len(rows)} tasks good (oracle 1, untouched 0)")
    return 0 if rows and all(r["good"] for r in rows) else 1


def cmd_images(args: argparse.Namespace) -> int:
    from keelrl.sandbox.boxes import find_runtime
    from keelrl.sandbox.images import make_stand_ins

    rt = find_runtime(args.runtime)
    if rt is None:
        print("keelrl tasks images: neither podman nor docker works here (apt-get install podman runc)")
        return 2
    records = make_stand_ins(rt, args.names)
    if args.json:
        print(json.dumps(records, indent=2))
    for r in [] if args.json else records:
        print(f"{r['image']:28} {r['status']:16} stand-in: {r['differs']}")
    return 0


def cmd_swe_mini(args: argparse.Namespace) -> int:
    from keelrl.tasks.swebench import write_swe_mini

    out = write_swe_mini(Path(args.out), args.count, args.seed, args.split)
    print(f"wrote {args.count} instances to {out} (task.name = 'swebench:{out}')")
    return 0


def add_tasks_options(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tasks_command", required=True)
    runtime = dict(choices=["auto", "podman", "docker"], default="auto", help="container command line ([sandbox] runtime)")  # fmt: skip
    c = sub.add_parser(
        "check", help="run each task's oracle and untouched environment: oracle 1, untouched 0 is good"
    )
    c.add_argument(
        "paths", nargs="+", metavar="PATH", help="a Harbor task directory, a folder of them, or FILE.jsonl"
    )
    c.add_argument("--json", action="store_true", help="print one JSON list instead of the table")
    c.add_argument(
        "--backend", choices=["auto", "container", "bwrap"], default="auto", help="[sandbox] backend"
    )
    c.add_argument("--runtime", **runtime)  # type: ignore[arg-type]
    c.add_argument("--workers", type=int, default=2, help="tasks checked at once")
    c.set_defaults(func=cmd_check)
    i = sub.add_parser("images", help="build local stand-ins for common base images (no registry needed)")
    i.add_argument("names", nargs="*", metavar="NAME", help="e.g. python:3.12-slim (default: all)")
    i.add_argument("--runtime", **runtime)  # type: ignore[arg-type]
    i.add_argument("--json", action="store_true", help="print one JSON list")
    i.set_defaults(func=cmd_images)
    s = sub.add_parser(
        "swe-mini", help="write swe_mini's repositories as git repositories + SWE-bench instances"
    )
    s.add_argument("out", help="output folder (instances.jsonl and repos/)")
    s.add_argument("--count", type=int, default=8, help="instances")
    s.add_argument("--seed", type=int, default=0, help="swe_mini's seed")
    s.add_argument("--split", choices=["train", "test"], default="train", help="swe_mini's split")
    s.set_defaults(func=cmd_swe_mini)
