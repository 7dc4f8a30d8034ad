"""Countdown as a written search (tasks/countdown_search.py): traces end in answers the real Countdown checker
accepts, budgets make searches fail, the corpus reads only train problems, the behaviour parser gives exact
numbers on hand-written traces and zeros (never an exception) on garbage, and evaluation records the numbers
as `search/<name>` metrics."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from keelrl.evals.run import ProblemResult, behaviour_means, run_eval, summarize
from keelrl.tasks import get_task
from keelrl.tasks.countdown import Countdown, score_countdown
from keelrl.tasks.countdown_search import (
    GIVE_UP,
    STRATEGIES,
    CountdownSearch,
    behaviour,
    best_first,
    candidate_steps,
    packed_corpus_text,
    search_trace,
    trace_corpus_text,
)

PARAMS = {"min_numbers": 3, "max_numbers": 3, "min_number": 1, "max_number": 20, "max_target": 100}
PROBLEM = {"numbers": [3, 13, 7], "target": 46}
WORKED = "13+7=20:20+3=23 20-3=17 20*3=60\n13*3=39:39+7=46!\n<answer>(13*3)+7</answer>"


def test_worked_trace_gives_exact_numbers() -> None:
    b = behaviour(PROBLEM, WORKED)
    expected = {
        "correct": 1.0,
        "found": 1.0,
        "answered": 1.0,
        "verified": 1.0,  # the last operation before the answer states 46
        "gave_up": 0.0,
        "nodes": 6.0,  # 13+7, three checks, 13*3, one check
        "backtracks": 1.0,  # the second line returns to the top level after the dead end 13+7
        "arith_errors": 0.0,
        "arith_error_rate": 0.0,
        "any_arith_error": 0.0,
        "false_marks": 0.0,  # the one `!` is on 39+7=46
    }
    assert b == expected and list(b) == list(expected)  # the keys in this order too


def test_wrong_arithmetic_is_counted_per_stated_operation() -> None:
    text = "13+7=21:21+3=24 21-3=17\n13*3=39:39+7=46!\n<answer>(13*3)+7</answer>"
    b = behaviour(PROBLEM, text)
    # 13+7=21 is wrong (20); 21-3=17 is wrong (18); 21+3=24 is right given its operands
    assert (b["nodes"], b["arith_errors"]) == (5.0, 2.0)
    assert b["arith_error_rate"] == pytest.approx(2 / 5)
    assert b["any_arith_error"] == 1.0 and b["correct"] == 1.0


def test_a_wrong_step_to_the_target_is_not_found_and_an_unchecked_answer_is_not_verified() -> None:
    lied = "13+7=20:20+3=46!\n<answer>(13+7)+3</answer>"
    b = behaviour(PROBLEM, lied)
    assert (b["found"], b["verified"], b["correct"], b["arith_errors"]) == (0.0, 1.0, 0.0, 1.0)
    guessed = "13+7=20:20+3=23\n<answer>(13*3)+7</answer>"
    b = behaviour(PROBLEM, guessed)
    assert (b["correct"], b["verified"], b["found"]) == (1.0, 0.0, 0.0)


def test_give_up_and_four_number_nesting() -> None:
    gave_up = "13+7=20:20+3=23 20-3=17\n13-7=6:6*3=18\n?"
    b = behaviour(PROBLEM, gave_up)
    got = [b[k] for k in ("gave_up", "answered", "nodes", "backtracks", "correct")]
    assert got == [1.0, 0.0, 5.0, 1.0, 0.0]
    four = {"numbers": [20, 13, 7, 3], "target": 46}
    text = (
        "20-13=7|7 7 3\n 7+7=14:14+3=17 14*3=42\n 7*3=21:21+7=28\n20+13=33|33 7 3\n 33+7=40:40+3=43\n"
        " 33+3=36:36+7=43\n 7*3=21:33+21=54 33-21=12\n?"
    )
    b = behaviour(four, text)
    # lines at depth 0,1,1,0,1,1,1: returns to the same or a shallower level at lines 3, 4, 6, 7
    assert (b["nodes"], b["backtracks"], b["gave_up"]) == (14.0, 4.0, 1.0)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "?",
        "<answer></answer>",
        "1/0=5!",
        "99999999999*9=1",
        "\x00\n\n  :|!",
        "=" * 5000,
        "<answer>" * 100,
    ],
)
def test_garbage_gives_numbers_without_raising(garbage: str) -> None:
    b = behaviour(PROBLEM, garbage)
    assert set(b) == set(behaviour(PROBLEM, WORKED)) and b["correct"] == 0.0 and b["found"] == 0.0
    assert all(isinstance(v, float) for v in b.values())
    assert behaviour({}, garbage)["correct"] == 0.0  # a problem without fields too


def test_text_without_operations_is_all_zero() -> None:
    assert set(behaviour(PROBLEM, "hello world\nno ops here").values()) == {0.0}


def test_candidate_steps_are_positive_integers_larger_first() -> None:
    assert candidate_steps([6, 3]) == [(0, 1, "+", 9), (0, 1, "-", 3), (0, 1, "*", 18), (0, 1, "/", 2)]
    assert candidate_steps([3, 3]) == [(0, 1, "+", 6), (0, 1, "*", 9), (0, 1, "/", 1)]  # no 3-3=0


def test_best_first_tries_the_closest_state_first() -> None:
    steps = candidate_steps([13, 7, 3])
    first = best_first([13, 7, 3], steps, 46, random.Random(0))[0]
    assert first == (0, 2, "*", 39)  # leaves {39, 7}: 39 is 7 from 46, closer than any other state


@pytest.mark.parametrize("numbers", [3, 4])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_each_strategy_ends_solved_searches_with_a_correct_answer(strategy: str, numbers: int) -> None:
    task = Countdown(**{**PARAMS, "min_numbers": numbers, "max_numbers": numbers})
    solved = 0
    for i in range(60):
        p = task.problem("train", i)
        trace = search_trace(
            sorted(p["numbers"], reverse=True), p["target"], strategy, 10_000, random.Random(i)
        )
        if trace.endswith(GIVE_UP):
            continue
        solved += 1
        assert score_countdown(p["numbers"], p["target"], trace).correct, trace
        b = behaviour(p, trace)
        assert (b["correct"], b["found"], b["verified"], b["arith_errors"]) == (1.0, 1.0, 1.0, 0.0)
    assert solved >= 50  # pruning (results above 2x the target) loses a few solvable problems


def test_budgets_produce_failures() -> None:
    task = Countdown(**PARAMS)
    outcomes = []
    for i in range(100):
        p = task.problem("train", i)
        trace = search_trace(
            sorted(p["numbers"], reverse=True), p["target"], "dfs_random", 4, random.Random(i)
        )
        outcomes.append(score_countdown(p["numbers"], p["target"], trace).correct)
        assert behaviour(p, trace)["nodes"] <= 4
        if not outcomes[-1]:
            assert trace.endswith(GIVE_UP) and behaviour(p, trace)["gave_up"] == 1.0
    assert 10 < sum(outcomes) < 90


@dataclass
class Recorder:
    """A task that records which splits were read."""

    task: Countdown
    splits: set[str]

    def problem(self, split: str, index: int) -> dict[str, Any]:
        self.splits.add(split)
        return self.task.problem(split, index)  # type: ignore[arg-type]


def test_corpus_reads_only_train_problems() -> None:
    rec = Recorder(Countdown(**PARAMS), set())
    texts = [trace_corpus_text(rec, i, 0) for i in range(50)] + [
        packed_corpus_text(rec, i, 0) for i in range(5)
    ]
    assert rec.splits == {"train"}
    test_prompts = {
        " ".join(map(str, sorted(rec.task.problem("test", i)["numbers"], reverse=True))) for i in range(300)
    }
    prompts = {
        line.split(" -> ")[0] for t in texts for line in t.replace("<eos>", "\n").split("\n") if "->" in line
    }
    assert prompts and not prompts & test_prompts  # test number sets never occur in the corpus
    packed = packed_corpus_text(rec.task, 3, 0, 256)
    assert len(packed) <= 256 and packed.count("<eos>") >= 1


def test_task_delegates_to_countdown() -> None:
    task = get_task("countdown_search", **PARAMS)
    assert isinstance(task, CountdownSearch) and task.name == "countdown_search"
    base = Countdown(**PARAMS)
    p = task.problem("test", 3)
    assert p == base.problem("test", 3) and task.difficulty(p) == "n3" and task.buckets() == ["n3"]
    assert task.prompt(p, "compact") == base.prompt(p, "compact")
    assert task.score(PROBLEM, WORKED) == base.score(PROBLEM, WORKED)
    ref = task.reference_answer(p)
    assert ref is not None and task.score(p, ref).correct
    assert task.behaviour(PROBLEM, WORKED)["verified"] == 1.0


def test_a_mark_on_a_step_that_misses_the_target_is_a_false_mark() -> None:
    # true arithmetic, but marked as reaching the target when it does not (the SFT models' commonest failure)
    b = behaviour({"numbers": [1, 1, 3], "target": 6}, "3+1=4:4+1=5 4-1=3 4*1=4!\n<answer>(3+1)*1</answer>")
    assert (b["arith_errors"], b["false_marks"], b["correct"]) == (0.0, 1.0, 0.0)
    # "6-6=1!" for 36 is false twice: its arithmetic, and 1 is not the target
    b = behaviour({"numbers": [6, 6], "target": 36}, "6+6=12 6-6=1!\n<answer>6-6</answer>")
    assert (b["arith_errors"], b["false_marks"]) == (1.0, 1.0)
    # a mark on the target with a false result is an arithmetic error, not a false mark
    b = behaviour(PROBLEM, "13+7=20:20+3=46!\n<answer>(13+7)+3</answer>")
    assert (b["arith_errors"], b["false_marks"]) == (1.0, 0.0)


class TraceSampler:
    """Answers each compact prompt with its best-first search trace (a perfect searcher)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], settings: Any, seeds: list[int]) -> list[Any]:
        from keelrl.rollout import Generation

        out = []
        for ids in prompts:
            head, target = self.tok.decode(ids).strip().split(" -> ")
            trace = search_trace([int(x) for x in head.split()], int(target), "best_first", 10_000)
            got = self.tok(trace, add_special_tokens=False)["input_ids"][: settings.max_new_tokens - 1]
            out.append(Generation([*got, self.tok.eos_token_id], [-0.1] * (len(got) + 1), "eos"))
        return out

    def update_weights(self, weights: Any, version: int) -> None: ...


