"""distributed.scorer = "ray": the actor pool scores exactly like the training process, a killed actor
loses and repeats nothing, and a training run ends with the same weights with either scorer."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from keelrl.config import load_config
from keelrl.loop.trainer import train
from keelrl.rollout.ray import RayPoolError, ScorerPool
from keelrl.tasks import Task, get_task
from keelrl.tasks.base import Score, score_safely

ray = pytest.importorskip("ray")
# the test-only tasks below travel to the actors by value (the actors cannot import this test module)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def countdown_cases(n: int) -> tuple[Task, list[dict[str, Any]], list[str]]:
    """Correct, wrong, malformed and unparsable answers, and problems the checker raises on."""
    task = get_task("countdown", seed=0)
    problems, completions = [], []
    for i in range(n):
        numbers = task.problem("train", i)["numbers"]
        problem: dict[str, Any] = {"numbers": numbers, "target": sum(numbers), "index": i}
        completion = [
            f"<think>add</think><answer>{' + '.join(map(str, numbers))}</answer>",  # correct
            f"<answer>{' * '.join(map(str, numbers))}</answer>",  # all numbers, mostly the wrong value
            f"<answer>{numbers[0]} - {numbers[1]}</answer>",  # not all numbers
            "I think the answer is forty-two",  # no answer block
            "<answer>((</answer>",
        ][i % 5]
        if i % 23 == 7:
            del problem["target"]  # the checker raises KeyError
        problems.append(problem)
        completions.append(completion)
    return task, problems, completions


def multiply_cases(n: int) -> tuple[Task, list[dict[str, Any]], list[str]]:
    task = get_task("multiply", seed=1)
    problems, completions = [], []
    for i in range(n):
        problem = dict(task.problem("train", i))
        a, b = problem["a"], problem["b"]
        completions.append(
            [f"<answer>{a * b}</answer>", f"<answer>{a * b + 1}</answer>", "<answer>x</answer>", ""][i % 4]
        )
        if i % 19 == 5:
            problem = {"a": a}  # the checker raises KeyError
        problems.append(problem)
    return task, problems, completions


@pytest.mark.parametrize("cases", [countdown_cases, multiply_cases])
def test_pool_scores_like_the_training_process(local_ray, cases) -> None:
    task, problems, completions = cases(300)
    expected, expected_errors = score_safely(task, problems, completions)
    reasons = {s.info["reason"] for s in expected}
    assert {"correct", "wrong_value", "score_error"} <= reasons and len(reasons) >= 4  # every kind is there
    pool = ScorerPool(functools.partial(get_task, task.name, seed=task.seed), workers=2, chunk_size=16)
    try:
        scores, errors = pool.score(problems, completions)
        replaced = pool.actors.take_replaced()
    finally:
        pool.shutdown()
    assert scores == expected  # rewards, correct flags and info, in input order
    assert errors == expected_errors and errors
    assert replaced == 0


class DyingTask:
    """Countdown whose checker kills its own process (like an out-of-memory kill) on a problem marked `die`,
    while the file `deaths` holds fewer than `times` lines; a score's info names its problem's index."""

    name = "dying"

    def __init__(self, deaths: str, times: int) -> None:
        self.inner = get_task("countdown", seed=0)
        self.deaths, self.times = Path(deaths), times

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        if problem.get("die"):
            died = len(self.deaths.read_text().splitlines()) if self.deaths.exists() else 0
            if died < self.times:
                with open(self.deaths, "a") as f:
                    f.write(f"{os.getpid()}\n")
                os._exit(1)
        s = self.inner.score(problem, completion)
        return Score(s.reward, s.correct, {**s.info, "index": problem["index"]})


def test_killed_actor_loses_and_repeats_nothing(local_ray, tmp_path: Path) -> None:
    _, problems, completions = countdown_cases(300)
    problems[150] = {**problems[150], "die": True}  # mid-batch, while other chunks are in flight
    deaths = tmp_path / "deaths"
    expected, _ = score_safely(DyingTask(str(deaths), times=0), problems, completions)
    pool = ScorerPool(functools.partial(DyingTask, str(deaths), 1), workers=2, max_retries=2, chunk_size=10)
    try:
        scores, _ = pool.score(problems, completions)
        assert len(deaths.read_text().splitlines()) == 1  # an actor really died
        replaced = pool.actors.take_replaced()
        assert replaced >= 1 and pool.actors.replaced_total == replaced
        scored = [i for i, s in enumerate(scores) if s.info.get("index") == i]
        failed = [i for i, s in enumerate(scores) if s.info["reason"] == "score_error"]
        assert len(scores) == 300 and sorted(scored + failed) == list(range(300))  # each sample once
        assert scores == expected
        again, _ = pool.score(problems, completions)  # the replacement serves the next call
        assert again == expected and pool.actors.take_replaced() == 0
    finally:
        pool.shutdown()


def test_actor_dying_every_time_fails_after_the_retries(local_ray, tmp_path: Path) -> None:
    _, problems, completions = countdown_cases(40)
    problems[3] = {**problems[3], "die": True}
    deaths = tmp_path / "deaths"
    pool = ScorerPool(functools.partial(DyingTask, str(deaths), 100), workers=1, max_retries=1)
    try:
        with pytest.raises(RayPoolError, match=r"2 times \(distributed.ray_max_retries=1\)"):
            pool.score(problems, completions)
    finally:
        pool.shutdown()
    assert len(deaths.read_text().splitlines()) == 2  # the first try and one retry


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_with_ray_scorer_matches_local(local_ray, format_run: list[str], tmp_path: Path) -> None:
    common = [
        *format_run,
        "train.steps=2",
        "eval.at_start=false",
        "eval.every_steps=0",
        "supervisor.enabled=false",
    ]
    runs = {}
    for scorer in ("local", "ray"):
        cfg = load_config("configs/smoke.toml", [*common, f'distributed.scorer="{scorer}"'])
        summary = train(cfg, tmp_path / scorer)
        runs[scorer] = (summary["weights_sha256"], _metrics(tmp_path / scorer))
    (local_sha, local_metrics), (ray_sha, ray_metrics) = runs["local"], runs["ray"]
    assert [m["step"] for m in ray_metrics] == [1, 2]
    assert all(m["scorer/replaced_workers"] == 0.0 for m in ray_metrics)  # the Ray path really ran
    assert not any("scorer/replaced_workers" in m for m in local_metrics)
    assert any(m["reward/std"] > 0 for m in local_metrics)  # rewards vary, so the updates depend on them
    keys = ["reward/mean", "reward/std", "accuracy", "format_rate", "reward/errors"]
    assert [[m[k] for k in keys] for m in ray_metrics] == [[m[k] for k in keys] for m in local_metrics]
    assert ray_sha == local_sha
