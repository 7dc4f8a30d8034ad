"""The report of one eval (`EvalReport`, built by `evaluate`: a greedy pass, optionally an n-sample pass;
its `summary()` holds every metric with its interval, see stats.py), and the paired comparison of two.

`compare_results` bootstraps the per-problem differences B - A (problems resampled together), much tighter
than comparing two independent intervals. The verdict is `better` / `worse` when the difference's interval
excludes 0 (in the metric's direction of improvement), else `indistinguishable`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from keelrl.config import ConfigError
from keelrl.core.seeds import stable_hash
from keelrl.evals.run import ProblemResult, problem_count, run_eval, score_errors
from keelrl.evals.stats import BOOTSTRAP_RESAMPLES, default_ks, metric_intervals, problem_metrics

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from keelrl.config import EpisodeConfig
    from keelrl.rollout import Sampler
    from keelrl.tasks import Task, Template

SCHEMA = "keelrl.eval/1"

# Direction of improvement (+1 higher, -1 lower is better, 0 neither; unlisted: +1); a `sampled/` name has its
# metric's (so `sampled/truncated_frac` is -1).
_DIRECTION = {
    "truncated_frac": -1,
    "length/mean": 0,
    "turns/mean": 0,
    "tool_calls/mean": 0,
    "tool_errors/mean": -1,
    "perplexity": -1,
    "nll/token": -1,
}


class ComparisonError(ConfigError):
    """Two results cannot be compared (different problems, or no per-problem records)."""


@dataclass
class EvalReport:
    """Everything one eval produced. `settings` holds what is needed to reproduce it (model, task, task
    parameters and seed, template, problems, samples, k, temperatures, token limit, seed)."""

    settings: dict[str, Any]
    greedy: list[ProblemResult] | None = None
    sampled: list[ProblemResult] | None = None
    time_s: float = 0.0

    @property
    def ks(self) -> list[int]:
        return [int(k) for k in self.settings.get("k", [])]

    @property
    def records(self) -> list[ProblemResult]:
        return self.greedy or self.sampled or []

    def problems(self) -> list[dict[str, Any]]:
        return [r.problem for r in self.records]

    def distinct_problems(self) -> int:
        """A procedural task with a small held-out space draws some problems more than once: the metrics are
        then those of the task's distribution, and this many problems carry them (docs/eval.md)."""
        return len({json.dumps(p, sort_keys=True) for p in self.problems()})

    def table(self) -> dict[str, np.ndarray]:
        return problem_metrics(self.greedy, self.sampled, self.ks if self.sampled else ())

    def summary(self, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
        """The report without per-problem records: metrics with intervals, the difficulty breakdown, speed."""
        seed = int(self.settings.get("seed", 0))
        table = self.table()
        metrics = metric_intervals(table, 0.95, resamples, seed)
        difficulty = np.array([r.difficulty for r in self.records], dtype=object)
        by_difficulty = {}
        for name in sorted({r.difficulty for r in self.records}):
            rows = difficulty == name  # [P] this bucket's problems
            sub = {m: v[rows] for m, v in table.items()}
            by_difficulty[name] = {
                "problems": int(rows.sum()),
                "metrics": metric_intervals(sub, 0.95, resamples, stable_hash("bucket", seed, name)),
            }
        num = len(self.records)
        both = [*(self.greedy or []), *(self.sampled or [])]
        completions, tokens = sum(len(r.correct) for r in both), sum(sum(r.lengths) for r in both)
        errors = score_errors(both)
        return {
            "schema": SCHEMA,
            **{k: self.settings[k] for k in ("model", "task") if k in self.settings},
            **({"accuracy": metrics["accuracy"]["value"]} if "accuracy" in metrics else {}),
            "problems": num,
            "distinct_problems": self.distinct_problems(),
            "score_errors": len(errors),  # samples scored 0 because the task's checker raised
            **({"first_score_error": errors[0]} if errors else {}),
            "metrics": metrics,
            "by_difficulty": by_difficulty,
            "settings": self.settings,
            "time_s": self.time_s,
            "problems_per_s": num / self.time_s if self.time_s > 0 else 0.0,
            "completions_per_s": completions / self.time_s if self.time_s > 0 else 0.0,
            "tokens_per_s": tokens / self.time_s if self.time_s > 0 else 0.0,
        }

    def to_json(self, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
        """`summary()` plus the per-problem records that `compare` and `from_json` need."""
        return {
            **self.summary(resamples),
            "records": {
                "greedy": None if self.greedy is None else [r.to_json() for r in self.greedy],
                "sampled": None if self.sampled is None else [r.to_json() for r in self.sampled],
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "the eval result") -> EvalReport:
        records = data.get("records")
        if data.get("schema") != SCHEMA or not isinstance(records, Mapping):
            raise ComparisonError(
                f"{source} is not a keelrl eval result with per-problem records (expected schema {SCHEMA!r}); "
                "write one with `keelrl eval MODEL --task NAME --out FILE.json`."
            )

        def load(rows: Any) -> list[ProblemResult] | None:
            return None if rows is None else [ProblemResult.from_json(r) for r in rows]

        return cls(
            settings=dict(data.get("settings", {})),
            greedy=load(records.get("greedy")),
            sampled=load(records.get("sampled")),
            time_s=float(data.get("time_s", 0.0)),
        )


def evaluate(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    template: Template,
    num_problems: int,
    *,
    max_new_tokens: int = 256,
    greedy: bool = True,
    samples: int = 0,
    ks: Sequence[int] | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 128,
    split: str = "test",
    meta: Mapping[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    limits: EpisodeConfig | None = None,
) -> EvalReport:
    """A greedy pass (if `greedy`) and an n-sample pass (if `samples` > 0) over the first `num_problems` of
    `split`. `ks` defaults to 1, 2, 4, ... n; `meta` (model name, task params, ...) goes into the settings.
    `limits`: an environment's episode budgets (the defaults when None)."""
    from keelrl.rollout import SamplingSettings

    if not greedy and samples <= 0:
        raise ConfigError("nothing to evaluate: no greedy pass and no samples")
    if samples > 0 and temperature <= 0:
        raise ConfigError(
            f"{samples} samples per problem at temperature 0 would all be the greedy completion; "
            "give a temperature > 0 (e.g. --temperature 1.0), or use --samples 1 for greedy only"
        )
    num_problems = problem_count(task, split, num_problems)
    ks = sorted({int(k) for k in ks}) if ks else default_ks(samples)
    if samples > 0 and (bad := [k for k in ks if not 1 <= k <= samples]):
        raise ConfigError(
            f"--k {','.join(map(str, bad))}: pass@k and maj@k need 1 <= k <= samples ({samples})"
        )
    settings: dict[str, Any] = {
        **(meta or {}),
        "problems": num_problems,
        "split": split,
        "greedy": greedy,
        "samples": samples,
        "k": ks if samples > 0 else [],
        "temperature": temperature if samples > 0 else None,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "accuracy_from": "greedy" if greedy else "sampled",
    }
    common = dict(
        sampler=sampler, tokenizer=tokenizer, task=task, template=template, num_problems=num_problems,
        seed=seed, batch_size=batch_size, split=split, on_progress=on_progress, limits=limits,
    )  # fmt: skip
    t0 = time.perf_counter()
    greedy_results = sampled_results = None
    if greedy:
        greedy_results = run_eval(settings=SamplingSettings(max_new_tokens, 0.0, 1.0, 0), samples=1, **common)
    if samples > 0:
        sampled_results = run_eval(
            settings=SamplingSettings(max_new_tokens, temperature, top_p, 0), samples=samples, **common
        )
    return EvalReport(settings, greedy_results, sampled_results, time.perf_counter() - t0)


def metric_direction(name: str) -> int:
    """+1 if higher is better, -1 if lower is better, 0 if neither (e.g. length)."""
    return _DIRECTION.get(name, _DIRECTION.get(name.removeprefix("sampled/"), 1))


def verdict(lo: float, hi: float, direction: int = 1) -> str:
    """better / worse / indistinguishable for an interval [lo, hi] of B - A (direction 0: higher / lower)."""
    if lo > 0:
        return "better" if direction > 0 else "worse" if direction < 0 else "higher"
    if hi < 0:
        return "worse" if direction > 0 else "better" if direction < 0 else "lower"
    return "indistinguishable"


def compare_results(
    a: EvalReport | Mapping[str, Any],
    b: EvalReport | Mapping[str, Any],
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired comparison of B against A (reports or JSON) for every metric both have: {"level", "problems",
    "metrics": {name: {"a", "b", "diff", "ci": [lo, hi], "verdict"}}, "only_in_a", "only_in_b",
    "setting_differences"}; ComparisonError if the problem lists differ."""
    ra, rb = (x if isinstance(x, EvalReport) else EvalReport.from_json(x, n) for x, n in ((a, "A"), (b, "B")))
    pa, pb = ra.problems(), rb.problems()
    if len(pa) != len(pb):
        raise ComparisonError(
            f"A has {len(pa)} problems and B has {len(pb)}: a paired comparison needs the same problems. "
            "Evaluate both with the same --task, --task-param, --problems (and task seed)."
        )
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y:
            raise ComparisonError(
                f"A and B were evaluated on different problems (first difference at problem {i}: {x} vs {y}). "
                "Evaluate both with the same --task, --task-param, --problems (and task seed)."
            )
    if not pa:
        raise ComparisonError("A and B hold no problems to compare")
    ta, tb = ra.table(), rb.table()
    diffs = metric_intervals({m: tb[m] - ta[m] for m in ta if m in tb}, level, resamples, seed)
    metrics = {
        m: {
            "a": float(ta[m].mean()),
            "b": float(tb[m].mean()),
            "diff": d["value"],
            "ci": d["ci95"],
            "verdict": verdict(*d["ci95"], metric_direction(m)),
        }
        for m, d in diffs.items()
    }
    keys = ("task", "task_params", "task_seed", "template", "greedy", "samples", "temperature", "top_p",
            "max_new_tokens", "seed")  # fmt: skip
    differences = {
        k: [ra.settings.get(k), rb.settings.get(k)] for k in keys if ra.settings.get(k) != rb.settings.get(k)
    }
    return {
        "level": level,
        "problems": len(pa),
        "metrics": metrics,
        "only_in_a": [m for m in ta if m not in tb],
        "only_in_b": [m for m in tb if m not in ta],
        "setting_differences": differences,
    }