def test_eval_records_behaviour_and_summarize_reports_search_metrics() -> None:
    from keelrl.models.load import build_char_tokenizer
    from keelrl.rollout import SamplingSettings

    tok = build_char_tokenizer()
    task = get_task("countdown_search", **PARAMS)
    results = run_eval(TraceSampler(tok), tok, task, "compact", 8, SamplingSettings(400, 0.0, 1.0, 0))
    assert all(len(r.behaviour) == 1 for r in results)
    summary = summarize(results)
    solved = summary["accuracy"]
    assert solved >= 0.75 and summary["search/correct"] == solved == summary["search/found"]
    assert summary["search/arith_errors"] == 0.0 and summary["search/nodes"] > 1
    again = [ProblemResult.from_json(r.to_json()) for r in results]
    assert behaviour_means(again) == behaviour_means(results)
    plain = get_task("countdown", **PARAMS)  # a task without `behaviour`: no search/ metrics, no field
    results = run_eval(TraceSampler(tok), tok, plain, "compact", 2, SamplingSettings(400, 0.0, 1.0, 0))
    assert not any(k.startswith("search/") for k in summarize(results))
    assert "behaviour" not in results[0].to_json()


def test_behaviour_means_average_per_problem_then_over_problems() -> None:
    a = ProblemResult(0, {}, "n3", behaviour=[{"nodes": 2.0}, {"nodes": 4.0}])
    b = ProblemResult(1, {}, "n3", behaviour=[{"nodes": 9.0}])
    assert behaviour_means([a, b]) == {"search/nodes": 6.0}  # (3 + 9) / 2
    assert behaviour_means([a, ProblemResult(2, {}, "n3")]) == {}


def test_echoed_target_changes_the_text_not_the_numbers() -> None:
    task = Countdown(**PARAMS)
    for i in range(20):
        p = task.problem("train", i)
        nums = sorted(p["numbers"], reverse=True)
        plain = search_trace(nums, p["target"], "dfs_random", 20, random.Random(i))
        echoed = search_trace(nums, p["target"], "dfs_random", 20, random.Random(i), echo=True)
        lines = echoed.split("\n")[:-1]
        assert all(line.startswith(f"{p['target']}>") for line in lines)
        assert behaviour(p, echoed) == behaviour(p, plain)
