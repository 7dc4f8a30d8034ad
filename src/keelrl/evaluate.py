"""Held-out evaluation that says how sure it is: the trainer's periodic eval and `keelrl eval` / `keelrl
compare` share this code and the sampler.

Generation. `run_eval` generates `samples` completions for each of the first N test problems (greedy when
the temperature is 0), scores them with the task's checker and returns per-problem records. A checker that
raises scores that sample 0 and its error is kept (`score_errors`, as in training), so one bad completion
does not end an eval, or the training run that called it. Sample j of problem i is drawn with the seed
`stable_hash("eval", seed, i, j)`, and the sampler's randomness is per row, so an eval is a pure function
of (model, problems, settings, seed), whatever the batch size. Two models evaluated with the same seed also
share their random numbers (common random numbers), which makes paired comparisons sharper. `evaluate`
runs a greedy pass and, optionally, an n-sample pass at temperature t, and returns an `EvalReport`.

Metrics. Every metric is a mean over problems of a per-problem value (`problem_metrics`), so each problem
counts once, and one bootstrap over problems gives every interval:
- `accuracy`: greedy accuracy (a problem's value is 1 if the greedy completion is correct). With no greedy
  pass it is `mean@n` (the report's `settings.accuracy_from` says which).
- `mean@n`: mean correctness of the n samples (= pass@1 estimated from n samples).
- `pass@k`: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k)/C(n, k), computed as the stable
  product 1 - prod_{i=n-c+1}^{n} (1 - k/i).
- `maj@k`: majority vote over the extracted answers of k samples, averaged over all k-subsets of the n
  samples (exactly when there are at most `MAJ_MAX_SUBSETS` subsets, else over that many seeded random
  subsets), the same way pass@k averages over subsets. See `normalize_answer` for what counts as the same
  answer; samples without an answer abstain; ties go to the answer whose first vote came earliest in
  sample order. Samples are i.i.d., so this equals breaking ties uniformly at random, in expectation, and is
  deterministic.
- `reward/mean`, `format_rate`, `truncated_frac` (stopped by the token limit), `length/mean` (completion
  tokens): from the greedy pass when there is one, else from the sampled pass; with both passes the
  sampled pass's are also reported as `sampled/reward/mean`, ...
Intervals (`ci95`) are percentile bootstrap intervals over problems (2000 resamples by default, seeded:
the same report always gets the same interval). They cover problem-sampling noise; the decoding noise of
the n samples within a problem is inside each problem's value.

Comparison. `compare_results` takes two reports on the same problems and bootstraps the per-problem
differences B - A (paired: problems are resampled together), which is much tighter than comparing two
independent intervals. The verdict is `better` / `worse` when the interval of the difference excludes 0
(in the direction of improvement of that metric), else `indistinguishable`.

Gates. `parse_gate("accuracy>=0.45")`, `check_gate(gate, report, baseline)`: see `parse_gate`.

Perplexity. `perplexity(model, tokenizer, texts)` and `reference_perplexity(...)` (the task's reference
solutions as completions of its prompts), with a bootstrap interval over texts.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from keelrl.config import ConfigError
from keelrl.tasks.base import score_safely, stable_hash

if (
    TYPE_CHECKING
):  # torch and transformers load only when a model is evaluated (the statistics do not need them)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from keelrl.rollout import Sampler, SamplingSettings
    from keelrl.tasks import Task, Template

SCHEMA = "keelrl.eval/1"
BOOTSTRAP_RESAMPLES = 2000
MAJ_MAX_SUBSETS = 2000

# Direction of improvement per metric (+1 higher is better, -1 lower is better, 0 neither); names not
# listed are matched by their last path component (so `sampled/truncated_frac` is -1).
_DIRECTION = {"truncated_frac": -1, "length/mean": 0, "perplexity": -1, "nll/token": -1}


class GateError(ConfigError):
    """A --gate expression cannot be parsed or refers to something the results do not have."""


class ComparisonError(ConfigError):
    """Two results cannot be compared (different problems, or no per-problem records)."""


# ------------------------------------------------------------------------------------------ generation


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


# ------------------------------------------------------------------------------------ estimators (pure)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): the probability that a
    random k-subset of the n samples holds at least one correct one, 1 - C(n-c, k) / C(n, k), computed as
    1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the (huge) binomial coefficients."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


_SEPARATED_INT_RE = re.compile(r"^[+-]?\d{1,3}(?:[,_]\d{3})+$")
_PLAIN_INT_RE = re.compile(r"^[+-]?\d+$")


def normalize_answer(answer: str | None) -> str | None:
    """The key under which answers vote together in maj@k: all whitespace removed and case folded, and an
    integer written with thousands separators (`1,234`, `1_234`), a sign or leading zeros reduced to its
    canonical decimal form. Empty or missing answers are None (no vote). This is textual: two different
    expressions with the same value (`1+2` and `2+1`) are different answers."""
    if answer is None:
        return None
    key = "".join(answer.split()).casefold()
    if _SEPARATED_INT_RE.match(key) or _PLAIN_INT_RE.match(key):
        key = str(int(key.replace(",", "").replace("_", "")))
    return key or None


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Is the majority answer among `answers` correct? Answers are compared after `normalize_answer`;
    None abstains; a tie goes to the tied answer whose first vote comes first; no votes at all is wrong.
    The winning answer is correct when its first vote was."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        key = normalize_answer(a)
        if key is None:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    if not counts:
        return False
    best = max(counts.values())
    winner = min((first[key] for key, c in counts.items() if c == best))
    return bool(correct[winner])


@functools.lru_cache(maxsize=64)
def _subsets(n: int, k: int, seed: int) -> np.ndarray:
    """[S, k] sample indices (ascending in each row): all k-subsets of range(n), or MAJ_MAX_SUBSETS random
    ones drawn with `seed` when there are more. Cached; read-only."""
    if math.comb(n, k) <= MAJ_MAX_SUBSETS:
        out = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
    else:
        rng = np.random.default_rng(seed)
        out = np.sort(np.argsort(rng.random((MAJ_MAX_SUBSETS, n)), axis=1)[:, :k], axis=1)
    out.flags.writeable = False
    return out


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int, seed: int = 0) -> float:
    """maj@k of one problem: the fraction of k-subsets of its n samples (each kept in sample order) whose
    `majority_vote` is correct. All C(n, k) subsets when there are at most MAJ_MAX_SUBSETS, else that many
    random subsets drawn with `seed`."""
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"{n} answers but {len(correct)} correctness flags")
    if not 1 <= k <= n:
        raise ValueError(f"maj@{k} needs 1 <= k <= n, got n={n}")
    keys = [normalize_answer(a) for a in answers]
    vocab = {key: g for g, key in enumerate(dict.fromkeys(k_ for k_ in keys if k_ is not None))}
    if not vocab:
        return 0.0
    G = len(vocab)
    ids = np.array([vocab[k_] if k_ is not None else -1 for k_ in keys])  # [n]
    ok = np.asarray(correct, dtype=bool)  # [n]
    subsets = _subsets(n, k, seed)  # [S, k]
    S = len(subsets)
    sub_ids = ids[subsets]  # [S, k]
    valid = sub_ids >= 0  # [S, k]
    flat = (np.arange(S)[:, None] * G + sub_ids)[valid]
    counts = np.bincount(flat, minlength=S * G).reshape(S, G)  # [S, G] votes per answer
    votes = np.where(valid, np.take_along_axis(counts, np.maximum(sub_ids, 0), axis=1), 0)  # [S, k]
    best = votes.max(axis=1)  # [S]
    winner_pos = np.argmax(votes == best[:, None], axis=1)  # [S] first position holding a winning answer
    winner = subsets[np.arange(S), winner_pos]  # [S]
    return float((ok[winner] & (best > 0)).mean())


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return sorted({*ks, n}) if n >= 1 else []


def problem_metrics(
    greedy: Sequence[ProblemResult] | None,
    sampled: Sequence[ProblemResult] | None,
    ks: Sequence[int] = (),
) -> dict[str, np.ndarray]:
    """Per-problem value of every metric ([P] arrays, problems in order); a metric's value is the mean.
    `greedy`: one greedy completion per problem (or None); `sampled`: n samples per problem (or None)."""
    table: dict[str, np.ndarray] = {}

    def means(results: Sequence[ProblemResult], attr: str) -> np.ndarray:
        return np.array(
            [np.mean(getattr(r, attr)) if getattr(r, attr) else 0.0 for r in results], dtype=np.float64
        )

    if sampled:
        n_min = min(len(r.correct) for r in sampled)
        for k in ks:
            if k > n_min:
                raise ValueError(
                    f"pass@{k} needs at least {k} samples per problem; the sampled pass has {n_min}"
                )
        for k in ks:
            table[f"pass@{k}"] = np.array([pass_at_k(len(r.correct), sum(r.correct), k) for r in sampled])
        for k in ks:
            if k >= 2:
                table[f"maj@{k}"] = np.array([maj_at_k(r.answers, r.correct, k, seed=k) for r in sampled])
        table["mean@n"] = means(sampled, "correct")
    main = greedy if greedy else sampled
    if not main:
        return table
    table = {"accuracy": means(main, "correct"), **table}
    for name, attr in (
        ("reward/mean", "rewards"),
        ("format_rate", "formatted"),
        ("truncated_frac", "truncated"),
        ("length/mean", "lengths"),
    ):
        table[name] = means(main, attr)
    if greedy and sampled:
        for name, attr in (
            ("reward/mean", "rewards"),
            ("format_rate", "formatted"),
            ("truncated_frac", "truncated"),
            ("length/mean", "lengths"),
        ):
            table[f"sampled/{name}"] = means(sampled, attr)
    return table


# ---------------------------------------------------------------------------------------- bootstrap


def _resample_weights(num: int, resamples: int, seed: int) -> np.ndarray:
    """[R, num] multiplicities of a with-replacement resample of `num` items (rows sum to `num`)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num, size=(resamples, num))  # [R, num]
    offsets = (np.arange(resamples) * num)[:, None]  # [R, 1]
    return (
        np.bincount((idx + offsets).ravel(), minlength=resamples * num)
        .reshape(resamples, num)
        .astype(np.float64)
    )


