"""The curriculum: bucket statistics and weights (worked numbers), the adaptive source (favours p ~ 0.5,
climbs as buckets saturate, revisits, deterministic given its state, predict-and-skip), dynamic-sampling
refill (bounded, gives up and says so), task mixtures, and the tasks' difficulty buckets."""

from __future__ import annotations

import json
import random
import re
import threading
from collections import Counter
from typing import Any

import pytest

from keelrl.config import ConfigError, CurriculumConfig, config_from_dict
from keelrl.curriculum.sources import (
    AdaptiveSource,
    GroupOutcome,
    SequentialSource,
    bucket_score,
    fill_batch,
    has_signal,
    make_source,
    posterior_mean,
    problem_key,
    refill_budget_prompts,
    sampling_weights,
    systematic_counts,
    task_metrics,
)
from keelrl.tasks import TaskError, get_task
from keelrl.tasks.base import BucketedTask, Prompt, Score, task_buckets
from keelrl.tasks.countdown import solve

G = 8


class LadderTask:
    """Three buckets e0 < e1 < e2; problem i of a bucket is {"b", "i"} (i modulo `repeat` when problems
    repeat). Scoring is never called: tests feed outcomes directly."""

    name = "ladder"

    def __init__(self, repeat: int = 0) -> None:
        self.repeat = repeat

    def buckets(self) -> list[str]:
        return ["e0", "e1", "e2"]

    def problem_in(self, bucket: str, split: str, index: int) -> dict[str, Any]:
        return {"b": bucket, "i": index % self.repeat if self.repeat else index, "split": split}

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return self.problem_in(self.buckets()[index % 3], split, index)

    def prompt(self, problem: dict[str, Any], template: str) -> Prompt:
        return Prompt("", str(problem), "")

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        return Score(0.0, False)

    def difficulty(self, problem: dict[str, Any]) -> str:
        return problem["b"]


def outcome(problem: dict[str, Any], k: int, n: int = G) -> GroupOutcome:
    """A group of n samples, the first k correct (reward 1) and the rest wrong (reward 0)."""
    return GroupOutcome(problem, tuple([1.0] * k + [0.0] * (n - k)), tuple([True] * k + [False] * (n - k)))


def simulate(
    source: AdaptiveSource, true_rate: dict[str, float], steps: int, n: int = 16, seed: int = 0
) -> Counter:
    """Draw n prompts per step, sample each group's correct count from the bucket's true pass rate, observe.
    Returns prompts drawn per bucket."""
    rng = random.Random(seed)
    drawn: Counter = Counter()
    for _ in range(steps):
        outcomes = []
        for _, problem in source.next_problems(n):
            drawn[problem["b"]] += 1
            outcomes.append(outcome(problem, sum(rng.random() < true_rate[problem["b"]] for _ in range(G))))
        source.observe(outcomes)
    return drawn


def adaptive(**kw: Any) -> CurriculumConfig:
    return CurriculumConfig(kind="adaptive", **kw)


# ---------------------------------------------------------------------------------------- pure math


def test_posterior_mean_worked_numbers() -> None:
    assert posterior_mean(0, 0) == 0.5  # Beta(1, 1) prior
    assert posterior_mean(3, 1) == pytest.approx(4 / 6)
    assert posterior_mean(0, 8) == pytest.approx(1 / 10)
    assert posterior_mean(8, 0, prior=(2.0, 2.0)) == pytest.approx(10 / 12)


def test_bucket_scores() -> None:
    assert bucket_score(0.5, "learnability") == 0.25
    assert bucket_score(0.9, "learnability") == pytest.approx(0.09)
    assert bucket_score(0.0, "learnability") == 0.0 == bucket_score(1.0, "learnability")
    assert bucket_score(0.5, "band") == 1.0 == bucket_score(0.2, "band") == bucket_score(0.8, "band")
    assert bucket_score(0.1, "band") == pytest.approx(0.5)  # halfway from 0 to the band's low edge
    assert bucket_score(0.9, "band") == pytest.approx(0.5)
    assert bucket_score(0.99, "uniform") == 1.0
    with pytest.raises(ValueError, match="unknown curriculum strategy"):
        bucket_score(0.5, "greedy")


