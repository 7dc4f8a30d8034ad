"""Held-out evaluation: the trainer's periodic eval and `keelrl eval` share this code and the sampler.

`run_eval` generates `samples` completions for each of the first N test problems (greedy when the
temperature is 0), scores them with the task's checker and returns per-problem records; `summarize`
turns records into metrics: `accuracy` (mean correctness; greedy accuracy when samples=1 and T=0),
`reward/mean`, `format_rate`, `truncated_frac`, `length/mean`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from keelrl.rollout import Sampler, SamplingSettings, render_prompt
from keelrl.tasks import Task, Template
from keelrl.tasks.base import stable_hash


@dataclass
class ProblemResult:
    index: int
    problem: dict[str, Any]
    difficulty: str
    texts: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    formatted: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "problem": self.problem,
            "difficulty": self.difficulty,
            "rewards": self.rewards,
            "correct": self.correct,
            "truncated": self.truncated,
            "lengths": self.lengths,
            "texts": self.texts,
        }


def run_eval(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    template: Template,
    num_problems: int,
    settings: SamplingSettings,
    samples: int = 1,
    seed: int = 0,
    batch_size: int = 128,
    split: str = "test",
    on_progress: Callable[[int], None] | None = None,
) -> list[ProblemResult]:
    """Generate and score `samples` completions for each of the first `num_problems` problems of `split`."""
    results = []
    jobs: list[tuple[ProblemResult, list[int], str]] = []
    for i in range(num_problems):
        problem = task.problem(split, i)  # type: ignore[arg-type]
        prompt = task.prompt(problem, template)
        res = ProblemResult(i, problem, task.difficulty(problem))
        results.append(res)
        ids = render_prompt(tokenizer, prompt, template)
        for _ in range(samples):
            jobs.append((res, ids, prompt.assistant_prefix))
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        seeds = [stable_hash("eval", seed, res.index, (start + k) % samples) for k, (res, _, _) in enumerate(chunk)]
        gens = sampler.generate([ids for _, ids, _ in chunk], settings, seeds)
        for (res, _, prefix), gen in zip(chunk, gens):
            text = tokenizer.decode(gen.completion_ids, skip_special_tokens=True)
            score = task.score(res.problem, prefix + text)
            res.texts.append(text)
            res.rewards.append(score.reward)
            res.correct.append(score.correct)
            res.formatted.append(bool(score.info.get("formatted", score.reward > 0)))
            res.truncated.append(gen.finish_reason == "length")
            res.lengths.append(len(gen.completion_ids))
        if on_progress is not None:
            on_progress(len(chunk))
    return results


def summarize(results: list[ProblemResult]) -> dict[str, float]:
    """Means over problems of per-problem means (each problem counts once, whatever its sample count)."""
    if not results:
        return {}

    def mean_of(attr: str) -> float:
        return float(np.mean([np.mean(getattr(r, attr)) for r in results]))

    return {
        "accuracy": mean_of("correct"),
        "reward/mean": mean_of("rewards"),
        "format_rate": mean_of("formatted"),
        "truncated_frac": mean_of("truncated"),
        "length/mean": mean_of("lengths"),
        "problems": float(len(results)),
    }


def timed_eval(**kwargs: Any) -> tuple[list[ProblemResult], dict[str, float]]:
    t0 = time.perf_counter()
    results = run_eval(**kwargs)
    metrics = summarize(results)
    elapsed = time.perf_counter() - t0
    metrics["time_s"] = elapsed
    metrics["problems_per_s"] = len(results) / elapsed if elapsed > 0 else 0.0
    return results, metrics
