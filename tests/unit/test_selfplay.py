"""Self-play's pieces (issue 29): the learnability reward on worked numbers, Countdown proposal checks
(malformed, out of range, held out, unsolvable; worked lines), code proposal checks in the sandbox, buffer
deduplication and its JSON state."""

from __future__ import annotations

import json

import pytest

from keelrl.algo.selfplay import learnability_reward
from keelrl.stages.selfplay.buffer import ProblemBuffer
from keelrl.stages.selfplay.code import SEED_EXAMPLE, check_code_proposal, code_problem_key, example_text
from keelrl.stages.selfplay.countdown import check_proposal, parse_proposal, problem_key
from keelrl.tasks import get_task
from keelrl.tasks.base import in_test_split
from keelrl.tasks.countdown import Countdown

TASK = Countdown(
    min_numbers=2, max_numbers=3, min_number=1, max_number=50, max_target=2500, test_fraction=0.3
)


def test_learnability_reward_worked_numbers() -> None:
    rewards = [learnability_reward(r) for r in (0.0, 0.25, 0.5, 0.875, 1.0)]
    assert rewards == [0.0, 0.75, 0.5, 0.125, 0.0]  # nothing for trivial or impossible, more for harder
    with pytest.raises(ValueError):
        learnability_reward(1.5)


def _train_pair(target_of: str) -> tuple[list[int], int]:
    """A number pair in the train split, and a target reached by `target_of` ("sum" or "none")."""
    for a in range(2, 50):
        for b in range(2, a):
            if not in_test_split((b, a), TASK.seed, 0.3):
                return [a, b], (a + b if target_of == "sum" else 2 * a * b + 1)
    raise AssertionError("no train pair")


def test_valid_proposal_and_its_key() -> None:
    numbers, target = _train_pair("sum")
    text = f"{numbers[0]} {numbers[1]} -> {target}"
    p = check_proposal(TASK, text)
    assert p.reason == "valid" and p.problem == {"numbers": numbers, "target": target}
    assert p.key == problem_key({"numbers": numbers[::-1], "target": target})  # order does not matter
    assert (
        check_proposal(TASK, f"<problem>{numbers[1]}, {numbers[0]} -> {target}</problem>\nmore").reason
        == "valid"
    )


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "malformed"),
        ("37 12 = 444", "malformed"),
        ("37 -12 -> 444", "malformed"),
        ("3.5 12 -> 42", "malformed"),
        ("37 -> 37", "count_out_of_range"),
        ("1 2 3 4 -> 10", "count_out_of_range"),
        ("51 2 -> 53", "number_out_of_range"),
        ("0 2 -> 2", "number_out_of_range"),
        ("50 49 -> 2551", "target_out_of_range"),
    ],
)
def test_malformed_and_out_of_range_proposals_are_refused(text: str, reason: str) -> None:
    assert (
        check_proposal(TASK, text) == check_proposal(TASK, text)
        and check_proposal(TASK, text).reason == reason
    )
    assert check_proposal(TASK, text).problem is None


def test_unsolvable_and_held_out_proposals_are_refused() -> None:
    numbers, target = _train_pair("none")
    assert check_proposal(TASK, f"{numbers[0]} {numbers[1]} -> {target}").reason == "unsolvable"
    held = next((a, b) for a in range(2, 50) for b in range(2, a) if in_test_split((b, a), TASK.seed, 0.3))
    assert check_proposal(TASK, f"{held[0]} {held[1]} -> {held[0] + held[1]}").reason == "held_out"
    assert parse_proposal("7 5 -> 12") == {"numbers": [7, 5], "target": 12}


