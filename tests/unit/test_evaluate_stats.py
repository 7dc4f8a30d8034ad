"""Evaluation statistics: pass@k, maj@k, bootstrap intervals, paired comparison, gates. Pure functions with
worked numbers and brute-force references; no model, no sampling."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from keelrl.config import ConfigError
from keelrl.evals import (
    ComparisonError,
    EvalReport,
    GateError,
    ProblemResult,
    check_gate,
    compare_results,
    maj_at_k,
    parse_gate,
    pass_at_k,
)
from keelrl.evals.report import verdict
from keelrl.evals.stats import (
    default_ks,
    majority_vote,
    metric_intervals,
    normalize_answer,
    problem_metrics,
)

# ------------------------------------------------------------------------------------------------ pass@k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration_of_all_k_subsets() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_worked_numbers() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)  # 1 - C(7,4)/C(10,4)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 7, 4) == 1.0  # fewer than k wrong samples: every k-subset holds a correct one
    # Large n: the product form stays exact where C(n, k) would overflow a float.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-12)
    assert pass_at_k(2000, 3, 1) == pytest.approx(3 / 2000)
    assert 0.0 < pass_at_k(2000, 1, 1) < pass_at_k(2000, 1, 10) < pass_at_k(2000, 10, 10) <= 1.0


def test_pass_at_k_rejects_impossible_arguments() -> None:
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_default_ks() -> None:
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(5) == [1, 2, 4, 5]
    assert default_ks(16) == [1, 2, 4, 8, 16]


# ------------------------------------------------------------------------------------------------- maj@k


def test_normalize_answer() -> None:
    assert normalize_answer(" (1 + 2) * 3 ") == "(1+2)*3"
    assert normalize_answer("1,234") == normalize_answer("1234") == normalize_answer("1_234") == "1234"
    assert normalize_answer("007") == "7"
    assert normalize_answer("ABC def") == "abcdef"
    assert normalize_answer("   ") is None
    assert normalize_answer(None) is None
    assert normalize_answer("1+2") != normalize_answer("2+1")  # textual, documented


def test_majority_vote_ties_go_to_the_earliest_first_vote() -> None:
    # A (correct) and B (wrong) tie 1-1 / 2-2: the answer voted first wins.
    assert majority_vote(["A", "B"], [True, False]) is True
    assert majority_vote(["B", "A"], [False, True]) is False
    assert majority_vote(["B", "A", "A", "B"], [False, True, True, False]) is False
    # A clear majority beats order.
    assert majority_vote(["B", "A", "A"], [False, True, True]) is True
    # Abstentions (no answer) do not vote; all abstaining is wrong.
    assert majority_vote([None, None, "A"], [False, False, True]) is True
    assert majority_vote([None, None], [False, False]) is False
    # Normalised answers vote together: "1,234" and " 1234" outvote "99".
    assert majority_vote(["99", "1,234", " 1234"], [False, True, True]) is True


def test_only_ascii_digits_make_an_answer_an_integer_when_voting() -> None:
    # The checkers read no other digit as a number (multiply scores Arabic-Indic "١٢٣٤" not_an_integer), so it
    # must not vote with "1234" and hand the 1234 majority the look-alike's (wrong) verdict.
    assert normalize_answer("\u0661\u0662\u0663\u0664") != normalize_answer("1234") == "1234"
    assert normalize_answer("\uff11,\uff12\uff13\uff14") != "1234"  # full-width digits
    answers = ["\u0661\u0662\u0663\u0664", "1234", "1234"]
    assert majority_vote(answers, [False, True, True]) is True
    assert maj_at_k(answers, [False, True, True], 3) == 1.0


def brute_maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(range(len(answers)), k))
    return sum(majority_vote([answers[i] for i in s], [correct[i] for i in s]) for s in subsets) / len(
        subsets
    )


def test_maj_at_k_averages_majority_votes_over_all_k_subsets() -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(1, 8))
        pool = ["7", "8", "9", None]
        answers = [pool[int(i)] for i in rng.integers(0, len(pool), n)]
        correct = [a == "7" for a in answers]
        for k in range(1, n + 1):
            assert maj_at_k(answers, correct, k) == pytest.approx(brute_maj_at_k(answers, correct, k)), (
                answers,
                k,
            )


def test_maj_at_k_worked_numbers() -> None:
    # 4 samples: A(correct), B, B, no answer. k=2 subsets: AB tie->A, AB->A, A-->A, BB->B, B-->B, B-->B: 3/6.
    assert maj_at_k(["A", "B", "B", None], [True, False, False, False], 2) == pytest.approx(0.5)
    # k=4: B has 2 votes, A 1: wrong.
    assert maj_at_k(["A", "B", "B", None], [True, False, False, False], 4) == 0.0
    assert maj_at_k([None, None, None], [False, False, False], 2) == 0.0


def test_maj_at_k_random_subsets_when_too_many_are_deterministic_and_close() -> None:
    k = 8  # 16 samples: C(16, 8) = 12870 subsets > MAJ_MAX_SUBSETS: seeded random subsets
    answers = ["7"] * 7 + ["8"] * 6 + [None] * 3
    correct = [a == "7" for a in answers]
    est = maj_at_k(answers, correct, k, seed=5)
    assert est == maj_at_k(answers, correct, k, seed=5)
    assert est == pytest.approx(brute_maj_at_k(answers, correct, k), abs=0.03)


# ------------------------------------------------------------------------------------- per-problem table


def result(
    i: int, correct: list[bool], answers: list[str | None] | None = None, **kw: object
) -> ProblemResult:
    n = len(correct)
    return ProblemResult(
        index=i,
        problem={"i": i},
        difficulty=str(kw.get("difficulty", "d0")),
        texts=[""] * n,
        rewards=[1.0 if c else 0.1 for c in correct],
        correct=list(correct),
        formatted=[True] * n,
        truncated=list(kw.get("truncated", [False] * n)),  # type: ignore[call-overload]
        lengths=list(kw.get("lengths", [10] * n)),  # type: ignore[call-overload]
        answers=answers if answers is not None else ["7" if c else "8" for c in correct],
    )


def test_problem_metrics_worked_example() -> None:
    greedy = [result(0, [True], lengths=[4]), result(1, [False], truncated=[True], lengths=[8])]
    sampled = [result(0, [True, True, False, False]), result(1, [False, False, False, True])]
    t = problem_metrics(greedy, sampled, [1, 2, 4])
    assert list(t["accuracy"]) == [1.0, 0.0]
    assert list(t["mean@n"]) == [0.5, 0.25]
    assert t["pass@1"] == pytest.approx([0.5, 0.25])
    assert t["pass@2"] == pytest.approx([1 - 1 / 6, 0.5])  # 1 - C(2,2)/C(4,2); 1 - C(3,2)/C(4,2)
    assert list(t["pass@4"]) == [1.0, 1.0]
    assert t["maj@4"][0] == 1.0  # 2-2 tie, the correct answer voted first
    assert t["maj@4"][1] == 0.0
    assert list(t["truncated_frac"]) == [0.0, 1.0]
    assert list(t["length/mean"]) == [4.0, 8.0]
    assert t["reward/mean"] == pytest.approx([1.0, 0.1])
    assert "sampled/truncated_frac" in t
    assert "maj@1" not in t
    # Without a greedy pass, accuracy is mean@n.
    t2 = problem_metrics(None, sampled, [1, 2])
    assert list(t2["accuracy"]) == list(t2["mean@n"])
    with pytest.raises(ValueError, match="pass@8"):
        problem_metrics(None, sampled, [8])


# --------------------------------------------------------------------------------------------- bootstrap


def bootstrap_ci(values, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The percentile interval of one metric's mean, as the eval reports it."""
    return tuple(
        metric_intervals({"x": np.asarray(values, dtype=float)}, level, resamples, seed)["x"]["ci95"]
    )


