"""Generation: the per-problem records of an eval.

`run_eval` generates `samples` completions for each of the first N test problems (greedy when the
temperature is 0), scores them with the task's checker and returns per-problem records. A checker that
raises scores that sample 0 and its error is kept (`score_errors`, as in training), so one bad completion
does not end an eval, or the training run that called it. Sample j of problem i is drawn with the seed
`stable_hash("eval", seed, i, j)`, and the sampler's randomness is per row, so an eval is a pure function
of (model, problems, settings, seed), whatever the batch size. Two models evaluated with the same seed also
share their random numbers (common random numbers), which makes paired comparisons sharper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from keelrl.tasks.base import score_safely, stable_hash

if TYPE_CHECKING:  # torch and transformers load only when a model is evaluated
    from transformers import PreTrainedTokenizerBase

    from keelrl.rollout import Sampler, SamplingSettings
    from keelrl.tasks import Task, Template


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
    answers: list[str | None] = field(default_factory=list)  # extracted answer per sample (None: no answer)
    # per sample: the checker's error when it raised (the sample then scored 0), else None
    score_errors: list[str | None] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "problem": self.problem,
            "difficulty": self.difficulty,
            "rewards": self.rewards,
            "correct": self.correct,
            "formatted": self.formatted,
            "truncated": self.truncated,
            "lengths": self.lengths,
            "answers": self.answers,
            "score_errors": self.score_errors,
            "texts": self.texts,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProblemResult:
        n = len(d["correct"])
        return cls(
            index=int(d["index"]),
            problem=dict(d["problem"]),
            difficulty=str(d.get("difficulty", "all")),
            texts=list(d.get("texts", [""] * n)),
            rewards=[float(x) for x in d["rewards"]],
            correct=[bool(x) for x in d["correct"]],
            formatted=[bool(x) for x in d.get("formatted", [r > 0 for r in d["rewards"]])],
            truncated=[bool(x) for x in d["truncated"]],
            lengths=[int(x) for x in d["lengths"]],
            answers=list(d.get("answers", [None] * n)),
            score_errors=list(d.get("score_errors", [None] * n)),
        )


def extracted_answer(info: Mapping[str, Any], completion: str, formatted: bool) -> str | None:
    """The answer a sample votes for: the scorer's `info["answer"]` when it gives one; otherwise the whole
    completion when it was well-formed (e.g. a program), else None (no vote)."""
    if "answer" in info:
        return None if info["answer"] is None else str(info["answer"])
    return completion.strip() if formatted else None


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
    """Generate and score `samples` completions for each of the first `num_problems` problems of `split`.
    `on_progress(k)` is called after each batch with the number of completions it produced."""
    from keelrl.rollout import render_prompt

    results = []
    jobs: list[tuple[ProblemResult, int, list[int], str]] = []
    for i in range(num_problems):
        problem = task.problem(split, i)  # type: ignore[arg-type]
        prompt = task.prompt(problem, template)
        res = ProblemResult(i, problem, task.difficulty(problem))
        results.append(res)
        ids = render_prompt(tokenizer, prompt, template)
        for j in range(samples):
            jobs.append((res, j, ids, prompt.assistant_prefix))
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        seeds = [stable_hash("eval", seed, res.index, j) for res, j, _, _ in chunk]
        gens = sampler.generate([ids for _, _, ids, _ in chunk], settings, seeds)
        texts = [tokenizer.decode(gen.completion_ids, skip_special_tokens=True) for gen in gens]
        scores, _ = score_safely(
            task, [res.problem for res, _, _, _ in chunk], [c[3] + t for c, t in zip(chunk, texts)]
        )
        for (res, _, _, _), gen, text, score in zip(chunk, gens, texts, scores):
            res.score_errors.append(
                score.info["error"] if score.info.get("reason") == "score_error" else None
            )
            formatted = bool(score.info.get("formatted", score.reward > 0))
            res.texts.append(text)
            res.rewards.append(score.reward)
            res.correct.append(score.correct)
            res.formatted.append(formatted)
            res.truncated.append(gen.finish_reason == "length")
            res.lengths.append(len(gen.completion_ids))
            res.answers.append(extracted_answer(score.info, text, formatted))
        if on_progress is not None:
            on_progress(len(chunk))
    return results


def summarize(results: list[ProblemResult]) -> dict[str, float]:
    """Means over problems of per-problem means (each problem counts once, whatever its sample count), and
    `reward/errors`, the number of samples whose checker raised. The trainer's periodic eval logs these as
    `eval/<name>`."""
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
        "reward/errors": float(len(score_errors(results))),
        "problems": float(len(results)),
    }


def score_errors(results: Sequence[ProblemResult] | None) -> list[str]:
    """The checker errors of `results`, in problem and sample order (each such sample scored 0)."""
    return [e for r in results or () for e in r.score_errors if e is not None]