def test_sampling_weights_single_task_worked_numbers() -> None:
    scores = {"a": 0.25, "b": 0.09, "c": 0.0}
    one = {b: "t" for b in scores}
    w = sampling_weights(scores, one, {"t": 1.0})
    assert w["a"] == pytest.approx(0.25 / 0.34) and w["b"] == pytest.approx(0.09 / 0.34) and w["c"] == 0.0
    w = sampling_weights(scores, one, {"t": 1.0}, revisit=0.3)
    assert w["c"] == pytest.approx(0.1)  # the revisit share, spread evenly
    assert w["a"] == pytest.approx(0.7 * 0.25 / 0.34 + 0.1)
    assert sum(w.values()) == pytest.approx(1.0)
    zero = sampling_weights({"a": 0.0, "b": 0.0}, {"a": "t", "b": "t"}, {"t": 1.0})
    assert zero == {"a": 0.5, "b": 0.5}  # nothing learnable anywhere: even


def test_sampling_weights_mixtures_fixed_and_adaptive() -> None:
    scores = {"x/1": 0.25, "x/2": 0.0, "y/1": 0.01}
    task_of = {"x/1": "x", "x/2": "x", "y/1": "y"}
    fixed = sampling_weights(scores, task_of, {"x": 3.0, "y": 1.0}, "fixed")
    assert fixed == pytest.approx(
        {"x/1": 0.75, "x/2": 0.0, "y/1": 0.25}
    )  # member shares kept whatever the scores
    adapt = sampling_weights(scores, task_of, {"x": 3.0, "y": 1.0}, "adaptive")
    assert adapt["y/1"] == pytest.approx(
        0.25 * 0.01 / (0.75 * 0.25 + 0.25 * 0.01)
    )  # y barely learnable: few prompts
    revisit = sampling_weights(scores, task_of, {"x": 3.0, "y": 1.0}, "fixed", revisit=0.2)
    assert revisit["x/2"] == pytest.approx(0.2 * 0.75 / 2)  # x's revisit share split over x's two buckets


@pytest.mark.parametrize("seed", range(20))
def test_systematic_counts_are_floor_or_ceil(seed: int) -> None:
    rng = random.Random(seed)
    weights = [rng.random() for _ in range(rng.randint(1, 6))]
    n = rng.randint(1, 40)
    counts = systematic_counts(weights, n, rng.random())
    assert sum(counts) == n
    for w, c in zip(weights, counts):
        exact = n * w / sum(weights)
        assert int(exact) <= c <= int(exact) + 1
    assert systematic_counts([0.5, 0.0, 0.5], 4, 0.3) == [2, 0, 2]  # zero weight: never drawn
    with pytest.raises(ValueError, match="all zero"):
        systematic_counts([0.0, 0.0], 3, 0.5)


def test_problem_key() -> None:
    assert problem_key({"id": "fib", "task": "code", "prompt": "..."}) == "code:fib"
    a = problem_key({"numbers": [1, 2], "target": 3})
    assert a == problem_key({"target": 3, "numbers": [1, 2]}) and len(a) == 16
    assert a != problem_key({"numbers": [2, 1], "target": 3})


# ------------------------------------------------------------------------------------ adaptive source


def test_posterior_tracks_observed_outcomes_with_decay() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(decay=0.5), seed=0)
    e1 = {"b": "e1", "i": 0}
    source.observe([outcome(e1, 6), outcome(e1, 2)])  # 8 of 16 correct
    assert source.pass_rates()["e1"] == pytest.approx(9 / 18)
    assert source.metrics()["curriculum/no_signal/e1"] == 0.0
    source.observe([outcome(e1, 0), outcome(e1, 3), outcome(e1, 8)])  # two of three groups all-equal
    assert source.metrics()["curriculum/no_signal/e1"] == pytest.approx(2 / 3)
    source = AdaptiveSource(LadderTask(), adaptive(decay=0.5), seed=0)
    source.observe([outcome(e1, 6), outcome(e1, 2)])
    source.observe([outcome(e1, 8)])  # old evidence halves: 4 + 8 correct, 4 wrong
    assert source.stats["e1"] == [12.0, 4.0]
    assert source.pass_rates()["e1"] == pytest.approx(13 / 18)
    assert source.pass_rates()["e0"] == 0.5  # unseen: the prior
    m = source.metrics()
    assert m["curriculum/pass_rate/e1"] == pytest.approx(13 / 18)
    assert m["curriculum/accuracy/e1"] == 1.0 and "curriculum/accuracy/e0" not in m
    assert sum(m[f"curriculum/weight/{b}"] for b in ("e0", "e1", "e2")) == pytest.approx(1.0)


