"""Reward scoring in the training process vs on the Ray actor pool. Prints JSON (and writes it with --out).

    python benchmarks/ray_scoring.py [--heavy-batch 128] [--heavy-batches 3] [--cheap-batch 256]
                                     [--cheap-batches 30] [--out docs/ray_scoring.json]

Two measurements:
- `heavy`: throughput (completions/s) for a deliberately CPU-heavy reward, a Countdown checker that first
  burns ~20 ms of pure-Python CPU per completion (the cost of, say, running a test suite), scored in process,
  by 1 and by 2 Ray workers. This is the case the pool is for: the speed-up is bounded by the free cores.
- `cheap`: what the Ray path adds for a cheap reward (Countdown, microseconds per completion): the median
  wall time of one batch in process and on the pool; the difference, per batch and per completion, is the
  overhead (task submission, serialisation, the wait for results).
Every pool result is checked against in-process scoring. Ray is started once (local, 2 CPUs); the pool
start-up time (actors building their task) is reported separately.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from typing import Any

import ray

from keelrl.ray_pool import CHUNKS_PER_WORKER, IN_FLIGHT_PER_WORKER, ScorerPool, task_factory
from keelrl.tasks import get_task
from keelrl.tasks.base import Score, score_safely


def burn(iterations: int) -> int:
    """Pure-Python CPU work (holds the GIL, like most reward code)."""
    x = 0
    for i in range(iterations):
        x = (x * 31 + i) % 1_000_003
    return x


def iterations_for(seconds: float) -> int:
    n = 200_000
    t0 = time.perf_counter()
    burn(n)
    return max(1, int(n * seconds / (time.perf_counter() - t0)))


class HeavyCountdown:
    """Countdown whose checker first burns a fixed amount of CPU. Defined in __main__, so Ray ships it to
    the actors by value."""

    name = "heavy_countdown"

    def __init__(self, iterations: int) -> None:
        self.inner = get_task("countdown", seed=0)
        self.iterations = iterations

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        burn(self.iterations)
        return self.inner.score(problem, completion)


def cases(n: int) -> tuple[list[dict[str, Any]], list[str]]:
    task = get_task("countdown", seed=0)
    problems, completions = [], []
    for i in range(n):
        numbers = task.problem("train", i)["numbers"]
        problems.append({"numbers": numbers, "target": sum(numbers)})
        op = " + " if i % 2 else " * "
        completions.append(f"<think>try</think><answer>{op.join(map(str, numbers))}</answer>")
    return problems, completions


def timed_batches(
    score: Any, problems: list[dict[str, Any]], completions: list[str], batches: int
) -> list[float]:
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        score(problems, completions)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heavy-ms", type=float, default=20.0, help="CPU per completion of the heavy reward")
    ap.add_argument("--heavy-batch", type=int, default=128)
    ap.add_argument("--heavy-batches", type=int, default=3)
    ap.add_argument("--cheap-batch", type=int, default=256)
    ap.add_argument("--cheap-batches", type=int, default=30)
    ap.add_argument("--note", action="append", default=[], help="a line for the JSON's notes (repeatable)")
    ap.add_argument("--out", default=None, help="also write the JSON here (e.g. docs/ray_scoring.json)")
    a = ap.parse_args()
    started, load_start = time.time(), os.getloadavg()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)

    # heavy reward: throughput
    iterations = iterations_for(a.heavy_ms / 1000)
    heavy_task = HeavyCountdown(iterations)
    problems, completions = cases(a.heavy_batch)
    expected, _ = score_safely(heavy_task, problems, completions)
    heavy: dict[str, Any] = {"cpu_ms_per_completion_target": a.heavy_ms, "burn_iterations": iterations}
    total = a.heavy_batch * a.heavy_batches

    def local_heavy(p: list[dict[str, Any]], c: list[str]) -> None:
        score_safely(heavy_task, p, c)

    local_s = sum(timed_batches(local_heavy, problems, completions, a.heavy_batches))
    heavy["in_process"] = {
        "completions_per_s": round(total / local_s, 1),
        "ms_per_completion": round(1000 * local_s / total, 2),
    }
    startup: dict[str, float] = {}
    for workers in (1, 2):
        t0 = time.perf_counter()
        pool = ScorerPool(lambda: HeavyCountdown(iterations), workers)
        startup[f"{workers}_workers"] = round(time.perf_counter() - t0, 2)
        assert pool.score(problems, completions).scores == expected
        secs = sum(timed_batches(pool.score, problems, completions, a.heavy_batches))
        pool.shutdown()
        heavy[f"ray_{workers}_worker{'s' if workers > 1 else ''}"] = {
            "completions_per_s": round(total / secs, 1),
            "speedup_vs_in_process": round(local_s / secs, 2),
        }

    # cheap reward: overhead per batch and per completion
    countdown = get_task("countdown", seed=0)
    problems, completions = cases(a.cheap_batch)
    expected, _ = score_safely(countdown, problems, completions)

    def local_cheap(p: list[dict[str, Any]], c: list[str]) -> None:
        score_safely(countdown, p, c)

    cheap: dict[str, Any] = {"task": "countdown", "batch": a.cheap_batch, "batches": a.cheap_batches}
    local_s = statistics.median(timed_batches(local_cheap, problems, completions, a.cheap_batches))
    cheap["in_process"] = {
        "batch_ms_median": round(1000 * local_s, 3),
        "us_per_completion": round(1e6 * local_s / a.cheap_batch, 2),
    }
    for workers in (1, 2):
        pool = ScorerPool(task_factory(countdown), workers)
        assert pool.score(problems, completions).scores == expected
        ray_s = statistics.median(timed_batches(pool.score, problems, completions, a.cheap_batches))
        pool.shutdown()
        cheap[f"ray_{workers}_worker{'s' if workers > 1 else ''}"] = {
            "batch_ms_median": round(1000 * ray_s, 3),
            "overhead_ms_per_batch": round(1000 * (ray_s - local_s), 3),
            "overhead_us_per_completion": round(1e6 * (ray_s - local_s) / a.cheap_batch, 2),
        }
    ray.shutdown()

    result = {
        "benchmark": "ray_scoring",
        "command": (
            f"python benchmarks/ray_scoring.py --heavy-ms {a.heavy_ms:g} --heavy-batch {a.heavy_batch} "
            f"--heavy-batches {a.heavy_batches} --cheap-batch {a.cheap_batch} --cheap-batches {a.cheap_batches}"
            + (f" --out {a.out}" if a.out else "")
        ),
        "heavy": {"batch": a.heavy_batch, "batches": a.heavy_batches, **heavy},
        "cheap": cheap,
        "pool_startup_s": startup,
        "pool": {"chunks_per_worker": CHUNKS_PER_WORKER, "in_flight_per_worker": IN_FLIGHT_PER_WORKER},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
        "wall_s": round(time.time() - started, 1),
        "notes": a.note,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
