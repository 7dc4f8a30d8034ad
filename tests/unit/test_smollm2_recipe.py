"""The SmolLM2 recipe's pieces (recipes/smollm2.py) that decide what it trains on and how it is judged."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from keelrl.recipes.smollm2 import (
    MAX_TRACE_TOKENS,
    TASK_PARAMS,
    TRACKS,
    by_family,
    family,
    family_losses,
    sft_records,
)
from keelrl.tasks import get_task


class CharTokens:
    """A stand-in tokenizer: one token per character (SmolLM2's BPE gives fewer)."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_sft_records_are_correct_searches_of_train_problems_only() -> None:
    task = get_task("countdown_search", **TASK_PARAMS)
    records = sft_records(task, CharTokens(), 60, seed=0)
    assert len(records) == 60
    test_sets = {tuple(sorted(task.problem("test", i)["numbers"])) for i in range(2000)}
    for r in records:
        problem, trace = r["problem"], r["completion"]
        assert task.score(problem, trace).correct, trace  # every trace ends in a right answer
        assert len(trace) <= MAX_TRACE_TOKENS
        assert tuple(sorted(problem["numbers"])) not in test_sets  # no held-out number set
    # both strategies of the mix occur: some traces back up (a dead end before the answer)
    assert any(r["completion"].count("\n") > 1 for r in records)
    assert sft_records(task, CharTokens(), 60, seed=0) == records  # a function of the seed
    assert sft_records(task, CharTokens(), 60, seed=1) != records


def test_family_is_the_count_and_the_operations_of_a_solution() -> None:
    assert family({"numbers": [3, 4], "target": 12}) == "n2 *"
    assert family({"numbers": [9, 2], "target": 7}) == "n2 -"
    assert family({"numbers": [2, 3, 4], "target": 20}) == "n3 +*"


def _report(problems: list[dict], correct: list[bool]) -> SimpleNamespace:
    return SimpleNamespace(
        records=[SimpleNamespace(problem=p, correct=[c]) for p, c in zip(problems, correct)]
    )


def test_by_family_pairs_problems_and_flags_a_collapse() -> None:
    adds = [{"numbers": [3, 4], "target": 7}, {"numbers": [5, 1], "target": 6}]
    muls = [{"numbers": [3, 4], "target": 12}, {"numbers": [5, 2], "target": 10}]
    before = _report(adds + muls, [False, False, True, True])
    after = _report(adds + muls, [True, True, True, False])  # learned to add, forgot half the products
    families = by_family(before, after)
    assert families == {"n2 *": [1.0, 0.5], "n2 +": [0.0, 1.0]}
    assert family_losses(families) == ["n2 *"]
    assert family_losses({"n2 *": [0.25, 0.0]}) == []  # not solved before: nothing to lose
    assert family_losses({"n2 *": [0.5, 0.4]}) == []  # 0.10 is allowed


@pytest.mark.parametrize("track", sorted(TRACKS))
@pytest.mark.parametrize("quick", [False, True])
def test_every_plan_gives_stages_their_checks_accept(quick: bool, track: str, tmp_path: Path) -> None:
    """A plan's sizes must fit together (e.g. the RL mini-batch must be a multiple of the micro-batch): a plan the
    checks refuse would fail only after the traces, the base eval and the SFT stage had run."""
    from keelrl.config import config_from_dict
    from keelrl.recipes.smollm2 import rl_config, sft_config
    from keelrl.stages import check_stage

    t = TRACKS[track]
    plan = t.plan.quick() if quick else t.plan
    check_stage(config_from_dict(sft_config(tmp_path / "data.jsonl", plan, seed=0, threads=1, track=t)))
    check_stage(config_from_dict(rl_config(tmp_path / "sft" / "final", plan, seed=0, threads=1, track=t)))


def test_a_quick_plan_keeps_its_tracks_rl_settings() -> None:
    """A smoke run must exercise the track's own RL stage: Multiplication's curriculum buckets would bring in 1x1
    problems, which its track leaves out, so it keeps problems in order."""
    for t in TRACKS.values():
        q = t.plan.quick()
        assert (q.rl_temperature, q.rl_curriculum, q.rl_dynamic_sampling) == (
            t.plan.rl_temperature,
            t.plan.rl_curriculum,
            t.plan.rl_dynamic_sampling,
        )
        assert q.rl_steps < t.plan.rl_steps and q.eval_problems < t.plan.eval_problems
    assert TRACKS["multiply"].plan.rl_curriculum == "" and TRACKS["countdown"].plan.rl_curriculum == "band"


def test_multiply_track_trains_on_correct_worked_products_of_train_pairs_only() -> None:
    t = TRACKS["multiply"]
    task = get_task(t.task, **t.params)
    records = t.records(task, CharTokens(), 200, 0)
    families = [t.family(r["problem"]) for r in records]
    assert families[:4] == ["2x1", "2x2", "2x1", "2x2"]  # the families alternate
    test_pairs = {tuple(sorted((p["a"], p["b"]))) for p in (task.problem("test", i) for i in range(400))}
    assert len(test_pairs) > 150  # enough distinct held-out pairs for an eval of hundreds
    for r in records:
        p = r["problem"]
        assert tuple(sorted((p["a"], p["b"]))) not in test_pairs
        assert task.score(p, r["completion"]).correct, r["completion"]


def test_multiply_track_asks_the_base_for_the_product_and_the_others_for_their_work() -> None:
    t = TRACKS["multiply"]
    trained, base = get_task(t.task, **t.params), get_task(t.base_task, **t.base_params)
    p = trained.problem("test", 1)
    assert p == base.problem("test", 1)  # the same held-out problems
    assert trained.prompt(p, "chat").user == f"What is {p['a']} * {p['b']}?"
    asked = base.prompt(p, "chat")
    assert "Write only the number" in asked.user and asked.assistant_prefix == "<answer>"
    # the answer-only prompt's answer may end at its line's end; the work it replaces may not stand in the tags
    assert base.score(p, f"<answer>{p['a'] * p['b']}\nmore").correct
    assert not base.score(p, f"<answer>{p['a']} * {p['b']} = {p['a'] * p['b']}</answer>").correct
    assert not trained.score(p, f"{p['a'] * p['b']}").correct  # the trained prompt needs the answer block