def test_bootstrap_ci_worked_cases_and_determinism() -> None:
    assert bootstrap_ci([0.3] * 50) == (pytest.approx(0.3), pytest.approx(0.3))
    values = [0.0] * 60 + [1.0] * 40
    lo, hi = bootstrap_ci(values, seed=1)
    assert (lo, hi) == bootstrap_ci(values, seed=1)
    assert lo < 0.4 < hi
    # Normal approximation: 0.4 +- 1.96 * sqrt(0.24/100) = [0.304, 0.496].
    assert lo == pytest.approx(0.304, abs=0.02) and hi == pytest.approx(0.496, abs=0.02)
    lo4, hi4 = bootstrap_ci(values * 4, seed=1)
    assert hi4 - lo4 == pytest.approx((hi - lo) / 2, rel=0.15)  # width shrinks like 1/sqrt(P)


def test_bootstrap_ci_covers_the_truth_at_about_the_nominal_rate() -> None:
    rng = np.random.default_rng(1234)
    true_p, problems, reps = 0.35, 100, 300
    covered = 0
    for r in range(reps):
        draws = (rng.random(problems) < true_p).astype(float)
        lo, hi = bootstrap_ci(draws, level=0.95, resamples=1000, seed=r)
        covered += lo <= true_p <= hi
    rate = covered / reps
    assert 0.90 <= rate <= 0.99, rate