def test_weights_favour_buckets_near_half() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(revisit=0.1), seed=0)
    drawn = simulate(source, {"e0": 0.97, "e1": 0.5, "e2": 0.02}, steps=12)
    w = source.weights()
    assert w["e1"] > 0.6 and w["e1"] > 3 * w["e0"] and w["e1"] > 3 * w["e2"]
    assert drawn["e1"] > drawn["e0"] + drawn["e2"]


def test_climbs_to_harder_buckets_as_easier_ones_saturate() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(revisit=0.1, decay=0.8), seed=0)
    simulate(source, {"e0": 0.5, "e1": 0.05, "e2": 0.0}, steps=10)
    assert max(source.weights(), key=source.weights().get) == "e0"
    # the policy improved: e0 is solved, e1 is now half-solved
    late = simulate(source, {"e0": 1.0, "e1": 0.5, "e2": 0.05}, steps=15, seed=1)
    assert max(source.weights(), key=source.weights().get) == "e1"
    simulate(source, {"e0": 1.0, "e1": 1.0, "e2": 0.5}, steps=15, seed=2)
    assert max(source.weights(), key=source.weights().get) == "e2"
    assert late["e0"] > 0  # solved buckets are still revisited now and then


def test_revisit_keeps_solved_and_hopeless_buckets_in_the_mix() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(revisit=0.15), seed=0)
    drawn = simulate(source, {"e0": 1.0, "e1": 0.5, "e2": 0.0}, steps=30)
    assert drawn["e0"] >= 0.03 * 30 * 16 and drawn["e2"] >= 0.03 * 30 * 16
    never = AdaptiveSource(LadderTask(), adaptive(revisit=0.0, decay=1.0), seed=0)
    simulate(never, {"e0": 1.0, "e1": 0.5, "e2": 0.0}, steps=30)
    late = simulate(never, {"e0": 1.0, "e1": 0.5, "e2": 0.0}, steps=5)
    assert late["e1"] / sum(late.values()) > 0.85  # without revisiting, nearly everything goes to e1


def test_first_draw_probes_every_bucket_and_indices_are_unique() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(), seed=0)
    drawn = source.next_problems(9)
    assert Counter(p["b"] for _, p in drawn) == {"e0": 3, "e1": 3, "e2": 3}  # all at the prior: even
    assert [i for i, _ in drawn] == list(range(9))
    more = source.next_problems(3)
    assert [i for i, _ in more] == [9, 10, 11]
    assert sorted(p["i"] for _, p in drawn if p["b"] == "e0") == [0, 1, 2]  # a cursor per bucket
    assert all(p["split"] == "train" for _, p in drawn + more)


def test_deterministic_given_state_and_json_roundtrip() -> None:
    a = AdaptiveSource(LadderTask(), adaptive(skip_after=2), seed=7)
    simulate(a, {"e0": 0.9, "e1": 0.4, "e2": 0.1}, steps=5)
    saved = json.loads(json.dumps(a.state_dict()))  # what a checkpoint stores
    b = AdaptiveSource(LadderTask(), adaptive(skip_after=2), seed=7)
    b.load_state_dict(saved)
    assert b.state_dict() == a.state_dict()
    assert b.weights() == a.weights()
    assert simulate(a, {"e0": 0.9, "e1": 0.4, "e2": 0.1}, 4, seed=3) == simulate(
        b, {"e0": 0.9, "e1": 0.4, "e2": 0.1}, 4, seed=3
    )
    assert a.state_dict() == b.state_dict()
    other = AdaptiveSource(LadderTask(), adaptive(skip_after=2), seed=8)
    other.load_state_dict(saved)
    assert [p for _, p in other.next_problems(16)] != [p for _, p in a.next_problems(16)]  # the seed matters


