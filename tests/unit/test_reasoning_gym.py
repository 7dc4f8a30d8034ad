"""reasoning-gym adapter: reference answers score 1 and wrong ones do not, the checker's failures score 0,
problems are deterministic JSON with disjoint splits, params reach the generator, and the curriculum levels
are the difficulty buckets."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("reasoning_gym")

from keelrl.tasks import Task, TaskError
from keelrl.tasks.base import THINK_PREFIX, BucketedTask, in_test_split, task_buckets
from keelrl.tasks.reasoning_gym import ReasoningGymTask, difficulty_name

DATASETS = ["basic_arithmetic", "chain_sum", "leg_counting", "products"]


def inline(dataset: str, **params: object) -> ReasoningGymTask:
    """Checkers in this process (timeout_s=0): the checker process has its own tests below."""
    return ReasoningGymTask(dataset, timeout_s=0, **params)


@pytest.mark.parametrize("dataset", DATASETS)
def test_reference_answers_are_correct_and_wrong_answers_are_not(dataset: str) -> None:
    task = inline(dataset)
    assert task.name == f"reasoning_gym:{dataset}"
    assert isinstance(task, Task) and isinstance(task, BucketedTask)
    for split in ("train", "test"):
        for i in range(5):
            p = task.problem(split, i)
            ref = task.reference_answer(p)
            assert ref is not None and ref == p["answer"]
            for good in (f"<answer>{ref}</answer>", f"<think>hmm</think>\n<answer> {ref}\n</answer>"):
                s = task.score(p, good)
                assert (s.reward, s.correct, s.info["reason"], s.info["formatted"]) == (
                    1.0,
                    True,
                    "correct",
                    True,
                )
            for bad in ("<answer>wrong</answer>", f"<answer>{ref}1</answer>", "<answer></answer>"):
                s = task.score(p, bad)
                assert s.reward < 1.0 and not s.correct and s.info["formatted"]
            s = task.score(p, f"the answer is {ref}")
            assert (s.reward, s.correct, s.info) == (0.0, False, {"formatted": False, "reason": "no_answer"})
            assert task.score(p, f"<answer>{ref}").reward == 0.0  # unclosed


def test_partial_credit_is_the_checkers_value_and_never_correct() -> None:
    p = inline("chain_sum").problem("train", 0)
    padded = (
        f"<answer>x {p['answer']}</answer>"  # contains the answer: reasoning-gym's default partial credit
    )
    strict, partial = (
        inline("chain_sum").score(p, padded),
        inline("chain_sum", partial_credit=True).score(p, padded),
    )
    assert (strict.reward, strict.correct, strict.info["reason"]) == (0.0, False, "partial")
    assert 0.0 < partial.reward < 1.0 and not partial.correct
    assert partial.reward == strict.info["checker_score"]


def test_problems_are_deterministic_json() -> None:
    a, b = inline("leg_counting", seed=3), inline("leg_counting", seed=3)
    for split in ("train", "test"):
        for i in (0, 1, 999, 1000, 12345):
            p = a.problem(split, i)
            assert p == b.problem(split, i) and json.loads(json.dumps(p)) == p
    assert a.problem_in("L2", "train", 7) == b.problem_in("L2", "train", 7)
    other = inline("leg_counting", seed=4)
    assert [other.problem("train", i)["question"] for i in range(5)] != [
        a.problem("train", i)["question"] for i in range(5)
    ]
    assert a.problem("train", 0)["source"] != a.problem("train", 1000)["source"]  # a new generator per pass


@pytest.mark.parametrize("params", [{}, {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}])
def test_splits_are_disjoint_by_question(params: dict[str, int]) -> None:
    task = inline("chain_sum", params=params, test_fraction=0.3)
    train = {task.problem("train", i)["question"] for i in range(400)}
    test = {task.problem("test", i)["question"] for i in range(150)}
    assert train and test and not train & test
    assert all(in_test_split(q, 0, 0.3) for q in test) and not any(in_test_split(q, 0, 0.3) for q in train)
    for bucket in ("L0", "L1"):
        train = {task.problem_in(bucket, "train", i)["question"] for i in range(100)}
        test = {task.problem_in(bucket, "test", i)["question"] for i in range(50)}
        assert not train & test


def test_params_reach_the_generator() -> None:
    default = inline("chain_sum").problem("train", 0)
    five = inline("chain_sum", params={"min_terms": 5, "max_terms": 5, "min_digits": 2, "max_digits": 2})
    problems = [five.problem("train", i) for i in range(20)]
    assert all(p["metadata"]["num_terms"] == 5 for p in problems)
    assert all(len(p["metadata"]["expression"].split()) == 9 for p in problems)  # 5 numbers, 4 operators
    assert five.difficulty(problems[0]) == "5,2" and inline("chain_sum").difficulty(default) == "2-6,1-4"
    assert problems[0]["question"] != default["question"]


def test_wrong_params_and_unknown_datasets_say_what_is_allowed() -> None:
    with pytest.raises(TaskError, match=r"did you mean chain_sum.*\bchain_sum\b.*reasoning_gym:<dataset>"):
        ReasoningGymTask("chain_summ")
    with pytest.raises(TaskError, match=r"bad params .*takes: .*min_terms"):
        inline("chain_sum", params={"min_termz": 2})
    with pytest.raises(TaskError, match=r"params\.seed is set by the task"):
        inline("chain_sum", params={"seed": 1})
    with pytest.raises(TaskError, match="invalid params"):
        inline("chain_sum", params={"min_terms": 0})
    with pytest.raises(ValueError, match="extra"):  # the task's own parameters: get_task's ValidationError
        inline("chain_sum", partial=True)


def test_curriculum_levels_are_the_buckets() -> None:
    task = inline("chain_sum")
    assert task.buckets() == [f"L{k}" for k in range(11)] == task_buckets(task)
    for level, terms in ((0, 2), (3, 5)):
        for split in ("train", "test"):
            p = task.problem_in(f"L{level}", split, 4)
            assert task.difficulty(p) == f"L{level}" and p["metadata"]["num_terms"] == terms
            assert task.score(p, f"<answer>{p['answer']}</answer>").correct
    assert inline("chain_sum", max_level=2).buckets() == ["L0", "L1", "L2"]
    # min_level: the ladder starts higher (a curriculum benchmark's hardest bucket alone), same problems per level
    hard = inline("chain_sum", min_level=2, max_level=2)
    assert hard.buckets() == ["L2"] and hard.problem_in("L2", "test", 3) == task.problem_in("L2", "test", 3)
    with pytest.raises(TaskError, match="min_level 20 is above its highest level, 10"):
        inline("chain_sum", min_level=20).buckets()
    with pytest.raises(ValueError, match="no difficulty bucket 'L11'"):
        task.problem_in("L11", "train", 0)
    # a level that cannot generate is an error naming it (spell_backward L4 wants 11-letter words), and the fix
    with pytest.raises(
        TaskError, match=r"level L4 cannot produce problems .*; set task.params.max_level = 3"
    ):
        inline("spell_backward").buckets()
    assert inline("spell_backward", max_level=3).buckets() == ["L0", "L1", "L2", "L3"]
    # a dataset without a curriculum has the one bucket "all"
    acre = inline("acre", size=50)
    assert acre.buckets() == ["all"]
    assert acre.difficulty(acre.problem_in("all", "train", 3)) == "all"


def test_difficulty_names_are_short() -> None:
    assert difficulty_name({"difficulty": {"num_terms": (2, 6), "num_digits": (3, 3)}}) == "2-6,3"
    assert difficulty_name({"difficulty": 1.0}) == "1" and difficulty_name({}) == "all"
    assert len(difficulty_name({"difficulty": {"w": [0.125] * 20}})) <= 40


def test_prompts() -> None:
    task = inline("chain_sum")
    p = task.problem("train", 0)
    chat = task.prompt(p, "chat")
    assert chat.user.startswith(p["question"]) and "<answer> </answer>" in chat.user
    assert chat.assistant_prefix == THINK_PREFIX and chat.system
    terse = inline("chain_sum", think=False).prompt(p, "base")
    assert terse.assistant_prefix == "<answer>" and "<think>" not in terse.user
    compact = task.prompt(p, "compact")
    assert (compact.system, compact.user, compact.assistant_prefix) == ("", p["question"], "<answer>")
    assert task.score(p, f"{compact.assistant_prefix}{p['answer']}</answer>").correct


def test_scores_the_generators_own_entry_after_a_json_round_trip() -> None:
    # rearc's checker compares a tuple board; scored from JSON (lists) a right answer would get 0.05
    p = json.loads(json.dumps(inline("rearc").problem("train", 0)))
    assert (
        inline("rearc").score(p, f"<answer>{p['answer']}</answer>").reward == 1.0
    )  # a fresh task regenerates
    # without a usable source the stored question, answer and metadata are scored
    q = inline("chain_sum").problem("train", 0)
    for stale in (
        {k: v for k, v in q.items() if k != "source"},
        {**q, "source": {"level": None, "seed": 1, "index": 0}},
    ):
        assert inline("chain_sum").score(stale, f"<answer>{q['answer']}</answer>").correct


def test_checker_process_scores_and_survives_errors_and_hangs() -> None:
    task = ReasoningGymTask("chain_sum")  # default: checkers run in the helper process
    p = task.problem("train", 0)
    assert task.score(p, f"<answer>{p['answer']}</answer>").correct
    assert not task.score(p, "<answer>0.5</answer>").correct
    factor = ReasoningGymTask("prime_factorization")
    q = factor.problem("train", 0)
    s = factor.score(q, "<answer>zzz</answer>")  # its checker raises ValueError on this
    assert (s.reward, s.correct, s.info["reason"]) == (
        0.0,
        False,
        "checker_error",
    ) and "ValueError" in s.info["error"]
    assert inline("prime_factorization").score(q, "<answer>zzz</answer>").info["reason"] == "checker_error"
    sympy = ReasoningGymTask("simple_integration", timeout_s=1.0)
    r = sympy.problem("train", 0)
    start = time.monotonic()
    s = sympy.score(r, "<answer>9**9**9**9</answer>")  # sympy computes this power: it would never finish
    assert (s.reward, s.info["reason"]) == (0.0, "checker_timeout") and time.monotonic() - start < 10
    assert sympy.score(r, f"<answer>{r['answer']}</answer>").correct  # a new process takes over
    assert task.score(p, f"<answer>{p['answer']}</answer>").correct


def test_answerless_datasets_have_no_reference() -> None:
    task = inline("propositional_logic")
    p = task.problem("train", 0)
    assert p["answer"] is None and task.reference_answer(p) is None
    assert task.score(p, "<answer>P</answer>").reward < 1.0


def test_get_task_builds_it_by_name() -> None:
    from keelrl.tasks import get_task

    task = get_task("reasoning_gym:leg_counting", seed=2, timeout_s=0, params={"max_animals": 4})
    assert (
        task.name == "reasoning_gym:leg_counting" and task.problem("train", 0)["metadata"]["num_animals"] <= 4
    )
    with pytest.raises(TaskError, match="did you mean leg_counting"):
        get_task("reasoning_gym:leg_countin")
    with pytest.raises(TaskError, match=r"bad parameters for task 'reasoning_gym:leg_counting'.*size"):
        get_task("reasoning_gym:leg_counting", size=0)