def test_metric_intervals_share_one_bootstrap_and_bracket_the_value() -> None:
    rng = np.random.default_rng(0)
    table = {"a": rng.random(40), "b": (rng.random(40) < 0.5).astype(float)}
    out = metric_intervals(table, seed=3)
    for name, m in out.items():
        assert m["ci95"][0] <= m["value"] <= m["ci95"][1]
        assert m["value"] == pytest.approx(table[name].mean())
    assert out == metric_intervals(table, seed=3)


# -------------------------------------------------------------------------------------------- comparison


def report(correct: list[bool], **kw: object) -> EvalReport:
    greedy = [result(i, [c], **kw) for i, c in enumerate(correct)]
    return EvalReport(settings={"task": "t", "seed": 0}, greedy=greedy)


def test_paired_comparison_detects_a_planted_difference() -> None:
    rng = np.random.default_rng(7)
    base = rng.random(400) < 0.5
    better = base.copy()
    wrong = np.flatnonzero(~base)
    better[rng.choice(wrong, 60, replace=False)] = True  # B correct on 15% more of the problems
    a, b = report(list(base)), report(list(better))
    cmp = compare_results(a, b)
    m = cmp["metrics"]["accuracy"]
    assert m["diff"] == pytest.approx(0.15)
    assert m["ci"][0] > 0.0 and m["verdict"] == "better"
    assert compare_results(b, a)["metrics"]["accuracy"]["verdict"] == "worse"


def test_identical_results_are_indistinguishable() -> None:
    rng = np.random.default_rng(8)
    correct = list(rng.random(200) < 0.4)
    cmp = compare_results(report(correct), report(correct))
    assert cmp["metrics"], "no metric compared"
    for m in cmp["metrics"].values():
        assert m["verdict"] == "indistinguishable"
        assert m["diff"] == 0.0 and m["ci"] == [0.0, 0.0]


def test_independent_noise_of_equal_quality_is_indistinguishable_here() -> None:
    rng = np.random.default_rng(9)
    a, b = list(rng.random(300) < 0.5), list(rng.random(300) < 0.5)
    assert compare_results(report(a), report(b))["metrics"]["accuracy"]["verdict"] == "indistinguishable"


def test_comparison_uses_each_metrics_direction() -> None:
    correct = [True, False] * 50
    a = report(correct, truncated=[True])
    b = report(correct, truncated=[False])
    m = compare_results(a, b)["metrics"]
    assert m["truncated_frac"]["verdict"] == "better"  # fewer truncations
    assert m["accuracy"]["verdict"] == "indistinguishable"
    longer = report(correct, lengths=[20])
    # length has no preferred direction: higher / lower instead of better / worse
    assert compare_results(a, longer)["metrics"]["length/mean"]["verdict"] == "higher"