def test_worked_proposals_take_the_target_from_their_solution() -> None:
    numbers, target = _train_pair("none")  # the written target is unreachable: a worked line ignores it
    a, b = numbers
    worked = check_proposal(TASK, f"{a} {b} -> {target}\n<answer>{a}*{b}</answer>", "worked")
    assert worked.reason == "valid" and worked.problem == {"numbers": numbers, "target": a * b}
    assert worked.key == problem_key({"numbers": numbers, "target": a * b})
    assert check_proposal(TASK, f"{a} {b} -> {target}\n<answer>{a}*{b}</answer>").reason == "unsolvable"
    refusals = {
        f"{a} {b} -> {target}": "no_solution",
        f"{a} {b} -> {target}\n<answer>{a}*{a}</answer>": "invalid_solution",  # not the listed numbers
        f"{a} {b} -> {target}\n<answer>{a}*{b}+1</answer>": "invalid_solution",  # a number not listed
        f"{a} {b} -> 1\n<answer>{a}-{a + b - a}-{b}</answer>": "invalid_solution",
        f"{a} {b} -> 1\n<answer>{b}-{a}</answer>": "target_out_of_range",  # negative
        f"{a} {b} -> 1\n<answer>{a}/{b}</answer>": "target_out_of_range" if a % b else "valid",
        f"{a} {b} <answer>{a}+{b}</answer>": "malformed",
    }
    for text, reason in refusals.items():
        assert check_proposal(TASK, text, "worked").reason == reason, text
    with pytest.raises(ValueError, match="unknown proposal form"):
        check_proposal(TASK, "7 5 -> 12", "guess")


def test_buffer_deduplicates_records_difficulty_and_round_trips() -> None:
    buf = ProblemBuffer(capacity=2)
    assert buf.add("2,7->9", {"numbers": [7, 2], "target": 9}, step=1)
    assert not buf.add("2,7->9", {"numbers": [2, 7], "target": 9}, step=2)  # the same problem again
    assert buf.add("3,4->12", {"numbers": [3, 4], "target": 12}, step=2)
    buf.record("2,7->9", attempts=8, solved=2)
    buf.record("2,7->9", attempts=8, solved=6)
    assert buf.entries["2,7->9"].solve_rate == 0.5 and buf.entries["3,4->12"].solve_rate is None
    assert (buf.proposals, buf.duplicates) == (3, 1)
    with pytest.raises(ValueError):
        buf.record("3,4->12", attempts=2, solved=3)
    again = ProblemBuffer.from_state(json.loads(json.dumps(buf.state_dict())))
    assert again == buf
    assert buf.add("1,5->6", {"numbers": [1, 5], "target": 6}, step=3)  # past capacity the oldest leaves
    assert list(buf.entries) == ["3,4->12", "1,5->6"]


CODE = (
    "<spec>Return the largest of three numbers.</spec>\n```python\ndef largest(a, b, c):\n    return max(a, b, c)\n"
    "```\n<tests>\nassert largest(1, 5, 3) == 5\nassert largest(-1, -5, -3) == -1\n</tests>"
)


