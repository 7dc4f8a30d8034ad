"""The judge session's store: one SQLite file (WAL) holding the pairs to judge and every vote as it is cast.

A session compares checkpoints blind. `pairs` holds, per pair, the problem, the two models' completions (A
and B in a fixed order) and which one is shown on the left (drawn per pair, balanced per model pair);
`votes` holds one row per vote: who, when, which pair, the outcome (`a`, `b`, `tie`, `skip`) and the side the
winner was shown on. A pair whose two texts are the same (up to whitespace: `Pair.identical`) is never shown:
it counts once as a tie (`identical_ties`) and is never exported as a preference. A vote is committed before the page hears back, so a closed tab or a killed server loses
nothing; `undo` deletes the judge's newest vote; a judge resumes at their first pair without a vote. WAL lets
several judges' requests and a results reader share the file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("a", "b", "tie", "skip")
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pairs (
    id INTEGER PRIMARY KEY, problem_index INTEGER NOT NULL, problem TEXT NOT NULL, prompt TEXT NOT NULL,
    model_a TEXT NOT NULL, model_b TEXT NOT NULL, text_a TEXT NOT NULL, text_b TEXT NOT NULL,
    correct_a INTEGER, correct_b INTEGER, a_on_left INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS votes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, pair_id INTEGER NOT NULL REFERENCES pairs(id), judge TEXT NOT NULL,
    cast_at REAL NOT NULL, outcome TEXT NOT NULL, winner_side TEXT
);
CREATE INDEX IF NOT EXISTS votes_by_judge ON votes (judge, pair_id);
CREATE TABLE IF NOT EXISTS verdicts_shown (
    judge TEXT NOT NULL, pair_id INTEGER NOT NULL REFERENCES pairs(id), shown_at REAL NOT NULL,
    PRIMARY KEY (judge, pair_id)
);
"""


@dataclass(frozen=True)
class Pair:
    id: int
    problem_index: int
    problem: dict[str, Any]
    prompt: str
    model_a: str
    model_b: str
    text_a: str
    text_b: str
    correct_a: bool | None
    correct_b: bool | None
    a_on_left: bool

    @property
    def identical(self) -> bool:
        """Both sides say the same, up to whitespace: nothing for a person to judge."""
        return self.text_a.split() == self.text_b.split()

    def row(self) -> tuple[Any, ...]:
        """The pair as a row of the `pairs` table (its columns in field order, the problem as JSON)."""
        cells = astuple(self)
        return (*cells[:2], json.dumps(self.problem), *cells[3:10], int(self.a_on_left))

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> Pair:
        verdicts = (None if c is None else bool(c) for c in r[8:10])
        return cls(*r[:2], json.loads(r[2]), *r[3:8], *verdicts, bool(r[10]))


@dataclass(frozen=True)
class StoredVote:
    id: int
    pair_id: int
    judge: str
    cast_at: float
    outcome: str
    winner_side: str | None  # "left" / "right" for a and b outcomes, None for tie and skip
    verdict_seen: bool = False  # the judge had asked for the verifier's verdict on this pair before voting


