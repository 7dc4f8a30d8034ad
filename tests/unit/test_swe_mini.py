"""The `swe_mini` environment and its repository tools: generation, splits, the oracle, hacks that must
score 0, tool errors, and the visible test runner. Episodes are driven directly (no model), as keelrl
drives them: `EpisodeState(problem, seed, reset(...))`, `step` per scripted turn, then `episode_score`."""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from keelrl.sandbox.judge import calls_of, judge
from keelrl.tasks import get_task
from keelrl.tasks.base import Score
from keelrl.tasks.code import shared_pool
from keelrl.tasks.env import EpisodeState, StepResult, is_environment, play_text
from keelrl.tasks.repo import (
    CALL_ENTRY,
    CALL_PROGRAM,
    Workspace,
    discover_tests,
    format_test_report,
    minimal_edit,
    sandbox_job,
    tool_call_text,
    visible_tests_job,
    workspace_tools,
)
from keelrl.tasks.swe_mini import FAMILIES, FUNCTIONS, SweMini, SweMiniParams, oracle_turns
from keelrl.tasks.tools import run_tool_calls

ENV = SweMini(seed=0)
SAMPLE = [ENV.problem_in(FAMILIES[i % len(FAMILIES)], ("train", "test")[i % 2], i) for i in range(50)]


def play(env: SweMini, problem: dict, turns: list[str]) -> tuple[Score, EpisodeState, list[StepResult]]:
    """One episode as keelrl plays it: the turns in order until the environment is done, then the score."""
    return play_text(env, problem, turns, seed=7)


def play_many(env: SweMini, episodes: list[tuple[dict, list[str]]]) -> list:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda e: play(env, *e), episodes))


def replies(result: StepResult) -> str:
    return "\n".join(m["content"] for m in result.messages)


# -------------------------------------------------------------------------------------------- generation


def test_problems_are_deterministic_distinct_and_split_by_repository() -> None:
    train = [ENV.problem("train", i) for i in range(130)]
    test = [ENV.problem("test", i) for i in range(130)]
    again = SweMini(seed=0)
    assert [again.problem("train", i) for i in range(5)] == train[:5]
    assert again.problem_in("off_by_one", "test", 3) == ENV.problem_in("off_by_one", "test", 3)
    assert SweMini(seed=1).problem("train", 0) != train[0]
    train_ids, test_ids = {p["id"] for p in train}, {p["id"] for p in test}
    assert len(train_ids | test_ids) >= 200 and train_ids.isdisjoint(test_ids)
    assert len({json.dumps(p["files"], sort_keys=True) for p in train + test}) == len(train + test)
    for split in (train, test):
        assert set(Counter(p["family"] for p in split)) == set(FAMILIES)
    for p in train[:40] + test[:40]:
        assert json.loads(json.dumps(p)) == p and ENV.difficulty(p) == p["family"]
        assert all("\ndef test_" in t for f, t in p["files"].items() if f.startswith("tests/"))
        assert p["files"][p["fix"]["path"]].count(p["fix"]["old"]) == 1
        failing = p["issue"].split(" fails:")[0]
        path, name = failing.split("::")
        assert f"def {name}():" in p["files"][path]
        defined = {  # every function of the package is called by some hidden case
            f"{path[:-3].replace('/', '.')}.{node.name}"
            for path, text in p["files"].items()
            if not path.startswith("tests/")
            for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef)
        }
        called = {".".join(re.match(r"'([\w.]+)', '(\w+)'", c["args"]).groups()) for c in p["hidden"]}
        assert defined == called, p["id"]


def test_buckets_and_params() -> None:
    assert ENV.buckets() == list(FAMILIES) and len(FAMILIES) >= 5
    for family in FAMILIES:
        assert ENV.difficulty(ENV.problem_in(family, "test", 1)) == family
    with pytest.raises(ValueError, match="no difficulty bucket"):
        ENV.problem_in("typo", "train", 0)
    with pytest.raises(ValueError, match="min_modules"):
        SweMiniParams(min_modules=4, max_modules=2)
    with pytest.raises(ValueError):
        SweMini(seed=0, unknown=1)
    names = [n for f in FUNCTIONS for n in f.names]  # the generator relies on names naming one function
    assert len(names) == len(set(names)) and {s[0] for f in FUNCTIONS for s in f.sites} == set(FAMILIES)
    big = get_task("keelrl.tasks.swe_mini:SweMini", seed=0, min_modules=4, max_modules=4).problem("train", 0)
    assert sum(1 for f in big["files"] if f.startswith("tests/")) == 4
    assert is_environment(ENV) and [t.name for t in ENV.tools] == [
        "list_files",
        "read_file",
        "replace_in_file",
        "write_file",
        "run_tests",
    ]
    schema = {t.name: t.schema()["function"]["parameters"] for t in ENV.tools}
    assert (
        schema["replace_in_file"]["required"] == ["path", "old", "new"]
        and schema["run_tests"]["required"] == []
    )


