"""Which problems to train on next.

A problem source hands the trainer the next `n` train problems, learns from how each group went (`observe`),
and keeps its state JSON-serialisable in `TrainState.curriculum`, so a resumed run sees the same problems.
- `SequentialSource`: train problems in index order (`curriculum.kind = "sequential"`).
- `AdaptiveSource` (`"adaptive"`): each prompt comes from a difficulty bucket (`task.buckets()`, easiest
  first; a mixture's are "<member>/<bucket>"). A bucket's pass rate is a Beta(1, 1) posterior over counts
  discounted by `decay` per step (it follows the improving policy; a bucket left alone drifts back to 0.5 and
  is probed again). Bucket weights are a function of it (`strategy`): learnability p(1-p) puts prompts where
  groups most likely disagree (arXiv 2504.03380, 2502.12272; docs/curriculum.md), so a saturated bucket
  yields to the next harder one; a `revisit` share is uniform over buckets. Prompts are allocated by
  systematic sampling (floor or ceil of n x weight), seeded by (train.seed, draw number), then shuffled.
  With `skip_after`, repeating problems (code) that went all-solved or all-failed `skip_after` times in a
  row are skipped (predict-and-skip; arXiv 2506.02177 does it probabilistically).
- `fill_batch`: DAPO dynamic sampling. Groups with equal rewards are replaced by groups of new prompts within
  a budget; when it runs out, dropped groups (advantage 0) complete the batch so its shape never changes.

Departures, stated: DAPO keeps drawing until the batch is full (bounded by a number of generation batches);
here each refill round draws about shortfall / (share of groups with signal so far) prompts, capped by the
budget, and informative groups beyond the batch are discarded (their outcomes still update the curriculum).
Informative means any reward variance, not accuracy variance: reward variance is what gives an advantage.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from keelrl.config import CurriculumConfig
from keelrl.core.seeds import stable_hash
from keelrl.tasks import Task
from keelrl.tasks.base import task_buckets
from keelrl.tasks.mixture import TaskMixture

ALL = "all"  # the one bucket of a task that cannot draw problems by difficulty
PRIOR = (1.0, 1.0)  # Beta prior of every bucket's pass rate


@dataclass(frozen=True)
class GroupOutcome:
    """How one prompt's group went: what a curriculum learns from."""

    problem: dict[str, Any]
    rewards: tuple[float, ...]
    correct: tuple[bool, ...]

    @property
    def informative(self) -> bool:
        """The rewards differ, so group-baseline advantages are not all zero."""
        return has_signal(self.rewards)


def has_signal(rewards: Sequence[float]) -> bool:
    return len(rewards) > 1 and max(rewards) != min(rewards)