def test_verdict_words() -> None:
    assert verdict(0.01, 0.2) == "better"
    assert verdict(-0.2, -0.01) == "worse"
    assert verdict(-0.01, 0.2) == "indistinguishable"
    assert verdict(0.01, 0.2, direction=-1) == "worse"
    assert verdict(0.01, 0.2, direction=0) == "higher"


def test_comparison_refuses_different_problems() -> None:
    a = report([True, False, True])
    b = report([True, False, True])
    b.greedy[1].problem = {"i": 99}  # type: ignore[index]
    with pytest.raises(ComparisonError, match=r"different problems.*problem 1"):
        compare_results(a, b)
    with pytest.raises(ComparisonError, match="3 problems and B has 2"):
        compare_results(a, report([True, False]))
    with pytest.raises(ComparisonError, match="not a keelrl eval result"):
        compare_results(a, {"accuracy": 0.5})
    assert issubclass(ComparisonError, ConfigError)  # the CLI prints it and exits 2


def test_comparison_reports_metrics_only_one_side_has_and_setting_differences() -> None:
    a = report([True, False])
    b = EvalReport(
        settings={"task": "t", "seed": 0, "samples": 2, "k": [1, 2], "temperature": 1.0},
        greedy=[result(i, [c]) for i, c in enumerate([True, False])],
        sampled=[result(i, [c, c]) for i, c in enumerate([True, False])],
    )
    cmp = compare_results(a, b)
    assert "pass@2" in cmp["only_in_b"] and "pass@2" not in cmp["metrics"]
    assert cmp["setting_differences"]["samples"] == [None, 2]


def test_report_json_round_trip_gives_the_same_table() -> None:
    r = EvalReport(
        settings={"task": "t", "seed": 0, "samples": 4, "k": [1, 2, 4], "greedy": True},
        greedy=[result(i, [i % 2 == 0], difficulty=f"d{i % 3}") for i in range(9)],
        sampled=[result(i, [i % 2 == 0, True, False, i % 3 == 0], difficulty=f"d{i % 3}") for i in range(9)],
        time_s=2.0,
    )
    data = json.loads(json.dumps(r.to_json(resamples=200)))
    assert data["accuracy"] == data["metrics"]["accuracy"]["value"] == pytest.approx(5 / 9)
    assert set(data["by_difficulty"]) == {"d0", "d1", "d2"}
    assert data["by_difficulty"]["d0"]["problems"] == 3
    assert data["problems_per_s"] == pytest.approx(4.5)
    back = EvalReport.from_json(data)
    t1, t2 = r.table(), back.table()
    assert t1.keys() == t2.keys()
    for k in t1:
        np.testing.assert_array_equal(t1[k], t2[k])


def test_a_report_counts_its_distinct_problems_and_says_so_when_some_repeat() -> None:
    r = report([True, False, True, True])
    assert r.summary(resamples=50)["distinct_problems"] == 4
    assert "distinct" not in rendered_title(r)
    for res, drawn in zip(r.greedy or [], ({"i": 0}, {"i": 1}, {"i": 0}, {"i": 0})):  # problem 0 drawn thrice
        res.problem = drawn
    summary = r.summary(resamples=50)
    assert summary["problems"] == 4 and summary["distinct_problems"] == 2
    assert "4 problems (2 distinct)" in rendered_title(r)


def rendered_title(r: EvalReport) -> str:
    from keelrl.evals.render import render_summary

    return str(render_summary(r.summary(resamples=50))[0].title)


# ------------------------------------------------------------------------------------------------- gates