def test_state_errors_are_clear() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(), seed=0)
    with pytest.raises(ValueError, match=re.escape("of kind 'sequential' but curriculum.kind is 'adaptive'")):
        source.load_state_dict({"kind": "sequential", "cursor": 4})
    with pytest.raises(ValueError, match="buckets e9 that task ladder does not list"):
        source.load_state_dict({**source.state_dict(), "cursor": {"e9": 1}})
    seq = SequentialSource(LadderTask())
    with pytest.raises(ValueError, match="of kind 'adaptive'"):
        seq.load_state_dict(source.state_dict())
    seq.load_state_dict({})  # a fresh run
    assert seq.cursor == 0


def test_make_source_and_tasks_without_buckets() -> None:
    assert isinstance(make_source(LadderTask(), CurriculumConfig(), 0), SequentialSource)

    class Plain:  # the Task protocol only: no buckets()
        name = "plain"
        prompt, score = LadderTask.prompt, LadderTask.score

        def problem(self, split: str, index: int) -> dict[str, Any]:
            return {"i": index, "split": split}

        def difficulty(self, problem: dict[str, Any]) -> str:
            return "medium"

    plain = Plain()
    assert task_buckets(plain) is None
    source = make_source(plain, adaptive(), 0)
    assert isinstance(source, AdaptiveSource) and source.buckets == ["all"]
    drawn = source.next_problems(4)
    assert [p for _, p in drawn] == [plain.problem("train", i) for i in range(4)]
    source.observe([outcome(p, 4) for _, p in drawn])
    assert source.pass_rates() == {"all": pytest.approx(17 / 34)}


def test_problem_in_must_agree_with_difficulty() -> None:
    class Liar(LadderTask):
        def difficulty(self, problem: dict[str, Any]) -> str:
            return "e0"

    source = AdaptiveSource(Liar(), adaptive(), seed=0)
    with pytest.raises(ValueError, match="difficulty\\(\\) is 'e0'; the two must agree"):
        source.next_problems(9)


def test_predict_and_skip_problems_that_always_go_one_way() -> None:
    task = LadderTask(repeat=2)  # each bucket has two problems, i = 0 and 1, drawn alternately
    source = AdaptiveSource(task, adaptive(skip_after=2, revisit=0.0, strategy="uniform"), seed=0)
    solved = {"b": "e0", "i": 0, "split": "train"}
    source.observe([outcome(solved, G), outcome(solved, G)])  # all solved twice in a row
    assert source.predicted_no_signal(solved)
    assert not source.predicted_no_signal({"b": "e0", "i": 1, "split": "train"})
    drawn = [p for _, p in source.next_problems(30)]
    assert solved not in drawn
    source.observe([outcome(solved, 3)])  # a mixed group breaks the streak
    assert source.metrics()["curriculum/skipped_prompts"] > 0
    assert not source.predicted_no_signal(solved)


def test_predict_and_skip_is_bounded_when_everything_is_predictable() -> None:
    task = LadderTask(repeat=1)  # one problem per bucket
    source = AdaptiveSource(task, adaptive(skip_after=1, revisit=0.0), seed=0)
    source.observe([outcome(task.problem_in(b, "train", 0), 0) for b in task.buckets()])
    drawn = source.next_problems(10)  # every problem is predicted to fail: skipping must give up, not spin
    assert len(drawn) == 10
    source.observe([])
    assert source.metrics()["curriculum/skipped_prompts"] == 40  # the skip budget, 4 per prompt


def test_problem_table_is_bounded_least_recent_first() -> None:
    source = AdaptiveSource(LadderTask(), adaptive(skip_after=1, max_tracked_problems=3), seed=0)
    problems = [{"b": "e0", "i": i} for i in range(5)]
    source.observe([outcome(p, 1) for p in problems])
    assert list(source.problems) == [problem_key(p) for p in problems[2:]]
    source.observe([outcome(problems[2], 1), outcome(problems[0], 1)])  # 2 is refreshed, 0 comes back, 3 goes
    assert list(source.problems) == [problem_key(p) for p in (problems[4], problems[2], problems[0])]


# ------------------------------------------------------------------------------------ dynamic sampling