class ProblemSource(Protocol):
    def next_problems(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        """The next n (index, problem) pairs (global, before sharding by rank)."""
        ...

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        """Every group generated this step (all ranks, after scoring); called once per step."""
        ...

    def metrics(self) -> dict[str, float]:
        """`curriculum/...` metrics of the step last observed."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def make_source(task: Task, cfg: CurriculumConfig, seed: int) -> ProblemSource:
    """The problem source `curriculum.kind` asks for."""
    if cfg.kind == "adaptive":
        return AdaptiveSource(task, cfg, seed)
    return SequentialSource(task)


def _check_kind(state: dict[str, Any], kind: str) -> None:
    if state and state.get("kind", "sequential") != kind:
        raise ValueError(
            f"the checkpoint's curriculum state is of kind {state.get('kind')!r} but curriculum.kind is {kind!r}; "
            "resume with the original curriculum settings, or start a new run directory"
        )


class SequentialSource:
    """Train problems in index order (the generator is random, so this is uniform sampling)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.cursor = 0

    def next_problems(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        out = [(i, self.task.problem("train", i)) for i in range(self.cursor, self.cursor + n)]
        self.cursor += n
        return out

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "sequential", "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, "sequential")
        if state:
            self.cursor = int(state["cursor"])


def posterior_mean(successes: float, failures: float, prior: tuple[float, float] = PRIOR) -> float:
    """Mean of the Beta(prior[0] + successes, prior[1] + failures) posterior of a pass rate."""
    a, b = prior[0] + successes, prior[1] + failures
    return a / (a + b)


def bucket_score(p: float, strategy: str, band: tuple[float, float] = (0.2, 0.8)) -> float:
    """How much a bucket with estimated pass rate p is worth training on (>= 0)."""
    if strategy == "learnability":
        return p * (1.0 - p)
    if strategy == "band":
        low, high = band
        if p < low:
            return p / low
        if p > high:
            return (1.0 - p) / (1.0 - high)
        return 1.0
    if strategy == "uniform":
        return 1.0
    raise ValueError(f"unknown curriculum strategy {strategy!r} (learnability, band, uniform)")


def sampling_weights(
    scores: dict[str, float],
    task_of: dict[str, str],
    task_weights: dict[str, float],
    mixture: str = "fixed",
    revisit: float = 0.0,
) -> dict[str, float]:
    """Bucket -> probability of drawing it. fixed: member t keeps its share task_weights[t], split over its
    buckets by score (evenly if all are 0); adaptive: task_weights[t] x score, normalised over all buckets.
    Then a `revisit` share is spread over every bucket (each member's share evenly over its buckets)."""
    members: dict[str, list[str]] = {}
    for b in scores:
        members.setdefault(task_of[b], []).append(b)
    share = {t: task_weights[t] / sum(task_weights[m] for m in members) for t in members}
    even = {b: share[task_of[b]] / len(members[task_of[b]]) for b in scores}
    raw: dict[str, float] = {}
    if mixture == "adaptive":
        raw = {b: share[task_of[b]] * scores[b] for b in scores}
    else:
        for t, bs in members.items():
            total = sum(scores[b] for b in bs)
            for b in bs:
                raw[b] = share[t] * scores[b] / total if total > 0 else even[b]
    total = sum(raw.values())
    base = {b: raw[b] / total for b in scores} if total > 0 else even
    return {b: (1.0 - revisit) * base[b] + revisit * even[b] for b in scores}


def systematic_counts(weights: Sequence[float], n: int, u: float) -> list[int]:
    """Systematic sampling, offset u in [0, 1): bucket i gets floor(n w_i) or ceil(n w_i), summing to n."""
    total = sum(weights)
    if n <= 0:
        return [0] * len(weights)
    if total <= 0:
        raise ValueError("sampling weights are all zero")
    edges = list(itertools.accumulate(w / total for w in weights))  # cumulative shares
    edges[-1] = 1.0 + 1e-12
    counts = [0] * len(weights)
    for i in range(n):
        counts[bisect.bisect_right(edges, (u + i) / n)] += 1
    return counts


def problem_key(problem: dict[str, Any]) -> str:
    """A short stable key for a problem (its id when it has one, else a hash of its JSON)."""
    if "id" in problem:
        return f"{problem.get('task', '')}:{problem['id']}"
    return format(stable_hash(json.dumps(problem, sort_keys=True, separators=(",", ":"))), "016x")


class AdaptiveSource:
    """Adaptive curriculum (module docstring); every choice is seeded by (seed, draw number)."""

    def __init__(self, task: Task, cfg: CurriculumConfig, seed: int) -> None:
        self.task, self.cfg, self.seed = task, cfg, seed
        ladder = task_buckets(task)
        self.bucketed = ladder is not None
        self.buckets = ladder if ladder is not None else [ALL]
        if not self.buckets:
            raise ValueError(
                f"task {task.name} lists no difficulty buckets; use curriculum.kind = 'sequential'"
            )
        if isinstance(task, TaskMixture):
            self.task_weights: dict[str, float] = task.weights()
            self.task_of = {b: task.label_of(b) for b in self.buckets}
        else:
            self.task_weights = {task.name: 1.0}
            self.task_of = {b: task.name for b in self.buckets}
        self.draws = 0  # calls of next_problems: seeds each draw
        self.serial = 0  # problems handed out: the index each one gets
        self.cursor = {b: 0 for b in self.buckets}  # next problem index within each bucket
        self.stats = {b: [0.0, 0.0] for b in self.buckets}  # discounted (correct, wrong) samples
        self.problems: dict[str, list[int]] = {}  # key -> [correct samples, samples, streak]
        self._drawn: Counter[str] = Counter()  # prompts per bucket since the last observe
        self._skipped = 0  # problems skipped since the last observe
        self._last: dict[str, float] = {}

    def pass_rates(self) -> dict[str, float]:
        return {b: posterior_mean(s, f) for b, (s, f) in self.stats.items()}

    def weights(self) -> dict[str, float]:
        """Bucket -> probability of drawing it next."""
        c = self.cfg
        scores = {
            b: bucket_score(p, c.strategy, (c.band_low, c.band_high)) for b, p in self.pass_rates().items()
        }
        return sampling_weights(scores, self.task_of, self.task_weights, c.mixture, c.revisit)

    def arm_of(self, problem: dict[str, Any]) -> str:
        bucket = self.task.difficulty(problem) if self.bucketed else ALL
        if bucket not in self.stats:
            raise ValueError(
                f"task {self.task.name}: difficulty {bucket!r} of an observed problem is not one of its buckets "
                f"({', '.join(self.buckets)})"
            )
        return bucket

    def predicted_no_signal(self, problem: dict[str, Any]) -> bool:
        """The problem went all-solved or all-failed in each of its last `skip_after` groups."""
        if not self.cfg.skip_after:
            return False
        record = self.problems.get(problem_key(problem))
        return record is not None and abs(record[2]) >= self.cfg.skip_after

    def _draw(self, bucket: str) -> dict[str, Any]:
        index = self.cursor[bucket]
        self.cursor[bucket] += 1
        if not self.bucketed:
            return self.task.problem("train", index)
        problem = self.task.problem_in(bucket, "train", index)  # type: ignore[attr-defined]
        if self.task.difficulty(problem) != bucket:
            raise ValueError(
                f"task {self.task.name}: problem_in({bucket!r}) returned a problem whose difficulty() is "
                f"{self.task.difficulty(problem)!r}; the two must agree"
            )
        return problem

    def next_problems(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        weights = self.weights()
        rng = random.Random(stable_hash("curriculum", self.seed, self.draws))
        self.draws += 1
        counts = systematic_counts([weights[b] for b in self.buckets], n, rng.random())
        arms = [b for b, k in zip(self.buckets, counts) for _ in range(k)]
        rng.shuffle(arms)
        # bounded, so a bucket of nothing but solved problems cannot stall the draw
        skips_left = 4 * n if self.cfg.skip_after else 0
        out = []
        for bucket in arms:
            problem = self._draw(bucket)
            while skips_left > 0 and self.predicted_no_signal(problem) and rng.random() >= self.cfg.revisit:
                skips_left -= 1
                self._skipped += 1
                problem = self._draw(bucket)
            out.append((self.serial, problem))
            self.serial += 1
            self._drawn[bucket] += 1
        return out

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        d = self.cfg.decay
        self.stats = {b: [s * d, f * d] for b, (s, f) in self.stats.items()}
        seen: dict[str, list[int]] = {}
        for o in outcomes:
            bucket = self.arm_of(o.problem)
            k, n = sum(o.correct), len(o.correct)
            self.stats[bucket][0] += k
            self.stats[bucket][1] += n - k
            counts = (k, n, 1, int(not o.informative))  # correct, samples, groups, groups without signal
            seen[bucket] = [a + b for a, b in zip(seen.get(bucket, [0, 0, 0, 0]), counts)]
            if self.cfg.skip_after:
                self._remember(problem_key(o.problem), k, n)
        self._last = self._metrics(seen)
        self._drawn, self._skipped = Counter(), 0

    def _remember(self, key: str, k: int, n: int) -> None:
        record = self.problems.pop(key, [0, 0, 0])  # re-inserted last: the dict's order is recency
        streak = 0  # a group with signal ends the run
        if k == n:
            streak = max(record[2], 0) + 1  # all solved: a run counting up from 1
        elif k == 0:
            streak = min(record[2], 0) - 1  # all failed: counting down from -1
        self.problems[key] = [record[0] + k, record[1] + n, streak]
        while len(self.problems) > self.cfg.max_tracked_problems:
            del self.problems[next(iter(self.problems))]

    def _metrics(self, seen: dict[str, list[int]]) -> dict[str, float]:
        out: dict[str, float] = {}
        weights = self.weights()
        for b, p in self.pass_rates().items():
            out[f"curriculum/pass_rate/{b}"] = p
            out[f"curriculum/weight/{b}"] = weights[b]
            out[f"curriculum/prompts/{b}"] = float(self._drawn[b])
            if b in seen and seen[b][1]:
                out[f"curriculum/accuracy/{b}"] = seen[b][0] / seen[b][1]
                out[f"curriculum/no_signal/{b}"] = seen[b][3] / seen[b][2]
        out["curriculum/skipped_prompts"] = float(self._skipped)
        if self.cfg.skip_after:
            out["curriculum/tracked_problems"] = float(len(self.problems))
        return out

    def metrics(self) -> dict[str, float]:
        return dict(self._last)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "adaptive",
            "draws": self.draws,
            "serial": self.serial,
            "cursor": dict(self.cursor),
            "stats": {b: list(v) for b, v in self.stats.items()},
            "problems": {k: list(v) for k, v in self.problems.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, "adaptive")
        if not state:
            return
        unknown = sorted(set(state["cursor"]) - set(self.buckets))
        if unknown:
            raise ValueError(
                f"the checkpoint's curriculum has buckets {', '.join(unknown)} that task {self.task.name} does not "
                f"list ({', '.join(self.buckets)}); resume with the original task parameters"
            )
        self.draws, self.serial = int(state["draws"]), int(state["serial"])
        self.cursor.update({b: int(i) for b, i in state["cursor"].items()})
        self.stats.update({b: [float(s), float(f)] for b, (s, f) in state["stats"].items()})
        self.problems = {k: [int(x) for x in v] for k, v in state.get("problems", {}).items()}


def task_metrics(outcomes: Sequence[GroupOutcome]) -> dict[str, float]:
    """`task/<member>/{accuracy,reward/mean,share}` over every group generated this step, for problems of a
    task mixture (they carry their member's label under "task"); {} for a single task."""
    by_task: dict[str, list[GroupOutcome]] = {}
    for o in outcomes:
        if "task" in o.problem:
            by_task.setdefault(str(o.problem["task"]), []).append(o)
    out: dict[str, float] = {}
    total = sum(len(v) for v in by_task.values())
    for name, groups in sorted(by_task.items()):
        samples = [(r, c) for g in groups for r, c in zip(g.rewards, g.correct)]
        n = max(len(samples), 1)  # the samples with a reward (none when every one of this task's failed)
        out[f"task/{name}/accuracy"] = sum(c for _, c in samples) / n
        out[f"task/{name}/reward/mean"] = sum(r for r, _ in samples) / n
        out[f"task/{name}/share"] = len(groups) / total
    return out


G = TypeVar("G")


@dataclass
class RefillStats:
    """What dynamic sampling did in one step (counts are this rank's groups; prompts drawn are global)."""

    first_groups: int = 0  # groups of the first draw
    first_no_signal: int = 0  # of those, groups without reward variance
    dropped: int = 0  # groups without reward variance, over all rounds
    regenerated: int = 0  # extra prompts drawn to refill (global)
    rounds: int = 0  # refill rounds (one generation call each)
    surplus: int = 0  # informative groups beyond the batch, discarded
    filled_degenerate: int = 0  # dropped groups put back because the budget ran out
    exhausted: bool = False  # the budget ran out before the batch was full of informative groups

    def metrics(self) -> dict[str, float]:
        return {
            "curriculum/dropped_groups": float(self.dropped),
            "curriculum/regenerated_groups": float(self.regenerated),
            "curriculum/refill_rounds": float(self.rounds),
            "curriculum/surplus_groups": float(self.surplus),
            "curriculum/filled_degenerate_groups": float(self.filled_degenerate),
            "curriculum/budget_exhausted": float(self.exhausted),
            "curriculum/first_no_signal_frac": self.first_no_signal / max(1, self.first_groups),
        }


@dataclass
class Refill(Generic[G]):
    batch: list[G]  # exactly `need` groups: informative ones first
    generated: list[G]  # every group generated (first draw and refills), in order: for the curriculum
    stats: RefillStats


def fill_batch(
    groups: list[G],
    need: int,
    draw: Callable[[int, int], list[G]],
    informative: Callable[[G], bool],
    budget: int,
    world_size: int = 1,
    reduce_max: Callable[[int], int] = lambda x: x,
    reduce_sum: Callable[[int], int] = lambda x: x,
    min_rate: float = 0.125,
) -> Refill[G]:
    """Dynamic sampling: keep the informative groups among `groups` (this rank's `need` groups) and refill
    with `draw(n_global, round)` (draws n_global prompts, returns this rank's n_global / world_size groups,
    generated and scored) until every rank has `need` informative groups or `budget` extra prompts (global)
    were drawn (the share of informative groups is floored at min_rate). Terminates: every round spends at
    least world_size prompts. reduce_max / reduce_sum combine a per-rank integer over ranks, so every rank
    takes the same decisions and the problem source stays identical everywhere."""
    stats = RefillStats(first_groups=len(groups))
    kept = [g for g in groups if informative(g)]
    degenerate = [g for g in groups if not informative(g)]
    stats.first_no_signal = stats.dropped = len(degenerate)
    generated = list(groups)
    drawn_global = reduce_sum(len(groups))
    good_global = reduce_sum(len(kept))
    budget_left = budget
    while True:
        short = reduce_max(max(0, need - len(kept)))
        if short == 0:
            break
        rate = max(good_global / max(1, drawn_global), min_rate)
        per_rank = min(math.ceil(short / rate), budget_left // world_size)
        if per_rank <= 0:
            stats.exhausted = True
            break
        new = draw(per_rank * world_size, stats.rounds + 1)
        stats.rounds += 1
        stats.regenerated += per_rank * world_size
        budget_left -= per_rank * world_size
        generated.extend(new)
        fresh = [g for g in new if informative(g)]
        kept.extend(fresh)
        degenerate.extend(g for g in new if not informative(g))
        stats.dropped += len(new) - len(fresh)
        drawn_global += reduce_sum(len(new))
        good_global += reduce_sum(len(fresh))
    stats.surplus = max(0, len(kept) - need)
    batch = kept[:need]
    if len(batch) < need:
        stats.filled_degenerate = need - len(batch)
        batch.extend(degenerate[: stats.filled_degenerate])
    return Refill(batch, generated, stats)


def refill_budget_prompts(refill_budget: float, prompts_per_step: int, world_size: int) -> int:
    """curriculum.refill_budget as a count of prompts, rounded down to a multiple of the world size."""
    return int(refill_budget * prompts_per_step) // world_size * world_size
