"""Generation: the per-problem records of an eval, through the episode path training uses (episodes.py).

Sample j of problem i is drawn with the seed `stable_hash("eval", seed, i, j)`, and the sampler's randomness
is per row, so an eval is a pure function of (model, problems, settings, seed), whatever the batch size. Two
models evaluated with the same seed share their random numbers, which makes paired comparisons sharper. A
sample without a reward (a checker that raised, a verifier that could not judge) counts as not correct and its
error is kept (`score_errors`); training leaves such samples out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from keelrl.core.seeds import stable_hash
from keelrl.rollout.types import is_truncated

if TYPE_CHECKING:  # torch and transformers load only when a model is evaluated
    from transformers import PreTrainedTokenizerBase

    from keelrl.config import EpisodeConfig
    from keelrl.rollout import Rollout, Sampler, SamplingSettings
    from keelrl.rollout.episodes import Episode
    from keelrl.tasks import Task, Template


@dataclass
class ProblemResult:
    index: int
    problem: dict[str, Any]
    difficulty: str
    rewards: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    formatted: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)  # extracted answer per sample (None: no answer)
    # per sample: why it has no reward (a checker that raised, a verifier that could not judge: it then counts as
    # not correct), else None
    score_errors: list[str | None] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    # multi-turn environments only (empty for single-turn tasks): per sample
    turns: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    tool_errors: list[int] = field(default_factory=list)
    # tasks with a `behaviour(problem, completion) -> dict[str, float]` method: its numbers, per sample
    behaviour: list[dict[str, float]] = field(default_factory=list)

    def add(self, rollout: Rollout) -> None:
        """Record one scored sample."""
        info, text = rollout.info, rollout.text
        formatted = bool(info.get("formatted", rollout.reward > 0))
        self.texts.append(text)
        self.rewards.append(rollout.reward)
        self.correct.append(rollout.correct)
        self.formatted.append(formatted)
        self.truncated.append(is_truncated(rollout.finish_reason))
        self.lengths.append(sum(rollout.trainable))  # the model's tokens (an environment's are context)
        self.answers.append(extracted_answer(info, text, formatted))
        self.score_errors.append(str(info.get("error", rollout.status)) if rollout.status != "ok" else None)
        if "turns" in info:  # an environment's episode: turns, tool calls, tool errors
            for attr in EPISODE_STATS.values():
                getattr(self, attr).append(int(info.get(attr, 0)))

    def to_json(self) -> dict[str, Any]:
        """Every field, in field order; the episode and behaviour lists only when there are any."""
        left_out = set() if self.turns else set(EPISODE_STATS.values())
        if not self.behaviour:
            left_out.add("behaviour")
        return {k: v for k, v in asdict(self).items() if k not in left_out}

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
            **{attr: [int(x) for x in d.get(attr, [])] for attr in EPISODE_STATS.values()},
            behaviour=[{str(k): float(v) for k, v in b.items()} for b in d.get("behaviour", [])],
        )


def extracted_answer(info: Mapping[str, Any], completion: str, formatted: bool) -> str | None:
    """A sample's vote: the scorer's `info["answer"]`, else the completion if well-formed, else None."""
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
    limits: EpisodeConfig | None = None,
) -> list[ProblemResult]:
    """Generate and score `samples` completions for each of the first `num_problems` problems of `split`;
    `on_progress(k)` is called after each batch of k completions. `limits`: an environment's budgets."""
    from keelrl.rollout.episodes import Prompter, run_episodes

    num_problems = problem_count(task, split, num_problems)
    results = [
        ProblemResult(i, p, task.difficulty(p))
        for i, p in ((i, task.problem(split, i)) for i in range(num_problems))
    ]  # type: ignore[arg-type]
    episodes = eval_episodes([r.problem for r in results], samples, seed)
    rollouts = run_episodes(
        sampler,
        Prompter(task, tokenizer, template, limits),
        episodes,
        settings,
        batch_size,
        on_batch=None if on_progress is None else lambda batch: on_progress(len(batch)),
    )
    behave = getattr(task, "behaviour", None)  # optional: per-sample statistics of the completion
    for r in rollouts:
        result = results[r.problem_index]
        result.add(r)
        if behave is not None:
            result.behaviour.append(dict(behave(result.problem, r.prefix + r.text)))
    return results


def problem_count(task: Task, split: str, wanted: int) -> int:
    """`wanted`, or the split's size when the task says it has fewer problems (a data set's held-out rows)."""
    size = getattr(task, "size", None)
    return wanted if size is None else min(wanted, size(split))


def eval_episodes(problems: Sequence[dict[str, Any]], samples: int, seed: int) -> list[Episode]:
    """`samples` episodes of each problem (index i = problem i of the split), with eval's seeds: every tool that
    evaluates held-out problems (keelrl eval, the trainer's evals, keelrl judge) samples the same rows."""
    from keelrl.rollout.episodes import Episode

    return [
        Episode(i, p, i, stable_hash("eval", seed, i, j))
        for i, p in enumerate(problems)
        for j in range(samples)
    ]


def summarize(results: list[ProblemResult]) -> dict[str, float]:
    """Means over problems of per-problem means (each problem counts once), and `reward/errors` (samples
    whose checker raised); a task's `behaviour` numbers as `search/<name>` (each name found in every
    problem's samples). The trainer's periodic eval logs these as `eval/<name>`."""
    if not results:
        return {}

    def mean_of(attr: str) -> float:
        return float(np.mean([np.mean(getattr(r, attr)) for r in results]))

    return {
        "accuracy": mean_of("correct"),
        **{k: mean_of(a) for k, a in SAMPLE_STATS.items()},
        "reward/errors": float(len(score_errors(results))),
        "problems": float(len(results)),
        **({k: mean_of(a) for k, a in EPISODE_STATS.items()} if all(r.turns for r in results) else {}),
        **behaviour_means(results),
    }


def behaviour_means(results: Sequence[ProblemResult]) -> dict[str, float]:
    """`search/<name>`: the mean over problems of each problem's mean of a `behaviour` number (names that
    every sample of every problem has; none when a problem has no behaviour records)."""
    if not results or not all(r.behaviour for r in results):
        return {}
    names = set.intersection(*(set(b) for r in results for b in r.behaviour))
    return {
        f"search/{k}": float(np.mean([np.mean([b[k] for b in r.behaviour]) for r in results]))
        for k in sorted(names)
    }


# metric name -> ProblemResult field, reported from a pass's samples (evals: the main pass, and the sampled
# pass as sampled/...)
SAMPLE_STATS = {
    "reward/mean": "rewards",
    "format_rate": "formatted",
    "truncated_frac": "truncated",
    "length/mean": "lengths",
}
# metric name -> ProblemResult field, for environments' episodes (reported when every problem has them)
EPISODE_STATS = {"turns/mean": "turns", "tool_calls/mean": "tool_calls", "tool_errors/mean": "tool_errors"}


def score_errors(results: Sequence[ProblemResult] | None) -> list[str]:
    """The checker errors of `results`, in problem and sample order (each such sample scored 0)."""
    return [e for r in results or () for e in r.score_errors if e is not None]
