"""The judge session store: votes persist as cast, undo and resume, sides balanced, skips kept apart."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from keelrl.judge.store import JudgeStore, Pair, balanced_sides, comparisons


def make_pairs(n: int) -> list[Pair]:
    sides = balanced_sides([("m1", "m2")] * n, seed=0)
    return [
        Pair(
            i,
            i,
            {"numbers": [i, 2], "target": i + 2},
            f"{i} 2 -> {i + 2}",
            "m1",
            "m2",
            f"a{i}",
            f"b{i}",
            True,
            False,
            sides[i],
        )
        for i in range(n)
    ]


def test_votes_persist_undo_and_resume(tmp_path: Path):
    store = JudgeStore(tmp_path / "s.sqlite")
    store.add_pairs(make_pairs(4))
    store.set_meta(models=["m1", "m2"], seed=0)
    assert store.next_pair("ann") == 0
    assert store.vote(0, "ann", "a", now=1.0).cast_at == 1.0
    store.vote(1, "ann", "tie", now=2.0)
    store.vote(0, "bob", "b", now=3.0)
    # a new store object on the same file (a restarted server) sees everything
    again = JudgeStore(tmp_path / "s.sqlite")
    assert again.meta() == {"models": ["m1", "m2"], "seed": 0}
    assert [(v.pair_id, v.judge, v.outcome) for v in again.votes()] == [
        (0, "ann", "a"),
        (1, "ann", "tie"),
        (0, "bob", "b"),
    ]
    assert again.next_pair("ann") == 2 and again.next_pair("bob") == 1 and again.next_pair("cy") == 0
    assert again.undo("ann") == 1 and again.next_pair("ann") == 1
    assert again.undo("nobody") is None
    again.vote(0, "ann", "b")  # a second vote on a pair replaces the first
    assert [v.outcome for v in again.votes("ann")] == ["b"]
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_winner_side_follows_the_shown_order(tmp_path: Path):
    store = JudgeStore(tmp_path / "s.sqlite")
    pairs = make_pairs(2)
    store.add_pairs(pairs)
    for p in pairs:
        v = store.vote(p.id, "ann", "a")
        assert v.winner_side == ("left" if p.a_on_left else "right")
    assert store.vote(0, "ann", "tie").winner_side is None


def test_bad_votes_are_refused(tmp_path: Path):
    store = JudgeStore(tmp_path / "s.sqlite")
    store.add_pairs(make_pairs(1))
    with pytest.raises(ValueError, match="one of"):
        store.vote(0, "ann", "left")
    with pytest.raises(ValueError, match="no pair 7"):
        store.vote(7, "ann", "a")
    with pytest.raises(ValueError, match="judge's name"):
        store.vote(0, " ", "a")
    assert store.votes() == []


def test_sides_are_balanced_per_model_pair():
    keys = [("m1", "m2")] * 10 + [("m1", "m3")] * 7
    sides = balanced_sides(keys, seed=3)
    assert sum(sides[:10]) == 5 and sum(sides[10:]) in (3, 4)
    assert sides == balanced_sides(keys, seed=3) and sides != balanced_sides(keys, seed=4)


def test_comparisons_leave_skips_out(tmp_path: Path):
    store = JudgeStore(tmp_path / "s.sqlite")
    store.add_pairs(make_pairs(3))
    store.vote(0, "ann", "a")
    store.vote(1, "ann", "skip")
    store.vote(2, "ann", "tie")
    got = comparisons(store.pairs(), store.votes())
    assert [(a, b, o) for a, b, o, _, _ in got] == [("m1", "m2", 1.0), ("m1", "m2", 0.5)]
    assert Counter(v.outcome for v in store.votes()) == {"a": 1, "skip": 1, "tie": 1}
