"""Self-play's pieces (issue 29, in progress): the learnability reward on worked numbers, Countdown proposal
checks (malformed, out of range, held out, unsolvable), buffer deduplication and its JSON state."""

from __future__ import annotations

import json

import pytest

from keelrl.algo.selfplay import learnability_reward, solve_rate
from keelrl.selfplay.buffer import ProblemBuffer
from keelrl.selfplay.countdown import check_proposal, parse_proposal, problem_key
from keelrl.tasks.base import in_test_split
from keelrl.tasks.countdown import Countdown

TASK = Countdown(
    min_numbers=2, max_numbers=3, min_number=1, max_number=50, max_target=2500, test_fraction=0.3
)


def test_learnability_reward_worked_numbers() -> None:
    assert solve_rate([True, False, False, True]) == 0.5
    rewards = [learnability_reward(r) for r in (0.0, 0.25, 0.5, 0.875, 1.0)]
    assert rewards == [0.0, 0.75, 0.5, 0.125, 0.0]  # nothing for trivial or impossible, more for harder
    with pytest.raises(ValueError):
        learnability_reward(1.5)
    with pytest.raises(ValueError):
        solve_rate([])


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
