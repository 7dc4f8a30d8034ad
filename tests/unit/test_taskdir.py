"""Task directories in Harbor's layout (tasks/taskdir.py): loading, splits, the verifier run in the sandbox
(exit status and reward file), and what the model can and cannot see or change."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelrl.tasks import TaskError, get_task
from keelrl.tasks.env import EpisodeState, episode_score, is_environment, play_text
from keelrl.tasks.repo import tool_call_text
from keelrl.tasks.taskdir import TaskDirError, TaskDirs

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef double(x):\n    return 2 * x\n"
CHECK = (
    "import sys\nsys.path.insert(0, '.')\nimport mathx\n"
    "assert mathx.add(2, 3) == 5, 'add'\nassert mathx.double(4) == 8, 'double'\nprint('checks passed')\n"
)
SCORE = (  # writes the share of checks that pass to $REWARD_FILE
    "import os, sys\nsys.path.insert(0, '.')\nimport mathx\n"
    "ok = [mathx.add(2, 3) == 5, mathx.double(4) == 8]\n"
    "open(os.environ['REWARD_FILE'], 'w').write(str(sum(ok) / len(ok)))\n"
)


def make_task(root: Path, name: str, reward_file: bool = False, difficulty: str = "easy") -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text(f"Task {name}: add() in mathx.py subtracts. Fix it.")
    (d / "task.toml").write_text(f'[verifier]\ntimeout_sec = 20\n[metadata]\ndifficulty = "{difficulty}"\n')
    (d / "environment" / "mathx.py").write_text(BUGGY)
    (d / "environment" / "test_mathx.py").write_text(
        "import mathx\n\n\ndef test_add():\n    assert mathx.add(1, 1) == 2\n"
    )
    if reward_file:
        (d / "tests" / "score.py").write_text(SCORE)
        (d / "tests" / "test.sh").write_text('#!/bin/bash\npython3 "$TESTS_DIR/score.py"\n')
    else:
        (d / "tests" / "check.py").write_text(CHECK)
        (d / "tests" / "test.sh").write_text('#!/bin/bash\ncd "$APP_DIR" && python3 "$TESTS_DIR/check.py"\n')
    return d


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    for i in range(12):
        make_task(root, f"t{i:02d}", reward_file=i % 3 == 0, difficulty=["easy", "hard"][i % 2])
    return root


def play(env: TaskDirs, problem: dict, turns: list[str]) -> tuple[EpisodeState, list]:
    _, state, results = play_text(env, problem, turns)
    return state, results


FIX = tool_call_text("replace_in_file", path="mathx.py", old="return a - b", new="return a + b")


def test_loads_splits_and_buckets(dataset: Path) -> None:
    env = get_task(f"dir:{dataset}", seed=0, test_fraction=0.3)
    assert is_environment(env) and env.name == f"dir:{dataset.name}"
    train, test = set(env.splits["train"]), set(env.splits["test"])
    assert train and test and not train & test and train | test == {f"t{i:02d}" for i in range(12)}
    assert env.problem("train", 5) == get_task(f"dir:{dataset}", seed=0, test_fraction=0.3).problem(
        "train", 5
    )
    assert {env.problem("test", i)["task"] for i in range(len(test))} == test  # one pass visits each once
    assert env.buckets() == sorted({"easy", "hard"} & {env.difficulty({"task": n}) for n in train})
    single = get_task(f"dir:{dataset / 't01'}")
    assert single.problem("train", 0) == single.problem("test", 3) == {"task": "t01"}


def test_a_fix_passes_and_doing_nothing_fails(dataset: Path) -> None:
    env = TaskDirs(str(dataset / "t01"))
    state, results = play(env, {"task": "t01"}, [FIX, "done"])
    assert results[0].messages[0]["content"].startswith("replaced") and results[-1].done
    score = episode_score(env, state)
    assert (score.reward, score.correct, score.info["reason"]) == (1.0, True, "passed")
    assert "checks passed" in score.info["output"]
    idle, _ = play(env, {"task": "t01"}, ["I am done."])
    score = episode_score(env, idle)
    assert (score.reward, score.correct, score.info["reason"]) == (
        0.0,
        False,
        "failed",
    ) and "add" in score.info["output"]


def test_reward_file_is_read(dataset: Path) -> None:
    env = TaskDirs(str(dataset / "t00"))
    idle, _ = play(env, {"task": "t00"}, ["nothing"])
    assert episode_score(env, idle).reward == pytest.approx(0.5)  # double() passes, add() does not
    fixed, _ = play(env, {"task": "t00"}, [FIX, "done"])
    score = episode_score(env, fixed)
    assert score.reward == 1.0 and score.correct and score.info["reason"] == "reward_file"


def test_the_model_neither_sees_nor_edits_the_tests(dataset: Path) -> None:
    env = TaskDirs(str(dataset / "t01"))
    looks = [
        tool_call_text("list_files"),
        tool_call_text("read_file", path="../tests/test.sh"),
        tool_call_text("read_file", path="/work/tests/check.py"),
        tool_call_text("read_file", path="tests/test.sh"),
    ]
    _, results = play(env, {"task": "t01"}, ["".join(looks)])
    listing, *errors = (m["content"] for m in results[0].messages)
    assert "mathx.py" in listing and "test.sh" not in listing and "check.py" not in listing
    assert all(e.startswith("error:") for e in errors) and results[0].info["tool_errors"] == 3
    # writing its own tests/test.sh (exit 0) into the working copy changes nothing: the real tests are copied in
    hack = tool_call_text("write_file", path="tests/test.sh", content="#!/bin/bash\nexit 0\n")
    hack += tool_call_text("write_file", path="tests/check.py", content="print('checks passed')\n")
    state, _ = play(env, {"task": "t01"}, [hack, "done"])
    assert episode_score(env, state).reward == 0.0
    # the visible tests are the working copy's own, run in the sandbox
    _, results = play(env, {"task": "t01"}, [tool_call_text("run_tests")])
    assert "FAILED test_mathx.py::test_add" in results[0].messages[0]["content"]


def test_layout_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    (bad / "environment").mkdir(parents=True)
    (bad / "instruction.md").write_text("x")
    with pytest.raises(TaskDirError, match=r"lacks tests/test\.sh"):
        TaskDirs(str(bad))
    with pytest.raises(TaskDirError, match="does not exist"):
        TaskDirs(str(tmp_path / "nowhere"))
    binary = make_task(tmp_path / "set", "b")
    (binary / "environment" / "logo.png").write_bytes(b"\x89PNG\x00\xff")
    with pytest.raises(TaskDirError, match="text files only"):
        TaskDirs(str(binary))
    with pytest.raises(TaskError, match="test_fraction"):
        get_task(f"dir:{tmp_path / 'set'}", test_fraction=2.0)