def bootstrap_means(matrix: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """matrix [M, P] (M metrics over P problems) -> [R, M] means over R bootstrap resamples of the problems
    (the same resamples for every metric). Work is chunked so memory stays bounded for large P."""
    matrix = np.atleast_2d(np.asarray(matrix, dtype=np.float64))  # [M, P]
    num = matrix.shape[1]
    if num == 0:
        raise ValueError("bootstrap over zero problems")
    chunk = max(1, min(resamples, 4_000_000 // num))
    out = np.empty((resamples, matrix.shape[0]))
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        w = _resample_weights(num, rows, stable_hash("bootstrap", seed, start))  # [r, P]
        out[start : start + rows] = w @ matrix.T / num  # [r, M]
    return out


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """draws [R, ...] -> (lo, hi) percentile interval at `level` along the first axis."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be between 0 and 1, got {level}")
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(draws, [alpha, 1.0 - alpha], axis=0)
    return lo, hi


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of `values` (one value per problem)."""
    lo, hi = percentile_interval(bootstrap_means(np.asarray(values)[None, :], resamples, seed), level)
    return float(lo[0]), float(hi[0])


def metric_intervals(
    table: Mapping[str, np.ndarray], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """{metric: {"value": mean, "ci95": [lo, hi]}} for a per-problem table, one shared bootstrap."""
    names = list(table)
    if not names:
        return {}
    matrix = np.stack([table[n] for n in names])  # [M, P]
    lo, hi = percentile_interval(bootstrap_means(matrix, resamples, seed), level)
    values = matrix.mean(axis=1)
    # Clamp: a percentile of resampled means can differ from the mean by rounding when all values agree.
    return {
        n: {"value": float(v), "ci95": [float(min(a, v)), float(max(b, v))]}
        for n, v, a, b in zip(names, values, lo, hi)
    }


# ----------------------------------------------------------------------------------------- the report


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

    def table(self) -> dict[str, np.ndarray]:
        return problem_metrics(self.greedy, self.sampled, self.ks if self.sampled else ())

    def summary(self, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
        """The report without per-problem records: metrics with intervals, the difficulty breakdown, speed."""
        seed = int(self.settings.get("seed", 0))
        table = self.table()
        metrics = metric_intervals(table, 0.95, resamples, seed)
        buckets: dict[str, list[int]] = {}
        for i, r in enumerate(self.records):
            buckets.setdefault(r.difficulty, []).append(i)
        by_difficulty = {}
        for name in sorted(buckets):
            rows = np.array(buckets[name])
            sub = {m: v[rows] for m, v in table.items()}
            by_difficulty[name] = {
                "problems": len(rows),
                "metrics": metric_intervals(sub, 0.95, resamples, stable_hash("bucket", seed, name)),
            }
        num = len(self.records)
        completions = sum(len(r.correct) for r in (self.greedy or [])) + sum(
            len(r.correct) for r in (self.sampled or [])
        )
        tokens = sum(sum(r.lengths) for r in (self.greedy or [])) + sum(
            sum(r.lengths) for r in (self.sampled or [])
        )
        errors = score_errors(self.greedy) + score_errors(self.sampled)
        out: dict[str, Any] = {
            "schema": SCHEMA,
            **{k: self.settings[k] for k in ("model", "task") if k in self.settings},
        }
        if "accuracy" in metrics:
            out["accuracy"] = metrics["accuracy"]["value"]
        out.update(
            {
                "problems": num,
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
        )
        return out

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
) -> EvalReport:
    """A greedy pass (if `greedy`) and an n-sample pass at `temperature` (if `samples` > 0) over the first
    `num_problems` problems of `split`. `ks` defaults to 1, 2, 4, ... n. `meta` (model name, task params, ...)
    is stored in the report's settings."""
    from keelrl.rollout import SamplingSettings

    if not greedy and samples <= 0:
        raise ConfigError("nothing to evaluate: no greedy pass and no samples")
    if samples > 0 and temperature <= 0:
        raise ConfigError(
            f"{samples} samples per problem at temperature 0 would all be the greedy completion; "
            "give a temperature > 0 (e.g. --temperature 1.0), or use --samples 1 for greedy only"
        )
    ks = sorted({int(k) for k in ks}) if ks else default_ks(samples)
    if samples > 0:
        bad = [k for k in ks if not 1 <= k <= samples]
        if bad:
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
        seed=seed, batch_size=batch_size, split=split, on_progress=on_progress,
    )  # fmt: skip
    t0 = time.perf_counter()
    greedy_results = None
    if greedy:
        greedy_results = run_eval(settings=SamplingSettings(max_new_tokens, 0.0, 1.0, 0), samples=1, **common)
    sampled_results = None
    if samples > 0:
        sampled_results = run_eval(
            settings=SamplingSettings(max_new_tokens, temperature, top_p, 0), samples=samples, **common
        )
    return EvalReport(settings, greedy_results, sampled_results, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------ comparison


def metric_direction(name: str) -> int:
    """+1 if higher is better, -1 if lower is better, 0 if neither (e.g. length)."""
    if name in _DIRECTION:
        return _DIRECTION[name]
    tail = name.split("/", 1)[1] if name.startswith("sampled/") else name
    return _DIRECTION.get(tail, 1)


def verdict(lo: float, hi: float, direction: int = 1) -> str:
    """better / worse / indistinguishable for an interval [lo, hi] of B - A. For a metric with no
    preferred direction (direction 0) the words are higher / lower / indistinguishable."""
    if lo > 0:
        return "better" if direction > 0 else "worse" if direction < 0 else "higher"
    if hi < 0:
        return "worse" if direction > 0 else "better" if direction < 0 else "lower"
    return "indistinguishable"


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean of b - a, lo, hi): percentile bootstrap interval of the mean paired difference, resampling
    problems (pairs) together."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    lo, hi = percentile_interval(bootstrap_means(d[None, :], resamples, seed), level)
    mean = float(d.mean())
    return mean, float(min(lo[0], mean)), float(max(hi[0], mean))


def _as_report(x: EvalReport | Mapping[str, Any], name: str) -> EvalReport:
    return x if isinstance(x, EvalReport) else EvalReport.from_json(x, name)


def compare_results(
    a: EvalReport | Mapping[str, Any],
    b: EvalReport | Mapping[str, Any],
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired comparison of B against A over the same problems, for every metric both have.

    Returns {"level", "problems", "metrics": {name: {"a", "b", "diff", "ci": [lo, hi], "verdict"}},
    "only_in_a", "only_in_b", "setting_differences"}. `a`, `b` are reports or their JSON. Raises
    ComparisonError if the problem lists differ."""
    ra, rb = _as_report(a, "A"), _as_report(b, "B")
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
    common = [m for m in ta if m in tb]
    draws = bootstrap_means(np.stack([tb[m] - ta[m] for m in common]), resamples, seed) if common else None
    metrics: dict[str, dict[str, Any]] = {}
    if draws is not None:
        lo, hi = percentile_interval(draws, level)
        for j, m in enumerate(common):
            diff = float((tb[m] - ta[m]).mean())
            lo_j, hi_j = float(min(lo[j], diff)), float(max(hi[j], diff))
            metrics[m] = {
                "a": float(ta[m].mean()),
                "b": float(tb[m].mean()),
                "diff": diff,
                "ci": [lo_j, hi_j],
                "verdict": verdict(lo_j, hi_j, metric_direction(m)),
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


# ---------------------------------------------------------------------------------------------- gates

GateOp = Literal[">=", ">", "<=", "<", "=="]
_GATE_RE = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][\w@/]*?)(?:\.(?P<bound>lo|hi))?\s*(?P<op>>=|<=|==|>|<)\s*(?P<rhs>[^<>=\s].*?)\s*$"
)
_UNSIGNED = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_RHS_RE = re.compile(rf"^(?:(?P<const>[+-]?{_UNSIGNED})|base(?:(?P<sign>[+-])(?P<offset>{_UNSIGNED}))?)$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda v, t: v >= t,
    ">": lambda v, t: v > t,
    "<=": lambda v, t: v <= t,
    "<": lambda v, t: v < t,
    "==": lambda v, t: math.isclose(v, t, rel_tol=0.0, abs_tol=1e-9),
}


@dataclass(frozen=True)
class Gate:
    """`metric[.lo|.hi] OP (NUMBER | base | base+NUMBER | base-NUMBER)`."""

    text: str
    metric: str
    bound: Literal["value", "lo", "hi"]
    op: GateOp
    number: float  # the threshold, or the offset added to the baseline's value when `relative`
    relative: bool


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    value: float
    threshold: float
    passed: bool

    def describe(self) -> str:
        what = self.gate.metric + ("" if self.gate.bound == "value" else f".{self.gate.bound}")
        return f"{'PASS' if self.passed else 'FAIL'} {self.gate.text}: {what} = {self.value:.4g}, threshold {self.threshold:.4g}"


def parse_gate(expr: str) -> Gate:
    """Parse a gate such as `accuracy>=0.45`, `pass@4>0.6`, `accuracy.lo>=0.4` (the lower end of the 95%
    interval), or `accuracy>=base-0.01` (the same metric in a baseline result, minus 0.01). Operators:
    >=, >, <=, <, == (equal within 1e-9). Raises GateError saying what is wrong."""
    m = _GATE_RE.match(expr)
    if m is None:
        raise GateError(
            f"cannot parse gate {expr!r}: write METRIC OP VALUE, e.g. 'accuracy>=0.45', 'pass@4>0.6', "
            "'accuracy.lo>=0.4' or 'accuracy>=base-0.01', with OP one of >=, >, <=, <, == "
            "(quote it in the shell: --gate 'accuracy>=0.45')"
        )
    rhs = _RHS_RE.match(m.group("rhs").replace(" ", ""))
    if rhs is None:
        raise GateError(
            f"gate {expr!r}: the right-hand side {m.group('rhs')!r} must be a number (0.45), 'base', "
            "'base+NUMBER' or 'base-NUMBER'"
        )
    if rhs.group("const") is not None:
        number, relative = float(rhs.group("const")), False
    else:
        offset = float(rhs.group("offset") or 0.0)
        number, relative = (-offset if rhs.group("sign") == "-" else offset), True
    return Gate(expr.strip(), m.group("metric"), m.group("bound") or "value", m.group("op"), number, relative)  # type: ignore[arg-type]


def _metrics_of(results: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = results.get("metrics")
    return inner if isinstance(inner, Mapping) else results


def _metric_number(metrics: Mapping[str, Any], name: str, bound: str, where: str) -> float:
    if name not in metrics:
        available = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float, Mapping))))
        raise GateError(f"gate metric {name!r} is not in {where}; available: {available}")
    entry = metrics[name]
    if isinstance(entry, Mapping):
        if bound == "value":
            return float(entry["value"])
        ci = entry.get("ci95", entry.get("ci"))
        if ci is None:
            raise GateError(f"gate on {name}.{bound}: {where} has no interval for {name}")
        return float(ci[0] if bound == "lo" else ci[1])
    if bound != "value":
        raise GateError(f"gate on {name}.{bound}: {where} has no interval for {name}")
    return float(entry)


def check_gate(
    gate: Gate | str, results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> GateResult:
    """Evaluate a gate against results (an eval summary/JSON with "metrics", or a flat {name: value or
    {"value", "ci95"}} mapping). `base` refers to the same metric's value in `baseline`."""
    g = parse_gate(gate) if isinstance(gate, str) else gate
    value = _metric_number(_metrics_of(results), g.metric, g.bound, "the results")
    if g.relative:
        if baseline is None:
            raise GateError(
                f"gate {g.text!r} compares with 'base' but no baseline was given (--baseline FILE.json)"
            )
        threshold = _metric_number(_metrics_of(baseline), g.metric, "value", "the baseline") + g.number
    else:
        threshold = g.number
    return GateResult(g, value, threshold, _OPS[g.op](value, threshold))


def check_gates(
    gates: Sequence[Gate | str], results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> list[GateResult]:
    return [check_gate(g, results, baseline) for g in gates]


# ------------------------------------------------------------------------------------------ perplexity


@dataclass
class PerplexityResult:
    """Perplexity exp(total NLL / total scored tokens) with a bootstrap interval over texts."""

    nll: np.ndarray  # [N] summed negative log-likelihood (nats) of each text's scored tokens
    tokens: np.ndarray  # [N] scored tokens per text
    source: str = ""
    skipped: int = 0  # texts (or problems without a checkable reference) left out

    def to_json(
        self, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
    ) -> dict[str, Any]:
        num, den = self.nll.astype(np.float64), self.tokens.astype(np.float64)
        draws = bootstrap_means(np.stack([num, den]), resamples, seed)  # [R, 2]
        ratio = draws[:, 0] / np.maximum(draws[:, 1], 1e-12)  # [R] nll per token
        lo, hi = percentile_interval(ratio, level)
        nll_tok = float(num.sum() / max(den.sum(), 1.0))
        lo, hi = min(float(lo), nll_tok), max(float(hi), nll_tok)
        return {
            "schema": SCHEMA,
            "mode": "perplexity",
            "source": self.source,
            "texts": len(self.nll),
            "tokens": int(den.sum()),
            "skipped": self.skipped,
            "metrics": {
                "perplexity": {"value": math.exp(nll_tok), "ci95": [math.exp(lo), math.exp(hi)]},
                "nll/token": {"value": nll_tok, "ci95": [lo, hi]},
            },
        }


def sequence_nll(
    model: PreTrainedModel,
    items: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int = 0,
    batch_size: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """For (context ids, target ids) pairs: the summed -log p(target | context) in nats and the number of
    target tokens. Context must be non-empty (the first token has nothing to be predicted from)."""
    import torch

    device = next(model.parameters()).device
    nll = np.zeros(len(items))
    counts = np.array([len(t) for _, t in items], dtype=np.int64)
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]) + len(items[i][1]))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        seqs = [list(items[i][0]) + list(items[i][1]) for i in idx]
        if any(not items[i][0] for i in idx):
            raise ValueError("sequence_nll needs a non-empty context for every item")
        T = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), T), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
            attn[r, : len(s)] = 1
        with torch.no_grad():
            logits = model(
                input_ids=ids.to(device), attention_mask=attn.to(device)
            ).logits.float()  # [B, T, V]
        for r, i in enumerate(idx):
            c, t = len(items[i][0]), len(items[i][1])
            # logits at position j predict token j + 1: the target tokens c..c+t-1 come from c-1..c+t-2
            logp = torch.log_softmax(logits[r, c - 1 : c - 1 + t], dim=-1)  # [t, V]
            target = torch.tensor(items[i][1], dtype=torch.long, device=device)  # [t]
            nll[i] = -float(logp.gather(-1, target[:, None]).double().sum())
    return nll, counts


def perplexity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    batch_size: int = 8,
    max_tokens: int | None = None,
    source: str = "texts",
) -> PerplexityResult:
    """Perplexity of `model` on `texts`. Each text is scored from its start: after BOS when the tokenizer
    has one, else from its second token. Texts longer than `max_tokens` (default: the model's
    max_position_embeddings) are cut; empty texts are skipped."""
    limit = max_tokens or int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    bos = tokenizer.bos_token_id
    items: list[tuple[list[int], list[int]]] = []
    skipped = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:limit]
        ctx, tgt = ([bos], ids[: limit - 1]) if bos is not None else (ids[:1], ids[1:])
        if not tgt:
            skipped += 1
            continue
        items.append((ctx, tgt))
    if not items:
        raise ConfigError(
            f"no text with at least {1 if bos is not None else 2} tokens to measure perplexity on"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    nll, counts = sequence_nll(model, items, int(pad), batch_size)
    return PerplexityResult(nll, counts, source, skipped)


def reference_answer(task: Task, problem: Mapping[str, Any]) -> str | None:
    """A known-correct answer: the problem's "reference" when it has one; for countdown the solver's
    expression; for multiply the product."""
    if "reference" in problem:
        return str(problem["reference"])
    if task.name == "countdown":
        from keelrl.tasks.countdown import solve

        return solve(list(problem["numbers"]), int(problem["target"]))
    if task.name == "multiply":
        return str(int(problem["a"]) * int(problem["b"]))
    return None


def reference_completion(task: Task, problem: Mapping[str, Any], assistant_prefix: str) -> str | None:
    """The completion (text after the prompt's assistant prefix) that states the reference answer in the
    task's format, checked by the task's own scorer: the first of `ANSWER</answer>` (after a prefix ending
    in `<answer>`), `</think>\\n<answer>ANSWER</answer>`, `<answer>ANSWER</answer>`, a ```python fenced
    block, and ANSWER verbatim that scores as correct. None when there is no reference or none scores."""
    answer = reference_answer(task, problem)
    if answer is None:
        return None
    candidates = []
    if assistant_prefix.rstrip().endswith("<answer>"):
        candidates.append(f"{answer}</answer>")
    candidates += [
        f"</think>\n<answer>{answer}</answer>",
        f"<answer>{answer}</answer>",
        f"```python\n{answer.strip()}\n```",
        answer,
    ]
    for completion in candidates:
        if task.score(dict(problem), assistant_prefix + completion).correct:
            return completion
    return None


def reference_perplexity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    template: Template,
    num_problems: int,
    split: str = "test",
    batch_size: int = 8,
) -> PerplexityResult:
    """Perplexity of the reference completions (see `reference_completion`, followed by EOS) given each
    problem's rendered prompt; only completion tokens are scored. Problems without a checkable reference
    are skipped (counted in `skipped`); none at all is a ConfigError."""
    from keelrl.rollout import render_prompt

    items: list[tuple[list[int], list[int]]] = []
    skipped = 0
    eos = tokenizer.eos_token_id
    for i in range(num_problems):
        problem = task.problem(split, i)  # type: ignore[arg-type]
        prompt = task.prompt(problem, template)
        completion = reference_completion(task, problem, prompt.assistant_prefix)
        if completion is None:
            skipped += 1
            continue
        target = tokenizer(completion, add_special_tokens=False)["input_ids"] + (
            [eos] if eos is not None else []
        )
        items.append((render_prompt(tokenizer, prompt, template), target))
    if not items:
        raise ConfigError(
            f"task {task.name!r} has no reference solutions keelrl can check for its first {num_problems} {split} "
            "problems; measure perplexity on a text file instead (--perplexity FILE)"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    nll, counts = sequence_nll(model, items, int(pad), batch_size)
    return PerplexityResult(nll, counts, f"{task.name} references", skipped)


# ------------------------------------------------------------------------------------------- display


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 1000 else f"{x:.1f}"


def render_summary(summary: Mapping[str, Any]) -> list[Any]:
    """Rich renderables for an eval summary (or perplexity result): the metric table and the difficulty
    breakdown."""
    from rich import box
    from rich.table import Table

    s = summary.get("settings", {})
    if summary.get("mode") == "perplexity":
        title = f"perplexity on {summary.get('source', '')}: {summary.get('texts')} texts, {summary.get('tokens')} tokens"
    else:
        passes = []
        if s.get("greedy"):
            passes.append("greedy")
        if s.get("samples"):
            passes.append(f"{s['samples']} samples at T={s.get('temperature')}")
        title = (
            f"{s.get('model', '')} on {s.get('task', '')}: {summary.get('problems')} problems "
            f"({' + '.join(passes)}), {summary.get('problems_per_s', 0.0):.2f} problems/s"
        )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI", justify="right")
    for name, m in summary.get("metrics", {}).items():
        lo, hi = m["ci95"]
        table.add_row(name, _fmt(m["value"]), f"[{_fmt(lo)}, {_fmt(hi)}]")
    out: list[Any] = [table]
    buckets = summary.get("by_difficulty", {})
    if len(buckets) > 1:
        names = [n for n in summary["metrics"] if n == "accuracy" or n.startswith(("pass@", "maj@"))]
        names = names[:1] + ([n for n in names if n.startswith("pass@")][-1:] if len(names) > 1 else [])
        by = Table(title="by difficulty", title_justify="left", box=box.SIMPLE_HEAD)
        by.add_column("bucket")
        by.add_column("problems", justify="right")
        for n in names:
            by.add_column(f"{n} [95% CI]", justify="right")
        for bucket, b in buckets.items():
            cells = []
            for n in names:
                m = b["metrics"][n]
                cells.append(f"{_fmt(m['value'])} [{_fmt(m['ci95'][0])}, {_fmt(m['ci95'][1])}]")
            by.add_row(bucket, str(b["problems"]), *cells)
        out.append(by)
    if summary.get("score_errors"):
        from rich.text import Text

        out.append(
            Text(
                f"{summary['score_errors']} completion(s) scored 0 because the task's checker raised; "
                f"the first: {summary.get('first_score_error', '?')}",
                style="yellow",
            )
        )
    return out


def render_comparison(comparison: Mapping[str, Any], name_a: str = "A", name_b: str = "B") -> list[Any]:
    """Rich renderables for a `compare_results` dict: one row per metric with the verdict word."""
    from rich import box
    from rich.table import Table

    level = comparison["level"]
    table = Table(
        title=f"B = {name_b} vs A = {name_a}: paired over {comparison['problems']} problems, {level:.0%} intervals",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for col, just in (
        ("metric", "left"),
        ("A", "right"),
        ("B", "right"),
        ("B - A", "right"),
        ("CI", "right"),
        ("verdict", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    colours = {"better": "green", "worse": "red"}
    for name, m in comparison["metrics"].items():
        lo, hi = m["ci"]
        word = m["verdict"]
        table.add_row(
            name, _fmt(m["a"]), _fmt(m["b"]), f"{m['diff']:+.4f}", f"[{lo:+.3f}, {hi:+.3f}]",
            f"[{colours[word]}]{word}[/]" if word in colours else word,
        )  # fmt: skip
    out: list[Any] = [table]
    notes = []
    if comparison.get("only_in_a") or comparison.get("only_in_b"):
        notes.append(
            f"not compared (only in one result): {', '.join(comparison.get('only_in_a', []) + comparison.get('only_in_b', []))}"
        )
    for key, (va, vb) in comparison.get("setting_differences", {}).items():
        notes.append(f"settings differ: {key} = {va!r} (A) vs {vb!r} (B)")
    out += notes
    return out