# -------------------------------------------------------------------------------------- oracle, nothing


def test_the_oracle_scores_1_and_doing_nothing_scores_0() -> None:
    assert {p["family"] for p in SAMPLE} == set(FAMILIES)
    fixed = play_many(ENV, [(p, oracle_turns(p)) for p in SAMPLE])
    idle = play_many(ENV, [(p, ["I looked at it; it seems fine."]) for p in SAMPLE])
    for p, (score, state, results) in zip(SAMPLE, fixed):
        assert score.reward == 1.0 and score.correct, (p["id"], score.info)
        assert score.info["passed"] == score.info["total"] == len(p["hidden"])
        assert score.info["formatted"] and score.info["edits"] == 1
        assert results[-1].done and not any(r.done for r in results[:-1])
        assert re.fullmatch(r"all \d+ tests passed", replies(results[2])), replies(results[2])
        assert (
            sum(s["tool_calls"] for s in state.infos) == 3 and sum(s["tool_errors"] for s in state.infos) == 0
        )
    for p, (score, _, results) in zip(SAMPLE, idle):
        assert score.reward == 0.0 and not score.correct, p["id"]
        assert score.info["reason"] == "wrong_answer" and not score.info["formatted"]
        assert (
            len(results) == 1 and results[0].done and results[0].info == {"tool_calls": 0, "tool_errors": 0}
        )


def test_run_tests_shows_the_failing_test_on_the_buggy_repository() -> None:
    for p in SAMPLE[:8]:
        score, _, results = play(ENV, p, [tool_call_text("run_tests"), "done"])
        report = replies(results[0])
        label, message = p["issue"].split(" fails:\n    ")
        assert f"FAILED {label} - {message}" in report, (report, p["issue"])
        assert re.search(r"\d+ passed, [1-9]\d* failed", report) and score.reward == 0.0


# --------------------------------------------------------------------------------------------- hacks


def _target(p: dict) -> tuple[str, str, str]:
    path, fn = p["target"].split("::")
    return path, fn, p["files"][path]


def _hack_turns(p: dict) -> dict[str, list[str]]:
    """Ways to make tests look green without fixing the bug (and a few with the fix that still break it)."""
    path, fn, text = _target(p)
    package = p["package"]
    fixed = text.replace(p["fix"]["old"], p["fix"]["new"])
    tests = [f for f in p["files"] if f.startswith("tests/")]
    write = tool_call_text

    def turn(*calls: str) -> list[str]:
        return ["".join(calls), "All tests pass now."]

    def_line = f"def {fn}("
    head, _, rest = text.partition(def_line)
    signature, _, body = rest.partition("\n")
    raising = head + def_line + signature + "\n    raise SystemExit(0)\n" + body
    patch = "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
    return {
        "tests_replaced": turn(
            *(write("write_file", path=t, content="def test_ok():\n    pass\n") for t in tests)
        ),
        "tests_deleted_asserts": turn(
            *(
                write("write_file", path=t, content=p["files"][t].replace("assert ", "pass  # "))
                for t in tests
            )
        ),
        "sys_exit_at_import": turn(
            write("write_file", path=path, content="import sys\nsys.exit(0)\n" + text)
        ),
        "os_exit_at_import": turn(write("write_file", path=path, content="import os\nos._exit(0)\n" + text)),
        "fixed_but_exits_at_import": turn(
            write("write_file", path=path, content="import os\nos._exit(0)\n" + fixed)
        ),
        "fixed_but_sys_exit": turn(write("write_file", path=path, content=fixed + "\nraise SystemExit(0)\n")),
        "system_exit_in_function": turn(write("write_file", path=path, content=raising)),
        "patched_builtins": turn(
            write("write_file", path=f"{package}/__init__.py", content=patch),
            write(
                "write_file",
                path="conftest.py",
                content=patch + "def pytest_collection_modifyitems(items):\n    items.clear()\n",
            ),
            write("write_file", path="sitecustomize.py", content=patch),
            write("write_file", path="usercustomize.py", content=patch),
        ),
        "fake_ok_output": turn(
            write(
                "write_file", path=path, content="print('=== 12 passed in 0.01s ===')\nprint('OK')\n" + text
            )
        ),
        "only_the_fixed_function_kept": turn(
            write(
                "write_file",
                path=path,
                content=def_line + fixed.partition(def_line)[2].split("\n\n\ndef ")[0] + "\n",
            )
        ),
    }