def groups(pattern: str) -> list[str]:
    """'i' = informative group, 'd' = degenerate; each group is its letter plus a serial number."""
    return [f"{c}{i}" for i, c in enumerate(pattern)]


def test_has_signal() -> None:
    assert has_signal([0.0, 0.1]) and not has_signal([1.0, 1.0]) and not has_signal([0.5])


def test_refill_replaces_degenerate_groups() -> None:
    calls = []

    def draw(n: int, attempt: int) -> list[str]:
        calls.append((n, attempt))
        return [f"i-new{attempt}-{k}" for k in range(n)]

    r = fill_batch(groups("iddi"), 4, draw, lambda g: g.startswith("i"), budget=8)
    assert r.batch == ["i0", "i3", "i-new1-0", "i-new1-1"]
    assert calls == [(4, 1)]  # shortfall 2 / informative share 0.5 = 4 prompts
    s = r.stats
    assert (s.dropped, s.regenerated, s.rounds, s.surplus, s.filled_degenerate, s.exhausted) == (
        2,
        4,
        1,
        2,
        0,
        False,
    )
    assert r.generated[:4] == groups("iddi") and len(r.generated) == 8
    m = s.metrics()
    assert m["curriculum/regenerated_groups"] == 4.0 and m["curriculum/dropped_groups"] == 2.0
    assert m["curriculum/budget_exhausted"] == 0.0 and m["curriculum/first_no_signal_frac"] == 0.5


def test_refill_not_needed() -> None:
    r = fill_batch(
        groups("iii"), 3, lambda n, a: pytest.fail("must not draw"), lambda g: g[0] == "i", budget=6
    )
    assert r.batch == groups("iii") and r.stats.rounds == 0 and not r.stats.exhausted


def test_refill_gives_up_after_the_budget_when_every_group_is_degenerate() -> None:
    drawn = []

    def draw(n: int, attempt: int) -> list[str]:
        drawn.append(n)
        return [f"d-{attempt}-{k}" for k in range(n)]

    r = fill_batch(groups("dddd"), 4, draw, lambda g: g.startswith("i"), budget=10)
    assert sum(drawn) == 10 and len(drawn) <= 10  # bounded by the budget, whatever happens
    assert r.stats.exhausted and r.stats.regenerated == 10
    assert len(r.batch) == 4 and r.stats.filled_degenerate == 4  # the batch keeps its shape
    assert r.stats.metrics()["curriculum/budget_exhausted"] == 1.0
    assert r.stats.dropped == 14 and len(r.generated) == 14


def test_refill_with_no_budget_only_reports() -> None:
    r = fill_batch(
        groups("did"), 3, lambda n, a: pytest.fail("must not draw"), lambda g: g[0] == "i", budget=0
    )
    assert r.stats.exhausted and r.batch == ["i1", "d0", "d2"] and r.stats.filled_degenerate == 2


