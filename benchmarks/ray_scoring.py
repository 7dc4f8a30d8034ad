"""Reward scoring and generation in the training process vs on the Ray actor pools. Prints JSON (and writes
it with --out).

    python benchmarks/ray_scoring.py [--heavy-batch 128] [--heavy-batches 3] [--cheap-batch 256]
                                     [--cheap-batches 30] [--gen-batch 64] [--gen-batches 3]
                                     [--out docs/ray_scoring.json]

Three measurements:
- `heavy`: throughput (completions/s) for a deliberately CPU-heavy reward, a Countdown checker that first
  burns ~20 ms of pure-Python CPU per completion (the cost of, say, running a test suite), scored in process,
  by 1 and by 2 Ray workers. This is the case the pool is for: the speed-up is bounded by the free cores.
- `cheap`: what the Ray path adds for a cheap reward (Countdown, microseconds per completion): the median
  wall time of one batch in process and on the pool; the difference, per batch and per completion, is the
  overhead (task submission, serialisation, the wait for results).
- `sampling`: generation throughput (completions and tokens per second) of the smoke preset's tiny model
  (groups of 4 prompts, one torch thread per process) in process and on 1 and 2 sampling actors
  (`SamplerPool`, chunk_size 0: one batch per actor); the weights sync (once per version) is timed apart.
  Pool tokens are checked against in-process generation.
Every pool result is checked against in-process scoring. Ray is started once (local, 2 CPUs); the pool
start-up time (actors building their task) is reported separately.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import statistics
import time
from typing import Any

import ray
import torch

from keelrl.config import ModelConfig, TinyModelConfig
from keelrl.models.load import load_policy
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.rollout.ray import CHUNKS_PER_WORKER, IN_FLIGHT_PER_WORKER, SamplerPool, ScorerPool
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


def sampling(
    batch: int, batches: int, max_new_tokens: int, pools: tuple[int, ...] = (1, 2)
) -> dict[str, Any]:
    """Generation throughput in process and on 1 and 2 sampling actors (see the module docstring)."""
    torch.set_num_threads(1)  # as each actor
    model = ModelConfig(path="tiny", tiny=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4))
    policy, tok = load_policy(model)
    prompts = [
        tok(f"{i * 37 % 100}*{i * 11 % 10}\n<answer>")["input_ids"]
        for i in range(batch // 4)
        for _ in range(4)
    ]
    seeds = list(range(len(prompts)))
    settings = SamplingSettings(max_new_tokens)
    expected = [g.completion_ids for g in HFSampler(policy, tok).generate(prompts, settings, seeds)]
    tokens = sum(len(ids) for ids in expected) * batches
    out: dict[str, Any] = {"batch": len(prompts), "batches": batches, "max_new_tokens": max_new_tokens}

    def measured(generate: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        for _ in range(batches):
            assert [g.completion_ids for g in generate(prompts, settings, seeds)] == expected
        secs = time.perf_counter() - t0
        return {
            "completions_per_s": round(len(prompts) * batches / secs, 1),
            "tokens_per_s": round(tokens / secs),
        }

    out["in_process"] = measured(HFSampler(policy, tok).generate)
    for workers in pools:
        t0 = time.perf_counter()
        pool = SamplerPool(model, workers)
        t1 = time.perf_counter()
        pool.update_weights(untied_state_dict(policy).items(), 0)
        t2 = time.perf_counter()
        result = measured(pool.generate)
        pool.shutdown()
        result["speedup_vs_in_process"] = round(result["tokens_per_s"] / out["in_process"]["tokens_per_s"], 2)
        result["startup_s"], result["weights_sync_s"] = round(t1 - t0, 2), round(t2 - t1, 3)
        out[f"ray_{workers}_worker{'s' if workers > 1 else ''}"] = result
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heavy-ms", type=float, default=20.0, help="CPU per completion of the heavy reward")
    ap.add_argument("--heavy-batch", type=int, default=128)
    ap.add_argument("--heavy-batches", type=int, default=3)
    ap.add_argument("--cheap-batch", type=int, default=256)
    ap.add_argument("--cheap-batches", type=int, default=30)
    ap.add_argument("--gen-batch", type=int, default=64, help="completions per generation batch")
    ap.add_argument("--gen-batches", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=32, help="max new tokens per completion")
    ap.add_argument("--note", action="append", default=[], help="a line for the JSON's notes (repeatable)")
    ap.add_argument("--out", default=None, help="also write the JSON here (e.g. docs/ray_scoring.json)")
    ap.add_argument(
        "--quick", action="store_true", help="batches of 8, one batch each, pools of 1 worker only: seconds"
    )
    a = ap.parse_args()
    pools = (1,) if a.quick else (1, 2)
    if a.quick:
        a.heavy_ms, a.heavy_batch, a.heavy_batches, a.cheap_batch, a.cheap_batches = 1.0, 8, 1, 8, 1
        a.gen_batch, a.gen_batches, a.gen_tokens = 8, 1, 4
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
    for workers in pools:
        t0 = time.perf_counter()
        pool = ScorerPool(lambda: HeavyCountdown(iterations), workers)
        startup[f"{workers}_workers"] = round(time.perf_counter() - t0, 2)
        assert pool.score(problems, completions)[0] == expected
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
    for workers in pools:
        pool = ScorerPool(functools.partial(get_task, "countdown", seed=0), workers)
        assert pool.score(problems, completions)[0] == expected
        ray_s = statistics.median(timed_batches(pool.score, problems, completions, a.cheap_batches))
        pool.shutdown()
        cheap[f"ray_{workers}_worker{'s' if workers > 1 else ''}"] = {
            "batch_ms_median": round(1000 * ray_s, 3),
            "overhead_ms_per_batch": round(1000 * (ray_s - local_s), 3),
            "overhead_us_per_completion": round(1e6 * (ray_s - local_s) / a.cheap_batch, 2),
        }
    gen = sampling(a.gen_batch, a.gen_batches, a.gen_tokens, pools)
    ray.shutdown()

    result = {
        "benchmark": "ray_scoring",
        "quick": a.quick,
        "command": (
            f"python benchmarks/ray_scoring.py --heavy-ms {a.heavy_ms:g} --heavy-batch {a.heavy_batch} "
            f"--heavy-batches {a.heavy_batches} --cheap-batch {a.cheap_batch} --cheap-batches {a.cheap_batches} "
            f"--gen-batch {a.gen_batch} --gen-batches {a.gen_batches} --gen-tokens {a.gen_tokens}"
            + (f" --out {a.out}" if a.out else "")
            + (" --quick" if a.quick else "")
        ),
        "heavy": {"batch": a.heavy_batch, "batches": a.heavy_batches, **heavy},
        "cheap": cheap,
        "sampling": gen,
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