def test_code_proposals_are_checked_by_running_the_reference_twice() -> None:
    task = get_task("code")
    valid = check_code_proposal(task, CODE)
    assert valid.reason == "valid" and valid.problem is not None
    problem = valid.problem
    assert problem["entry_point"] == "largest" and problem["tests"][0] == {"args": "1, 5, 3", "expected": 5}
    assert problem["prompt"].endswith("`largest(a, b, c)`.") and "assert" not in problem["prompt"]
    assert task.score(problem, "```python\ndef largest(a, b, c):\n    return max(a, b, c)\n```").correct
    assert not task.score(problem, "```python\ndef largest(a, b, c):\n    return a\n```").correct
    # the key ignores the wording and the order of the tests; the example text reads back as the same problem
    swapped = CODE.replace("three numbers", "3 numbers").replace(
        "assert largest(1, 5, 3) == 5\nassert largest(-1, -5, -3) == -1",
        "assert largest(-1, -5, -3) == -1\nassert largest(1, 5, 3) == 5",
    )
    assert check_code_proposal(task, swapped).key == valid.key == code_problem_key(problem)
    assert check_code_proposal(task, example_text(problem)).key == valid.key
    # a written value the reference does not return: refused, unless the form takes values from the reference
    wrong = CODE.replace("== 5", "== 6")
    assert check_code_proposal(task, wrong).reason == "invalid_solution"
    worked = check_code_proposal(task, wrong, "worked")
    assert worked.reason == "valid" and worked.problem is not None
    assert worked.problem["tests"][0]["expected"] == 5
    assert check_code_proposal(task, SEED_EXAMPLE).reason == "valid"
    held = task.splits["test"][0]["entry_point"]
    refusals = {
        CODE.replace("<spec>Return the largest of three numbers.</spec>", ""): "malformed",
        CODE.replace("\nassert largest(-1, -5, -3) == -1", ""): "malformed",  # one test
        CODE.replace(
            "assert largest(-1, -5, -3) == -1", "assert max(1, 2) == 2"
        ): "malformed",  # two functions
        CODE.replace("assert largest(-1, -5, -3) == -1", "largest(1, 2, 3)"): "malformed",
        CODE.replace("assert largest(-1, -5, -3) == -1", "assert largest(1, 2, 3) > 0"): "malformed",
        CODE.replace("```python", "").replace("```", ""): "no_solution",
        CODE.replace("def largest", "def biggest"): "invalid_solution",  # the tests call what is not defined
        CODE.replace("return max(a, b, c)", "return max(a, b, c"): "invalid_solution",  # syntax error
        CODE.replace("return max(a, b, c)", "raise ValueError(a)"): "invalid_solution",
        CODE.replace("return max(a, b, c)", "import random\n    return random.random()").replace(
            "== 5", "== 0.5"
        ): "nondeterministic",  # judged before its values are
        CODE.replace("largest", held): "held_out",
    }
    for text, reason in refusals.items():
        assert check_code_proposal(task, text).reason == reason, text
    random_ref = CODE.replace("return max(a, b, c)", "import random\n    return random.random()")
    assert check_code_proposal(task, random_ref, "worked").reason == "nondeterministic"
    with pytest.raises(ValueError, match="unknown proposal form"):
        check_code_proposal(task, CODE, "guess")


def test_the_proposer_update_is_judged_against_its_own_history() -> None:
    """selfplay.policies = "two": the proposer's gradient norms (logged as proposer/grad_norm) run 4x the
    solver's here. Judged against the solver's records, its ordinary update would be a grad_spike and skipped;
    `own_history` gives the per-step guards the proposer's own records under the plain names."""
    from types import SimpleNamespace

    from keelrl.guards.rules import GuardsConfig
    from keelrl.guards.step import check_update
    from keelrl.step.update import own_history

    history = [
        {"step": s, "grad_norm": 0.10 + 0.002 * (s % 3), "loss/total": 0.0, "proposer/grad_norm": 0.40 + 0.01 * (s % 3),
         "proposer/loss/total": 0.0}
        for s in range(1, 21)
    ]  # fmt: skip
    solver = SimpleNamespace(metric_prefix="", live=SimpleNamespace(history=history))
    proposer = SimpleNamespace(metric_prefix="proposer/", live=SimpleNamespace(history=history))
    assert own_history(solver) is history  # type: ignore[arg-type]
    mine = own_history(proposer)  # type: ignore[arg-type]
    assert mine[0] == {"step": 1, "grad_norm": pytest.approx(0.41), "loss/total": 0.0}
    cfg = GuardsConfig()
    assert check_update(mine, 21, 0.0, 0.41, 1.0, 0.5, cfg) is None
    spike = check_update(history, 21, 0.0, 0.41, 1.0, 0.5, cfg)
    assert spike is not None and spike.name == "grad_spike"  # what judging it by the solver's records did
    assert check_update(mine, 21, 0.0, 2.0, 1.0, 0.5, cfg) is not None  # its own spikes are still caught
