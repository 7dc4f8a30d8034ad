"""keelrl judge: a session from real tiny models (every model pair on every problem, sides balanced, verdicts
from the task), its HTTP API (votes stored as sides say, nothing names a model, bad requests get 400, a
restarted server resumes), results against a hand computation, and the preference export."""

from __future__ import annotations

import json
import math
import shutil
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from keelrl.cli.main import main
from keelrl.judge import session as judge_session
from keelrl.judge.server import JudgeServer
from keelrl.judge.session import JudgeError, create_session, export_preferences, render_results, results
from keelrl.judge.store import JudgeStore, Pair
from keelrl.tasks import get_task

PROBLEMS = 4
SETTINGS = {"task": "multiply", "problems": PROBLEMS, "max_new_tokens": 12, "seed": 5}


@pytest.fixture(scope="module")
def models(
    tiny_model_dir: Path, format_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """Three models: a random tiny one, one pretrained on the answer format, and a copy of the first."""
    copy = tmp_path_factory.mktemp("copy") / "tiny_copy"
    shutil.copytree(tiny_model_dir, copy)
    return [str(tiny_model_dir), str(format_model_dir), str(copy)]


@pytest.fixture(scope="module")
def session(models: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("judge") / "session"
    create_session(models, out=out, device="cpu", **SETTINGS)
    return out


def http(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict[str, Any], str]:
    """(status, JSON, raw text) of a GET, or of a POST when `body` / `raw` is given."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            text = res.read().decode()
            return res.status, json.loads(text), text
    except urllib.error.HTTPError as err:
        text = err.read().decode()
        return err.code, json.loads(text), text


def test_session_pairs_every_two_models_on_every_problem(session: Path, models: list[str]):
    store = JudgeStore(session / "session.sqlite")
    meta, pairs = store.meta(), store.pairs()
    assert meta["models"] == {"A": models[0], "B": models[1], "C": models[2]}
    assert meta["settings"]["temperature"] == 0.0 and meta["settings"]["max_new_tokens"] == 12
    assert len(pairs) == 3 * PROBLEMS
    assert Counter((p.model_a, p.model_b) for p in pairs) == {("A", "B"): 4, ("A", "C"): 4, ("B", "C"): 4}
    # sides balanced per model pair: half the pairs show A on the left
    for key in [("A", "B"), ("A", "C"), ("B", "C")]:
        assert sum(p.a_on_left for p in pairs if (p.model_a, p.model_b) == key) == PROBLEMS // 2
    # the order is shuffled (not problem by problem), and every problem appears with every model pair
    assert [p.problem_index for p in pairs] != sorted(p.problem_index for p in pairs)
    task = get_task("multiply")
    for p in pairs:
        assert p.problem == task.problem("test", p.problem_index)
        assert p.prompt == task.prompt(p.problem, "compact").user
        # the stored verdicts are the task's own on the stored texts (prefix included)
        assert p.correct_a == task.score(p.problem, p.text_a).correct
        assert p.correct_b == task.score(p.problem, p.text_b).correct
    # greedy with shared seeds: a model and its copy write the same completion on each problem
    by = {(p.problem_index, m): t for p in pairs for m, t in ((p.model_a, p.text_a), (p.model_b, p.text_b))}
    assert all(by[(i, "A")] == by[(i, "C")] for i in range(PROBLEMS))
    assert any(by[(i, "A")] != by[(i, "B")] for i in range(PROBLEMS))
    assert any("<answer>" in by[(i, "B")] for i in range(PROBLEMS))  # the format model answers in format


def test_session_resumes_and_refuses_other_models_or_settings(session: Path, models: list[str], monkeypatch):
    def no_generation(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a resumed session must not generate again")

    monkeypatch.setattr(judge_session, "generate_completions", no_generation)
    before = JudgeStore(session / "session.sqlite").pairs()
    assert create_session(models, out=session, device="cpu", **SETTINGS).pairs() == before
    with pytest.raises(JudgeError, match="made for models"):
        create_session(models[::-1], out=session, **SETTINGS)
    with pytest.raises(JudgeError, match=r"other settings \(temperature: session 0.0 vs now 0.7\)"):
        create_session(models, out=session, **{**SETTINGS, "temperature": 0.7})
    with pytest.raises(JudgeError, match="at least two models"):
        create_session(models[:1], out=session, **SETTINGS)
    with pytest.raises(JudgeError, match="names one twice"):
        create_session([models[0], models[0]], out=session, **SETTINGS)


def test_api_votes_by_side_never_names_models_and_resumes_after_restart(session: Path, models: list[str]):
    store = JudgeStore(session / "session.sqlite")
    pairs = {p.id: p for p in store.pairs()}
    todo = [i for i, p in pairs.items() if not p.identical]  # A and its copy C write the same: never shown
    assert len(todo) == len(pairs) - PROBLEMS
    judge_name = "api-test"
    with JudgeServer(session) as server:
        with urllib.request.urlopen(server.url, timeout=30) as res:
            html = res.read().decode()
        assert res.status == 200 and "keelrl judge" in html
        assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere
        status, state, text = http(f"{server.url}api/state?judge={judge_name}")
        assert status == 200 and state["done"] == 0 and state["total"] == len(todo)
        assert set(state["pair"]) == {"id", "problem", "prompt", "left", "right"}
        for leak in [*models, "model", "correct", "a_on_left", '"A"', '"B"']:
            assert leak not in text
        choices = ["left", "right", "tie", "skip", "left"]
        for k, choice in enumerate(choices):
            shown = state["pair"]
            assert shown["id"] == todo[k]
            p = pairs[shown["id"]]
            assert (shown["left"], shown["right"]) == (
                (p.text_a, p.text_b) if p.a_on_left else (p.text_b, p.text_a)
            )
            status, state, _ = http(
                f"{server.url}api/vote", {"judge": judge_name, "pair_id": p.id, "choice": choice}
            )
            assert status == 200
            # committed before the answer: a fresh reader sees it now
            vote = JudgeStore(session / "session.sqlite").votes(judge_name)[-1]
            want = choice if choice in ("tie", "skip") else "a" if (choice == "left") == p.a_on_left else "b"
            assert (vote.pair_id, vote.outcome) == (p.id, want)
        assert state["done"] == 5
        status, state, _ = http(f"{server.url}api/undo", {"judge": judge_name})
        assert status == 200 and state["done"] == 4 and state["undone"] == state["pair"]["id"] == todo[4]
        status, verdict, _ = http(f"{server.url}api/verdict?pair={todo[4]}&judge={judge_name}")
        p4 = pairs[todo[4]]
        assert verdict == {
            "id": todo[4],
            "left": p4.correct_a if p4.a_on_left else p4.correct_b,
            "right": p4.correct_b if p4.a_on_left else p4.correct_a,
        }
        # the vote that follows is stored as cast with the verdict seen; the earlier ones without
        assert (
            http(f"{server.url}api/vote", {"judge": judge_name, "pair_id": todo[4], "choice": "tie"})[0]
            == 200
        )
        assert [v.verdict_seen for v in store.votes(judge_name)] == [False] * 4 + [True]
        assert http(f"{server.url}api/undo", {"judge": judge_name})[0] == 200
    # a new server on the same session: the judge resumes at their first pair without a vote
    with JudgeServer(session) as again:
        status, state, _ = http(f"{again.url}api/state?judge={judge_name}")
        assert status == 200 and state["done"] == 4 and state["pair"]["id"] == todo[4]
        assert [v.outcome for v in store.votes(judge_name)] == [
            "a" if pairs[todo[0]].a_on_left else "b",
            "b" if pairs[todo[1]].a_on_left else "a",
            "tie",
            "skip",
        ]
        http(f"{again.url}api/undo", {"judge": judge_name})
        http(f"{again.url}api/undo", {"judge": judge_name})
        http(f"{again.url}api/undo", {"judge": judge_name})
        status, state, _ = http(f"{again.url}api/undo", {"judge": judge_name})
        assert state["done"] == 0 and state["undone"] == todo[0]
        status, state, _ = http(f"{again.url}api/undo", {"judge": judge_name})
        assert status == 200 and state["undone"] is None


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("api/state", None, "judge name is required"),
        ("api/state?judge=%20%20", None, "judge name is required"),
        ("api/vote", {"pair_id": 0, "choice": "left"}, "judge name is required"),
        ("api/vote", {"judge": "x", "pair_id": 999, "choice": "left"}, "no pair 999"),
        ("api/vote", {"judge": "x", "pair_id": "zero", "choice": "left"}, "must be an integer"),
        ("api/vote", {"judge": "x", "pair_id": 0, "choice": "a"}, "choice must be one of left, right"),
        ("api/vote", {"judge": "x" * 81, "pair_id": 0, "choice": "left"}, "at most 80"),
        ("api/vote", b"not json", "not JSON"),
        ("api/vote", [1, 2], "JSON object"),
        ("api/undo", {}, "judge name is required"),
        ("api/verdict?pair=-3&judge=x", None, "no pair -3"),
        ("api/verdict?pair=1", None, "judge name is required"),
    ],
)
def test_bad_requests_get_400_with_a_message(session: Path, path: str, body: Any, message: str):
    with JudgeServer(session) as server:
        raw = body if isinstance(body, bytes) else None
        status, data, _ = http(server.url + path, None if raw else body, raw)
        assert status == 400 and message in data["error"]
        assert http(server.url + "api/nothing")[0] == 404
    assert not any(v.judge == "x" for v in JudgeStore(session / "session.sqlite").votes())


def fixed_session(tmp_path: Path) -> Path:
    """A session without models: 4 A-vs-B pairs and 2 B-vs-C pairs with known verdicts."""
    store = JudgeStore(tmp_path / "session.sqlite")
    rows = [  # (model_a, model_b, correct_a, correct_b, a_on_left)
        ("A", "B", True, False, True),
        ("A", "B", True, False, False),
        ("A", "B", False, True, True),
        ("A", "B", True, True, False),
        ("B", "C", True, False, True),
        ("B", "C", False, False, False),
    ]
    store.add_pairs(
        [
            Pair(i, i, {"a": i, "b": 2}, f"{i}*2", ma, mb, f"text {ma}{i}", f"text {mb}{i}", ca, cb, left)
            for i, (ma, mb, ca, cb, left) in enumerate(rows)
        ]
    )
    store.set_meta(
        models={"A": "runs/x/final", "B": "runs/y/final", "C": "base"},
        settings={"task": "multiply"},
        created=1.0,
    )
    ann = ["a", "a", "b", "tie", "a", "skip"]
    bob = ["a", "b", "b", "tie", "a", "tie"]
    for i, (x, y) in enumerate(zip(ann, bob)):
        store.vote(i, "ann", x, now=10.0 + i)
        store.vote(i, "bob", y, now=20.0 + i)
    return tmp_path


def wilson(wins: float, n: int) -> tuple[float, float]:
    z = 1.959963984540054
    p = wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_results_match_a_hand_computation(tmp_path: Path):
    res = results(fixed_session(tmp_path), resamples=100)
    assert res["votes"] == 12 and res["judges"] == ["ann", "bob"]
    assert res["outcomes"] == {"a": 5, "b": 3, "tie": 3, "skip": 1}
    ab = next(p for p in res["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    # A vs B: ann a, a, b, tie; bob a, b, b, tie -> A wins 3, ties 2, loses 3: rate (3 + 1) / 8
    assert (ab["wins"], ab["ties"], ab["losses"], ab["n"]) == (3, 2, 3, 8)
    assert ab["rate"] == pytest.approx(0.5)
    assert (ab["lo"], ab["hi"]) == pytest.approx(wilson(4, 8))
    assert ab["name_a"] == "runs/x/final"
    bc = next(p for p in res["pairwise"] if (p["a"], p["b"]) == ("B", "C"))
    # B vs C: ann a (skip left out); bob a, tie -> 2.5 / 3
    assert (bc["wins"], bc["ties"], bc["n"]) == (2, 1, 3) and bc["rate"] == pytest.approx(2.5 / 3)
    assert (bc["lo"], bc["hi"]) == pytest.approx(wilson(2.5, 3))
    # B beats C clearly and ties A on the whole: A and B above C
    assert [r["model"] for r in res["ranking"]][2] == "C"
    assert {r["name"] for r in res["ranking"]} == {"runs/x/final", "runs/y/final", "base"}
    # judges agree on pairs 0, 2, 3, 4 of the 5 both voted on (pair 5: ann skipped)
    assert res["judge_agreement"] == {"agreement": pytest.approx(4 / 5), "judge_pairs": 5.0}
    # the verifier accepted exactly one side on pairs 0, 1, 2, 4; people's votes there (A-outcome value
    # when A was the accepted one, else 1 - value): ann 1, 1, 1, 1; bob 1, 0, 1, 1 -> 7 / 8
    assert res["verifier_agreement"] == {"agreement": pytest.approx(7 / 8), "votes": 8.0}
    # the verifier's accuracy per model over the pairs it appears in: A 3 / 4, B 3 / 6, C 0 / 2
    assert res["verifier_accuracy"] == {"A": 0.75, "B": 0.5, "C": 0.0}
    text = render_results(res)
    assert "A vs B: 0.50" in text and "runs/x/final" in text and "judges agree: 0.80" in text


def test_votes_after_seeing_the_verdict_leave_the_verifier_agreement(tmp_path: Path):
    """bob asked for the verdict on pair 1 before voting (against the verifier there): his vote counts in the
    win rates but not as evidence of agreeing (or not) with the verifier, and the export says so."""
    session = fixed_session(tmp_path)
    store = JudgeStore(session / "session.sqlite")
    store.mark_verdict_shown(1, "bob")
    store.vote(1, "bob", "b", now=30.0)  # re-cast after seeing it
    assert [v.verdict_seen for v in store.votes() if (v.judge, v.pair_id) == ("bob", 1)] == [True]
    assert not any(v.verdict_seen for v in store.votes() if v.judge == "ann")
    res = results(session, resamples=20)
    assert res["votes_with_verdict_seen"] == 1
    # the hand count above (7 of 8) without bob's vote on pair 1 (the one that disagreed): 7 of 7
    assert res["verifier_agreement"] == {"agreement": pytest.approx(1.0), "votes": 7.0}
    ab = next(p for p in res["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    assert ab["n"] == 8  # still a vote between the models
    export_preferences(session, tmp_path / "prefs.jsonl")
    seen = [
        json.loads(x)["metadata"]["verdict_seen"] for x in (tmp_path / "prefs.jsonl").read_text().splitlines()
    ]
    assert sum(seen) == 1


def test_results_without_judge_overlap_have_no_nan(tmp_path: Path):
    store = JudgeStore(tmp_path / "session.sqlite")
    store.add_pairs([Pair(0, 0, {}, "p", "A", "B", "x", "y", None, None, True)])
    store.set_meta(models={"A": "m1", "B": "m2"}, settings={}, created=1.0)
    res = results(tmp_path, resamples=10)
    assert res["judge_agreement"]["agreement"] is None and res["verifier_agreement"]["agreement"] is None
    assert "NaN" not in json.dumps(res)
    assert "n/a" in render_results(res)


def test_export_writes_one_line_per_decided_vote(tmp_path: Path):
    session = fixed_session(tmp_path / "s")
    n = export_preferences(session, tmp_path / "prefs.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "prefs.jsonl").read_text().splitlines()]
    assert n == len(lines) == 8  # 5 a + 3 b; ties and skips left out
    first = lines[0]  # ann's vote on pair 0: a
    assert first["prompt"] == "0*2" and first["chosen"] == "text A0" and first["rejected"] == "text B0"
    meta = first["metadata"]
    assert meta["judge"] == "ann" and meta["pair_id"] == 0 and meta["time"] == 10.0
    assert (meta["chosen_model"], meta["rejected_model"]) == ("runs/x/final", "runs/y/final")
    assert meta["verifier"] == {"chosen_correct": True, "rejected_correct": False}
    assert (
        meta["chosen_side"] == "left" and meta["problem"] == {"a": 0, "b": 2} and meta["task"] == "multiply"
    )
    b_vote = next(x for x in lines if x["metadata"]["judge"] == "ann" and x["metadata"]["pair_id"] == 2)
    assert (b_vote["chosen"], b_vote["rejected"]) == ("text B2", "text A2")
    assert b_vote["metadata"]["chosen_side"] == "right"


def test_cli_results_json_export_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    session = fixed_session(tmp_path / "s")
    assert main(["judge", "--results", str(session), "--json", "--export", str(tmp_path / "p.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "wrote 8 preference pairs" in out
    assert json.loads(out[out.index("{") :])["votes"] == 12
    assert main(["judge", "--results", str(tmp_path / "missing")]) == 2
    assert "no judge session at" in capsys.readouterr().err
    assert main(["judge", "m1", "m2"]) == 2
    assert "--task is required" in capsys.readouterr().err


def test_an_environment_session_stores_role_tagged_turns(tmp_path: Path, char_tokenizer):
    """A multi-turn task's completions are written as role-tagged turns, which the page shows turn by turn."""
    from keelrl.config import TinyModelConfig
    from keelrl.models.load import build_tiny_model, save_hf_dir

    paths = []
    for seed in (1, 2):
        config = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=256, init_seed=seed)
        model = build_tiny_model(config, len(char_tokenizer), char_tokenizer.eos_token_id)
        save_hf_dir(model, char_tokenizer, tmp_path / f"m{seed}")
        paths.append(str(tmp_path / f"m{seed}"))
    store = create_session(paths, "countdown_tools", 2, tmp_path / "s", max_new_tokens=6, device="cpu")
    pairs = store.pairs()
    assert len(pairs) == 2
    for p in pairs:
        assert "Tools:" in p.prompt and "calc(" in p.prompt  # the environment's opening, decoded
        for text in (p.text_a, p.text_b):
            assert text.startswith("<|im_start|>assistant\n") and text.endswith("<|im_end|>")


def test_identical_pairs_are_ties_nobody_is_asked_about_and_never_exported(tmp_path: Path):
    """Two more pairs whose sides say the same (one up to whitespace): never served, each one tie in the win
    rates, refused as a vote, and left out of the export even when an old session holds a vote on one."""
    session = fixed_session(tmp_path)
    store = JudgeStore(session / "session.sqlite")
    store.add_pairs([
        Pair(6, 6, {"a": 6}, "6*2", "A", "B", "<answer>12</answer>", "<answer>12</answer>", True, True, True),
        Pair(7, 7, {"a": 7}, "7*2", "B", "C", "<answer>14</answer>\n", " <answer>14</answer>", True, True, False),
    ])  # fmt: skip
    store.vote(6, "ann", "a", now=40.0)  # cast before identical pairs were skipped
    assert [p.identical for p in store.pairs()] == [False] * 6 + [True, True]
    assert store.next_pair("cy") == 0 and store.next_pair("ann") is None  # ann has judged every other pair
    res = results(session, resamples=20)
    assert res["identical_pairs"] == 2 and res["finished"] is True
    ab = next(p for p in res["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    # the hand count above (A wins 3, ties 2, loses 3) plus pair 6 as one tie; ann's vote on it left out
    assert (ab["wins"], ab["ties"], ab["losses"], ab["n"]) == (3, 3, 3, 9) and ab["rate"] == pytest.approx(
        0.5
    )
    bc = next(p for p in res["pairwise"] if (p["a"], p["b"]) == ("B", "C"))
    assert (bc["wins"], bc["ties"], bc["n"]) == (2, 2, 4)
    assert "recorded as ties without asking: 2" in render_results(res)
    n = export_preferences(session, tmp_path / "prefs.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "prefs.jsonl").read_text().splitlines()]
    assert n == len(lines) == 8 and all(x["chosen"].split() != x["rejected"].split() for x in lines)
    with JudgeServer(session) as server:
        status, state, _ = http(f"{server.url}api/state?judge=cy")
        assert state["total"] == 6 and state["pair"]["id"] == 0
        status, data, _ = http(f"{server.url}api/vote", {"judge": "cy", "pair_id": 6, "choice": "left"})
        assert status == 400 and "identical texts" in data["error"]
    assert not any(v.judge == "cy" for v in store.votes())


def test_results_name_no_model_until_every_judge_has_finished(tmp_path: Path):
    """/api/results while bob is midway: progress only, no model name, label or outcome; the same call once he
    has finished: the full results."""
    session = fixed_session(tmp_path)
    store = JudgeStore(session / "session.sqlite")
    assert [store.undo("bob") for _ in range(3)] == [5, 4, 3]  # bob has judged pairs 0-2 only
    with JudgeServer(session) as server:
        status, data, text = http(f"{server.url}api/results")
        assert status == 200
        assert data == {"finished": False, "progress": {"ann": 6, "bob": 3}, "total": 6, "identical_pairs": 0}
        for leak in ("runs/", "base", '"A"', "ranking", "pairwise"):
            assert leak not in text
        for pid, outcome in ((3, "tie"), (4, "left"), (5, "tie")):
            assert (
                http(f"{server.url}api/vote", {"judge": "bob", "pair_id": pid, "choice": outcome})[0] == 200
            )
        status, data, text = http(f"{server.url}api/results")
        assert status == 200 and data["finished"] is True and "runs/x/final" in text
        assert [r["name"] for r in data["ranking"]][2] == "base"