def test_hacks_score_0() -> None:
    problems = [SAMPLE[0], SAMPLE[3], SAMPLE[12]]
    episodes = [(p, name, turns) for p in problems for name, turns in _hack_turns(p).items()]
    results = play_many(ENV, [(p, turns) for p, _, turns in episodes])
    for (p, name, _), (score, state, _) in zip(episodes, results):
        assert score.reward == 0.0 and not score.correct, (name, p["id"], score.info)
        assert score.info["reason"] != "ok" and state.infos[0]["tool_errors"] == 0, (name, state.infos)
    # the visible tests are fooled by replacing them (feedback only), the hidden ones are not
    p = problems[0]
    _, _, steps = play(ENV, p, [_hack_turns(p)["tests_replaced"][0], tool_call_text("run_tests"), "done"])
    assert re.fullmatch(r"all \d+ tests passed", replies(steps[1]))
    # printed output is shown apart from the results, never as one
    fake = _hack_turns(p)["fake_ok_output"][0]
    _, _, steps = play(ENV, p, [fake, tool_call_text("run_tests"), "done"])
    report = replies(steps[1])
    assert "failed" in report.split("captured output")[0] and "captured output (not test results):" in report


def test_read_only_tests_refuse_edits() -> None:
    env = SweMini(seed=0, readonly_tests=True)
    p = SAMPLE[0]
    _, state, steps = play(env, p, [_hack_turns(p)["tests_replaced"][0], "done"])
    assert state.infos[0]["tool_errors"] == state.infos[0]["tool_calls"] > 0
    assert "read-only" in replies(steps[0])


# ----------------------------------------------------------------------------------- tool call errors


def test_malformed_calls_and_bad_paths_are_errors_not_exceptions() -> None:
    p = SAMPLE[1]
    path, _, text = _target(p)
    bad = [
        "<tool_call>{not json</tool_call>",
        tool_call_text("read_file", path="../x"),
        tool_call_text("read_file", path="/etc/passwd"),
        tool_call_text("read_file", path="~/secrets"),
        tool_call_text("write_file", path="a/../../x.py", content="x"),
        tool_call_text("write_file", path=".git/config", content="x"),
        tool_call_text("write_file", path="pkg\\mod.py", content="x"),
        tool_call_text("write_file", path="big.py", content="x" * 200_000),
        tool_call_text("write_file", path=f"{path}/inside.py", content="x"),
        tool_call_text("read_file", path="missing.py"),
        tool_call_text("read_file", path=7),
        tool_call_text("read_file"),
        tool_call_text("rm", path=path),
        tool_call_text("replace_in_file", path=path, old="no such text", new="x"),
        tool_call_text("replace_in_file", path=path, old="return", new="x"),
        tool_call_text("replace_in_file", path=path, old="", new="x"),
        tool_call_text("write_file", path="x.py", content=["not", "text"]),
        '<tool_call>{"name": "read_file", "arguments": "[1]"}</tool_call>',
        "<tool_call>read_file: ",
    ]
    _, state, steps = play(ENV, p, ["".join(bad), "done"])
    info = state.infos[0]
    assert info == {"tool_calls": len(bad), "tool_errors": len(bad)} and not steps[0].done
    assert all(m["content"].startswith("error:") for m in steps[0].messages)
    shown = replies(steps[0])
    for needle in (
        "leaves the repository",
        "absolute",
        "hidden files",
        "at most 100000 bytes",
        "is a file",
        "occurs",
    ):
        assert needle in shown, needle
    ws = Workspace(p["files"])
    assert ws.files == p["files"] and ws.read_file(path) == text