def test_refill_over_two_ranks_takes_the_same_decisions() -> None:
    """Two ranks in threads, exchanging through a barrier like all_gather: rank 0 is short by 1, rank 1 by 3.
    Both draw the same global prompt lists (multiples of the world size) and both end with full batches."""
    barrier, slots = threading.Barrier(2), [0, 0]

    def gather(rank: int, x: int) -> list[int]:
        slots[rank] = x
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    def run_rank(rank: int, first: str, results: dict[int, Any]) -> None:
        calls = []

        def draw(n: int, attempt: int) -> list[str]:
            calls.append(n)
            global_list = [("i" if k % 3 else "d") + f"{attempt}-{k}" for k in range(n)]  # 2 in 3 informative
            return global_list[rank * n // 2 : (rank + 1) * n // 2]

        results[rank] = (
            fill_batch(
                groups(first),
                4,
                draw,
                lambda g: g[0] == "i",
                budget=16,
                world_size=2,
                reduce_max=lambda x: max(gather(rank, x)),
                reduce_sum=lambda x: sum(gather(rank, x)),
            ),
            calls,
        )

    results: dict[int, Any] = {}
    threads = [threading.Thread(target=run_rank, args=(r, f, results)) for r, f in ((0, "iiid"), (1, "iddd"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    (r0, calls0), (r1, calls1) = results[0], results[1]
    assert calls0 == calls1 and all(n % 2 == 0 for n in calls0)
    assert r0.stats.regenerated == r1.stats.regenerated and r0.stats.rounds == r1.stats.rounds
    assert all(g[0] == "i" for g in r0.batch + r1.batch) and len(r0.batch) == len(r1.batch) == 4
    assert not r0.stats.exhausted and not r1.stats.exhausted
    assert refill_budget_prompts(2.0, 16, 1) == 32 and refill_budget_prompts(1.5, 5, 2) == 6


# --------------------------------------------------------------------------------------------- mixtures

MIX = {
    "tasks": [
        {"task": "countdown", "params": {"min_numbers": 2, "max_numbers": 3, "max_number": 20}, "weight": 3},
        {"task": "multiply", "params": {"digits_a": 2, "digits_b": 2}, "name": "mul"},
    ]
}


def test_mixture_problems_prompts_and_scores() -> None:
    mix = get_task("mixture", seed=1, **MIX)
    problems = [mix.problem("train", i) for i in range(400)]
    share = Counter(p["task"] for p in problems)
    assert set(share) == {"countdown", "mul"} and 0.68 < share["countdown"] / 400 < 0.82
    assert problems == [mix.problem("train", i) for i in range(400)]  # deterministic
    cd = next(p for p in problems if p["task"] == "countdown")
    mul = next(p for p in problems if p["task"] == "mul")
    assert mix.prompt(mul, "compact").user == f"{mul['a']}*{mul['b']}"
    good_cd = f"<answer>{solve(cd['numbers'], cd['target'])}</answer>"
    good_mul = f"<answer>{mul['a'] * mul['b']}</answer>"
    scores = mix.score_many([cd, mul, mul], [good_cd, good_mul, "<answer>1</answer>"])
    assert [s.reward for s in scores] == [1.0, 1.0, 0.1]
    assert mix.score(mul, good_mul).correct
    assert mix.difficulty(mul) == "mul/2x2" and mix.difficulty(cd) in ("countdown/n2", "countdown/n3")
    assert mix.buckets() == ["countdown/n2", "countdown/n3", "mul/1x1", "mul/2x1", "mul/2x2"]
    p = mix.problem_in("mul/1x1", "test", 0)
    assert p["task"] == "mul" and p["a"] < 10 and mix.difficulty(p) == "mul/1x1"
    with pytest.raises(ValueError, match="no difficulty bucket 'mul/3x3'"):
        mix.problem_in("mul/3x3", "train", 0)


def test_mixture_parameter_errors() -> None:
    with pytest.raises(TaskError, match="repeat"):
        get_task("mixture", tasks=[{"task": "multiply"}, {"task": "multiply"}])
    with pytest.raises(TaskError, match="tasks"):
        get_task("mixture", tasks=[])
    with pytest.raises(TaskError, match="unknown task 'countdwn'"):
        get_task("mixture", tasks=[{"task": "countdwn"}])
    with pytest.raises(TaskError, match="weight"):
        get_task("mixture", tasks=[{"task": "multiply", "weight": 0}])


def test_adaptive_source_on_a_mixture_fixed_vs_adaptive_shares() -> None:
    true_rate = {"countdown/n2": 0.5, "countdown/n3": 0.3, "mul/1x1": 1.0, "mul/2x1": 0.0, "mul/2x2": 0.0}

    def run(mode: str) -> Counter:
        source = AdaptiveSource(get_task("mixture", **MIX), adaptive(mixture=mode, revisit=0.0), seed=0)
        rng, drawn = random.Random(0), Counter()
        for _ in range(20):
            outs = []
            for _, p in source.next_problems(20):
                b = source.arm_of(p)
                drawn[p["task"]] += 1
                outs.append(outcome(p, sum(rng.random() < true_rate[b] for _ in range(G))))
            source.observe(outs)
        return drawn

    fixed, adapt = run("fixed"), run("adaptive")
    assert fixed["mul"] / sum(fixed.values()) == pytest.approx(0.25, abs=0.03)  # the configured share
    assert (
        adapt["mul"] / sum(adapt.values()) < 0.1
    )  # nothing learnable in mul: adaptive moves its prompts away


def test_task_metrics() -> None:
    outs = [
        outcome({"task": "a", "x": 1}, 8),
        outcome({"task": "a", "x": 2}, 0),
        outcome({"task": "b", "x": 3}, 2),
    ]
    m = task_metrics(outs)
    assert m["task/a/accuracy"] == 0.5 and m["task/b/accuracy"] == 0.25
    assert m["task/a/share"] == pytest.approx(2 / 3) and m["task/b/reward/mean"] == 0.25
    assert task_metrics([outcome({"x": 1}, 3)]) == {}  # a single task: the usual `accuracy` says it all


# ----------------------------------------------------------------------------------- task difficulty


def test_countdown_buckets() -> None:
    task = get_task("countdown", seed=3, min_numbers=2, max_numbers=4, max_number=12)
    assert isinstance(task, BucketedTask) and task.buckets() == ["n2", "n3", "n4"]
    for bucket in task.buckets():
        train = [task.problem_in(bucket, "train", i) for i in range(60)]
        test = [task.problem_in(bucket, "test", i) for i in range(30)]
        assert all(task.difficulty(p) == bucket for p in train + test)
        assert train == [task.problem_in(bucket, "train", i) for i in range(60)]  # deterministic
        assert {tuple(sorted(p["numbers"])) for p in train}.isdisjoint(
            tuple(sorted(p["numbers"])) for p in test
        )
        assert all(solve(p["numbers"], p["target"]) for p in train[:10])  # solvable by construction
    with pytest.raises(ValueError, match="no difficulty bucket 'n5'"):
        task.problem_in("n5", "train", 0)


def test_multiply_ladder() -> None:
    assert get_task("multiply").buckets() == ["1x1", "2x1", "2x2", "3x2", "3x3"]
    assert get_task("multiply", digits_a=3, digits_b=2).buckets() == ["1x1", "2x1", "2x2", "3x2"]
    assert get_task("multiply", digits_a=1, digits_b=3).buckets() == ["1x1", "1x2", "1x3"]
    assert get_task("multiply", digits_a=4, digits_b=4, min_digits=3).buckets() == ["3x3", "4x3", "4x4"]
    task = get_task("multiply", seed=2, digits_a=3, digits_b=2)
    for bucket in task.buckets():
        train = [task.problem_in(bucket, "train", i) for i in range(40)]
        test = [task.problem_in(bucket, "test", i) for i in range(5)]
        assert all(task.difficulty(p) == bucket for p in train + test)
        assert {tuple(sorted((p["a"], p["b"]))) for p in train}.isdisjoint(
            tuple(sorted((p["a"], p["b"]))) for p in test
        )
    with pytest.raises(TaskError, match="min_digits=5 is above"):
        get_task("multiply", min_digits=5)


def test_code_task_buckets() -> None:
    task = get_task("code")
    assert task.buckets() == ["easy", "medium", "hard"]
    for bucket in task.buckets():
        size = sum(1 for p in task.splits["train"] if p.get("difficulty") == bucket)
        first_pass = [task.problem_in(bucket, "train", i)["id"] for i in range(size)]
        assert len(set(first_pass)) == size  # each problem once per pass, then they repeat
        assert all(task.difficulty(task.problem_in(bucket, "train", i)) == bucket for i in range(2 * size))
        test_ids = {p["id"] for p in task.splits["test"]}
        assert test_ids.isdisjoint(first_pass)


# -------------------------------------------------------------------------------------------- config


def test_curriculum_config_errors() -> None:
    with pytest.raises(ConfigError, match=re.escape("band_low=0.8 must be below curriculum.band_high=0.5")):
        config_from_dict({"curriculum": {"kind": "adaptive", "band_low": 0.8, "band_high": 0.5}})
    with pytest.raises(ConfigError, match=re.escape("need curriculum.kind='adaptive'")):
        config_from_dict({"curriculum": {"skip_after": 2}})
    with pytest.raises(ConfigError, match=r"curriculum\.kind"):
        config_from_dict({"curriculum": {"kind": "smart"}})
    cfg = config_from_dict(
        {"curriculum": {"kind": "adaptive", "dynamic_sampling": True, "refill_budget": 1.5}}
    )
    assert cfg.curriculum.refill_budget == 1.5
