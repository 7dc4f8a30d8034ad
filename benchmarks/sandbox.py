"""Sandbox throughput and per-execution overhead, per isolation level available here. Prints JSON.

    python benchmarks/sandbox.py [--workers 2] [--trivial 120] [--typical 2] [--latency 40]

- `executions_per_s`: a `SandboxPool(workers)` runs a batch of jobs, wall clock. "trivial" is a one-line
  function and one call; "typical" is the shipped problem set's reference solutions called on their
  cases (4-7 per problem, a realistic mix of easy to hard), the set repeated `--typical` times; every
  answer is judged (keelrl.sandbox.judge) and must pass.
- `latency_ms`: one `Sandbox.run` at a time (median and p90), and the same for plain
  `subprocess.run([sys.executable, "-c", code])` (the interpreter keelrl runs in, site-packages and all)
  and for `python -I -S -c` (the flags the sandbox uses, so the isolation cost is separated from
  interpreter start-up). `overhead_ms` = sandbox median - plain median.
- `cpu_ms_per_execution`: CPU time (this process + all sandbox processes) per execution, and
  `cpu_bound_per_s` = cores / that: the rate an otherwise idle machine would reach. Unlike the wall-clock
  rate it hardly changes when other work shares the machine. Not measurable for bwrap (null): the CPU
  time of processes in its PID namespace does not reach this process's rusage.
- `plain_subprocess.trivial_per_s`: the trivial batch with `workers` threads running plain subprocesses.
The machine's load average is recorded: other work on the machine slows the wall-clock numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from keelrl.sandbox.execute import Sandbox, available_levels
from keelrl.sandbox.judge import calls_of, judge
from keelrl.sandbox.pool import SandboxPool
from keelrl.sandbox.result import Job, SandboxWarning
from keelrl.tasks.code import load_problems, shipped_problems_path

TRIVIAL = Job("def f(x):\n    return x\n", "f", ["1"])
TRIVIAL_SCRIPT = TRIVIAL.code + "assert f(1) == 1\n"  # the same work without a sandbox


def cpu_seconds() -> float:
    """CPU time of this process and of every reaped descendant (the sandboxes), user + system."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pool_rate(level: str, workers: int, jobs: list[tuple[Job, list[dict]]]) -> dict[str, float]:
    with SandboxPool(workers, isolation=level) as pool:  # type: ignore[arg-type]
        pool.run_many([job for job, _ in jobs[: 2 * workers]])  # warm-up
        t0, c0 = time.perf_counter(), cpu_seconds()
        results = [
            judge(cases, r, job.entry_point or "")
            for (job, cases), r in zip(jobs, pool.run_many(j for j, _ in jobs))
        ]
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    bad = [f"{v.reason}: {v.detail}" for v in results if not v.ok]
    if bad:
        raise RuntimeError(f"benchmark jobs failed under {level}: {bad[:5]}")
    cores = len(os.sched_getaffinity(0))
    seen = level != "bwrap"  # bwrap's PID-namespace init is not reaped by wait(): its CPU time is invisible
    return {
        "jobs": len(jobs),
        "seconds": round(elapsed, 3),
        "executions_per_s": round(len(jobs) / elapsed, 1),
        "cpu_ms_per_execution": round(1000 * cpu / len(jobs), 1) if seen else None,
        "cpu_bound_per_s": round(cores * len(jobs) / cpu, 1) if seen else None,
    }


def latency(fn, n: int) -> dict[str, float]:
    fn()  # warm-up
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    p90 = samples[math.ceil(0.9 * n) - 1]  # nearest rank
    return {"median": round(statistics.median(samples), 1), "p90": round(p90, 1)}


def plain_run(args: list[str]) -> None:
    subprocess.run(args, check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--trivial", type=int, default=120, help="trivial jobs per level")
    ap.add_argument("--typical", type=int, default=2, help="passes over the shipped problem set per level")
    ap.add_argument("--latency", type=int, default=40, help="sequential runs per latency measurement")
    ap.add_argument(
        "--quick", action="store_true", help="4 trivial jobs, 4 shipped problems, 2 latency runs: seconds"
    )
    args = ap.parse_args()
    if args.quick:
        args.trivial, args.typical, args.latency = 4, 1, 2
    warnings.simplefilter("ignore", SandboxWarning)

    problems = load_problems(shipped_problems_path())[: 4 if args.quick else None]
    typical = [(Job(p["reference"], p["entry_point"], calls_of(p["tests"])), p["tests"]) for p in problems]
    typical *= args.typical
    trivial = [(TRIVIAL, [{"args": "1", "expected": 1}])] * args.trivial
    script = TRIVIAL_SCRIPT
    plain = {
        "python -c": latency(lambda: plain_run([sys.executable, "-c", script]), args.latency),
        "python -I -S -c": latency(
            lambda: plain_run([sys.executable, "-I", "-S", "-c", script]), args.latency
        ),
    }
    with ThreadPoolExecutor(args.workers) as ex:
        t0 = time.perf_counter()
        list(ex.map(lambda _: plain_run([sys.executable, "-c", script]), range(args.trivial)))
        plain_rate = args.trivial / (time.perf_counter() - t0)

    levels = {}
    for level in available_levels():
        with Sandbox(level) as box:  # type: ignore[arg-type]
            lat = latency(
                lambda box=box: box.run(TRIVIAL.code, TRIVIAL.entry_point, TRIVIAL.calls), args.latency
            )
        levels[level] = {
            "uid_separation": Sandbox(level).uid is not None,  # type: ignore[arg-type]
            "trivial": pool_rate(level, args.workers, trivial),
            "typical": pool_rate(level, args.workers, typical),
            "latency_ms": lat,
            "overhead_ms": {
                "vs python -c": round(lat["median"] - plain["python -c"]["median"], 1),
                "vs python -I -S -c": round(lat["median"] - plain["python -I -S -c"]["median"], 1),
            },
        }
    report = {
        "benchmark": "sandbox",
        "command": " ".join(["python benchmarks/sandbox.py", *sys.argv[1:]]),
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "root": os.geteuid() == 0,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "workers": args.workers,
        "typical_jobs": f"{len(problems)} shipped reference solutions x {args.typical}, "
        f"{sum(len(p['tests']) for p in problems)} cases per pass",
        "plain_subprocess": {"latency_ms": plain, "trivial_per_s": round(plain_rate, 1)},
        "levels": levels,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