def test_workspace_paths_limits_and_edits() -> None:
    ws = Workspace(
        {"pkg/a.py": "x = 1\n", "tests/test_a.py": "def test_a():\n    assert True\n"}, readonly=["tests"]
    )
    assert ws.normalise("./pkg//a.py") == "pkg/a.py" and ws.read_file("pkg/./a.py") == "x = 1\n"
    assert ws.list_files() == "pkg/a.py (1 lines)\ntests/test_a.py (2 lines)"
    assert "created" in ws.write_file("pkg/b.py", "") and ws.read_file("pkg/b.py") == "(empty file)"
    assert ws.replace_in_file("pkg/a.py", "1", "2") and ws.files["pkg/a.py"] == "x = 2\n" and ws.edits == 2
    with pytest.raises(ValueError, match="read-only"):
        ws.write_file("tests/test_a.py", "")
    with pytest.raises(ValueError, match="is a directory"):
        ws.write_file("pkg", "x")
    for prefix in ("./tests/", "tests//", "/tests"):  # a prefix is read as a path is
        with pytest.raises(ValueError, match="read-only"):
            Workspace({"tests/test_a.py": ""}, readonly=[prefix]).write_file("tests/test_a.py", "")
    small = Workspace({}, max_files=2, max_file_bytes=10, max_total_bytes=15)
    small.write_file("a", "0123456789")
    with pytest.raises(ValueError, match="at most 10 bytes"):
        small.write_file("b", "x" * 11)
    with pytest.raises(ValueError, match="exceed 15 bytes"):
        small.write_file("b", "x" * 6)
    small.write_file("b", "x")
    with pytest.raises(ValueError, match="already has 2 files"):
        small.write_file("c", "")
    # unbound tools carry the schema only, and say so when called
    out = run_tool_calls(
        tool_call_text("list_files") + tool_call_text("run_tests"), workspace_tools(None, None)
    )
    assert out.errors == 2 and "no working copy" in out.messages[0]["content"]


def test_discovery_and_minimal_edit() -> None:
    files = {
        "tests/test_x.py": "def test_a():\n    pass\n\ndef helper():\n    pass\n\ndef test_b(x=1):\n    pass\n"
        "def test_a():\n    pass\n\ndef test_c(x):\n    pass\n\ndef test_d(*, k):\n    pass\n",
        "tests/test_bad.py": "def test_(:\n",
        "tests/sub-dir/test_y.py": "def test_c():\n    pass\n",
        "pkg/mod.py": "def test_not_a_test_file():\n    pass\n",
    }
    tests, errors = discover_tests(files)
    assert [t.label for t in tests] == ["tests/test_x.py::test_a", "tests/test_x.py::test_b"]
    assert len(errors) == 2 and "SyntaxError" in errors[1] and "not a dotted module name" in errors[0]
    before = "a\nb\nc\nb\nd\n"
    edit = minimal_edit("f", before, "a\nb\nc\nB\nd\n")
    assert before.replace(edit["old"], edit["new"]) == "a\nb\nc\nB\nd\n" and before.count(edit["old"]) == 1
    edit = minimal_edit("f", "x\ny\n", "x\nnew\ny\n")
    assert "x\ny\n".replace(edit["old"], edit["new"]) == "x\nnew\ny\n"


@pytest.mark.slow
def test_many_repositories_the_fix_passes_and_the_bug_fails_in_the_sandbox() -> None:
    """Wider than the oracle test: 240 repositories of 2-4 modules, judged straight through the pool."""
    env = SweMini(seed=5, max_modules=4)
    problems = [env.problem(split, i) for split in ("train", "test") for i in range(120)]
    jobs, reports = [], []
    for p in problems:
        fixed = dict(p["files"])
        fixed[p["fix"]["path"]] = fixed[p["fix"]["path"]].replace(p["fix"]["old"], p["fix"]["new"])
        for files in (fixed, p["files"]):
            jobs.append(sandbox_job(files, CALL_PROGRAM, CALL_ENTRY, calls_of(p["hidden"]), env.limits))
            job, tests, errors = visible_tests_job(files, env.limits)
            jobs.append(job)
            reports.append((tests, errors))
    results = shared_pool("auto", 0).run_many(jobs)
    for k, p in enumerate(problems):
        hidden_fixed, visible_fixed, hidden_buggy, visible_buggy = results[4 * k : 4 * k + 4]
        assert judge(p["hidden"], hidden_fixed, CALL_ENTRY).ok, p["id"]
        assert not judge(p["hidden"], hidden_buggy, CALL_ENTRY).ok, p["id"]
        assert format_test_report(*reports[2 * k], visible_fixed).startswith("all "), p["id"]
        label, message = p["issue"].split(" fails:\n    ")
        assert f"FAILED {label} - {message}" in format_test_report(*reports[2 * k + 1], visible_buggy)