RESULTS = {
    "metrics": {
        "accuracy": {"value": 0.5, "ci95": [0.42, 0.58]},
        "pass@4": {"value": 0.7, "ci95": [0.6, 0.8]},
        "reward/mean": {"value": 0.55, "ci95": [0.5, 0.6]},
    }
}
BASELINE = {
    "metrics": {"accuracy": {"value": 0.505, "ci95": [0.4, 0.6]}, "pass@4": {"value": 0.72, "ci95": [0, 1]}}
}


def test_parse_gate() -> None:
    g = parse_gate("accuracy>=0.45")
    assert (g.metric, g.bound, g.op, g.number, g.relative) == ("accuracy", "value", ">=", 0.45, False)
    g = parse_gate(" pass@4 > 0.6 ")
    assert (g.metric, g.op, g.number) == ("pass@4", ">", 0.6)
    g = parse_gate("accuracy>=base-0.01")
    assert (g.relative, g.number) == (True, -0.01)
    g = parse_gate("accuracy.lo >= base + .02")
    assert (g.bound, g.relative, g.number) == ("lo", True, 0.02)
    g = parse_gate("reward/mean<1e-1")
    assert (g.metric, g.op, g.number) == ("reward/mean", "<", 0.1)
    assert parse_gate("maj@4<=0.3").op == "<="
    assert parse_gate("accuracy==0.5").op == "=="


@pytest.mark.parametrize(
    "expr",
    ["accuracy", "accuracy>=", ">=0.4", "accuracy=>0.4", "accuracy>>0.4", "accuracy>=0.4x", "accuracy>=basis",
     "accuracy>=base*2", "accuracy !=0.4", "accuracy>=0.4>=0.3", ""],
)  # fmt: skip
def test_malformed_gates_are_clear_errors(expr: str) -> None:
    with pytest.raises(GateError, match="gate"):
        parse_gate(expr)
    assert issubclass(GateError, ConfigError)


def test_check_gate_constant_thresholds() -> None:
    assert check_gate("accuracy>=0.45", RESULTS).passed
    assert not check_gate("accuracy>=0.55", RESULTS).passed
    assert check_gate("pass@4>0.6", RESULTS).passed
    assert not check_gate("pass@4>0.7", RESULTS).passed  # strict
    assert check_gate("pass@4<=0.7", RESULTS).passed
    assert not check_gate("reward/mean<0.55", RESULTS).passed
    assert check_gate("accuracy==0.5", RESULTS).passed
    assert check_gate("accuracy.lo>=0.42", RESULTS).passed  # lower end of the interval
    assert not check_gate("accuracy.lo>=0.45", RESULTS).passed
    assert check_gate("accuracy.hi<0.6", RESULTS).passed
    # A flat mapping of floats works too.
    assert check_gate("accuracy>=0.45", {"accuracy": 0.5}).passed


def test_check_gate_against_a_baseline() -> None:
    r = check_gate("accuracy>=base-0.01", RESULTS, BASELINE)
    assert r.passed and r.threshold == pytest.approx(0.495) and r.value == 0.5
    assert not check_gate("accuracy>=base", RESULTS, BASELINE).passed
    assert not check_gate("pass@4>=base", RESULTS, BASELINE).passed
    assert check_gate("pass@4>=base-0.05", RESULTS, BASELINE).passed
    assert "PASS accuracy>=base-0.01" in r.describe()


def test_check_gate_errors_name_what_is_missing() -> None:
    with pytest.raises(GateError, match="'pass@16' is not in the results; available: accuracy, pass@4"):
        check_gate("pass@16>0.5", RESULTS)
    with pytest.raises(GateError, match="no baseline"):
        check_gate("accuracy>=base", RESULTS)
    with pytest.raises(GateError, match="not in the baseline"):
        check_gate("reward/mean>=base", RESULTS, BASELINE)
    with pytest.raises(GateError, match="no interval"):
        check_gate("accuracy.lo>=0.4", {"accuracy": 0.5})


def test_pass_at_k_is_exposed_with_the_documented_formula() -> None:
    # 1 - C(n-c, k)/C(n, k) with math.comb, for a mid-size case.
    n, c, k = 50, 7, 10
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