class JudgeStore:
    """A session file; open it from any thread (each call opens its own short-lived connection)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(votes)")}
            if "verdict_seen" not in columns:  # a session made before votes recorded it
                db.execute("ALTER TABLE votes ADD COLUMN verdict_seen INTEGER NOT NULL DEFAULT 0")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0)
        try:
            db.execute("PRAGMA synchronous=FULL")  # a committed vote survives a power cut, not just a crash
            with db:  # one transaction: committed on success, rolled back on error
                yield db
        finally:
            db.close()

    def set_meta(self, **values: Any) -> None:
        with self._db() as db:
            db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in values.items()],
            )

    def meta(self) -> dict[str, Any]:
        with self._db() as db:
            return {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}

    def add_pairs(self, pairs: Sequence[Pair]) -> None:
        with self._db() as db:
            db.executemany(
                "INSERT INTO pairs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [p.row() for p in pairs]
            )

    def pairs(self) -> list[Pair]:
        with self._db() as db:
            return [Pair.from_row(r) for r in db.execute("SELECT * FROM pairs ORDER BY id")]

    def vote(self, pair_id: int, judge: str, outcome: str, now: float | None = None) -> StoredVote:
        """Record `judge`'s vote on pair `pair_id` (replacing an earlier vote of theirs on it)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"a vote is one of {OUTCOMES}, got {outcome!r}")
        if not judge.strip():
            raise ValueError("a vote needs the judge's name")
        cast_at = time.time() if now is None else now
        with self._db() as db:
            row = db.execute("SELECT a_on_left FROM pairs WHERE id = ?", (pair_id,)).fetchone()
            if row is None:
                raise ValueError(f"no pair {pair_id} in this session")
            a_on_left = bool(row[0])
            side = None
            if outcome in ("a", "b"):
                side = "left" if (outcome == "a") == a_on_left else "right"
            seen = db.execute(
                "SELECT 1 FROM verdicts_shown WHERE judge = ? AND pair_id = ?", (judge, pair_id)
            ).fetchone()
            db.execute("DELETE FROM votes WHERE judge = ? AND pair_id = ?", (judge, pair_id))
            cur = db.execute(
                "INSERT INTO votes (pair_id, judge, cast_at, outcome, winner_side, verdict_seen) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (pair_id, judge, cast_at, outcome, side, int(seen is not None)),
            )
            vote_id = int(cur.lastrowid or 0)
        return StoredVote(vote_id, pair_id, judge, cast_at, outcome, side, seen is not None)

    def mark_verdict_shown(self, pair_id: int, judge: str, now: float | None = None) -> None:
        """`judge` has seen the verifier's verdict on pair `pair_id`: their vote on it is no longer blind to it."""
        with self._db() as db:
            db.execute(
                "INSERT OR IGNORE INTO verdicts_shown (judge, pair_id, shown_at) VALUES (?, ?, ?)",
                (judge, pair_id, time.time() if now is None else now),
            )

    def undo(self, judge: str) -> int | None:
        """Delete `judge`'s newest vote; returns its pair id (None when they have none)."""
        with self._db() as db:
            row = db.execute(
                "SELECT id, pair_id FROM votes WHERE judge = ? ORDER BY id DESC LIMIT 1", (judge,)
            ).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM votes WHERE id = ?", (row[0],))
            return int(row[1])

    def votes(self, judge: str | None = None) -> list[StoredVote]:
        query, args = "SELECT * FROM votes", ()
        if judge is not None:
            query, args = query + " WHERE judge = ?", (judge,)
        with self._db() as db:
            rows = db.execute(query + " ORDER BY id", args).fetchall()
        return [StoredVote(*r[:6], bool(r[6])) for r in rows]

    def next_pair(self, judge: str) -> int | None:
        """The first pair (by id) with two different texts that `judge` has not voted on; None when done."""
        voted = {v.pair_id for v in self.votes(judge)}
        return next((p.id for p in self.pairs() if not p.identical and p.id not in voted), None)


def balanced_sides(model_pairs: Sequence[tuple[str, str]], seed: int) -> list[bool]:
    """Per pair, whether model A is shown on the left: for each (model_a, model_b) combination exactly half
    its pairs (one more for an odd count, chosen at random) put A on the left, in a seeded random order; so
    position bias cannot favour a model."""
    import random

    rng = random.Random(seed)
    out = [False] * len(model_pairs)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(model_pairs):
        groups.setdefault(key, []).append(i)
    for key in sorted(groups):
        idx = groups[key]
        left = [True] * (len(idx) // 2) + [False] * (len(idx) // 2)
        if len(idx) % 2:
            left.append(rng.random() < 0.5)
        rng.shuffle(left)
        for i, flag in zip(idx, left):
            out[i] = flag
    return out


def comparisons(pairs: Sequence[Pair], votes: Sequence[StoredVote]) -> list[tuple[str, str, float, str, int]]:
    """Votes as (model_a, model_b, outcome for A: 1 / 0 / 0.5, judge, pair id); skips and votes on identical
    pairs (cast before they were skipped) left out."""
    by_id = {p.id: p for p in pairs}
    value = {"a": 1.0, "b": 0.0, "tie": 0.5}
    return [
        (by_id[v.pair_id].model_a, by_id[v.pair_id].model_b, value[v.outcome], v.judge, v.pair_id)
        for v in votes
        if v.outcome in value and not by_id[v.pair_id].identical
    ]


def identical_ties(pairs: Sequence[Pair]) -> list[tuple[str, str, float]]:
    """Each pair with identical texts as one tie (model_a, model_b, 0.5), recorded without asking anyone."""
    return [(p.model_a, p.model_b, 0.5) for p in pairs if p.identical]


def finished(pairs: Sequence[Pair], votes: Sequence[StoredVote]) -> bool:
    """Whether the session is over: every judge who voted has voted on every pair with two different texts
    (and someone has, unless there is nothing to judge). Until then no page or API call names the models."""
    todo = {p.id for p in pairs if not p.identical}
    seen: dict[str, set[int]] = {}
    for v in votes:
        seen.setdefault(v.judge, set()).add(v.pair_id)
    return (bool(seen) or not todo) and all(todo <= ids for ids in seen.values())
