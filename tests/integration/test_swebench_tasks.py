"""SWE-bench-style instances (tasks/swebench.py) on the set generated from swe_mini's repositories (real git
repositories, SWE-bench's fields): the gold patch scores 1 and the unpatched repository 0, on bubblewrap in the
default suite and in containers built from the python:3.12-slim stand-in (slow: its first build installs Python);
the model cannot read the fix out of the history; test files it wrote are replaced by test_patch's; a test runner
that is missing is a verifier_error; the instance fields are checked as SWE-bench ships them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from keelrl.cli.main import main
from keelrl.sandbox.boxes import Ran
from keelrl.tasks import TaskError, get_task
from keelrl.tasks.env import play_text
from keelrl.tasks.repo import tool_call_text
from keelrl.tasks.swebench import (
    GIT_ENV,
    Instance,
    SweBench,
    SweBenchParams,
    judge_log,
    log_outcomes,
    write_swe_mini,
)


@pytest.fixture(scope="module")
def instances(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    return write_swe_mini(tmp_path_factory.mktemp("swe"), 3)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")


def test_the_generated_set_has_swebench_fields(instances: Path) -> None:
    rows = [json.loads(line) for line in instances.read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        inst = Instance.model_validate(row)
        assert isinstance(row["FAIL_TO_PASS"], str)  # a JSON string of a list, as SWE-bench ships it
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and not set(inst.FAIL_TO_PASS) & set(inst.PASS_TO_PASS)
        repo = instances.parent / row["repo_path"]
        log = subprocess.run(
            ["git", "-C", str(repo), "log", "--format=%H"], capture_output=True, text=True
        ).stdout
        assert log.split() == [row["base_commit"]]  # a real git repository at base_commit
        assert row["patch"].startswith("diff --git") and "tests/" not in row["patch"]
        assert all(t.split("::")[0] in inst.touched() for t in inst.FAIL_TO_PASS)


def test_gold_patch_scores_1_and_the_unpatched_repository_0(
    instances: Path, capsys: pytest.CaptureFixture
) -> None:
    bwrap()
    assert main(["tasks", "check", str(instances), "--json", "--backend", "bwrap"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["oracle_reward"], r["untouched_reward"], r["good"]) for r in rows] == [(1.0, 0.0, True)] * 3
    env = get_task(f"swebench:{instances}", sandbox={"backend": "bwrap"}, validate_oracle=False)
    untouched = env.untouched(env.names[0])
    f2p = len(env.items[env.names[0]].FAIL_TO_PASS)
    assert untouched.info["fail_to_pass"] == f"0/{f2p}" and untouched.info["reason"] == "unresolved"


def test_an_episode_works_on_the_repository_and_cannot_read_the_fix(instances: Path, tmp_path: Path) -> None:
    bwrap()
    env = get_task(f"swebench:{instances}", sandbox={"backend": "bwrap"}, validate_oracle=False)
    name = env.names[0]
    inst = env.items[name]
    fix = next(
        line[1:] for line in inst.patch.splitlines() if line.startswith("+") and not line.startswith("+++")
    )
    hidden = inst.FAIL_TO_PASS[0].split("::")[0]
    look = tool_call_text("shell", command="git log --all --format=%H; git status --short; ls")
    # a test file of its own under test_patch's name, passing everything: replaced by the real one
    fake = tool_call_text("write_file", path=hidden, content="def test_nothing():\n    pass\n")
    score, _, results = play_text(env, {"task": name}, [look + fake, "done"])
    shown = results[0].messages[0]["content"]
    assert shown.startswith("exit status 0") and inst.base_commit in shown and fix.strip() not in shown
    assert score.status == "ok" and score.reward == 0.0
    # applying the gold patch by hand through the tools is a fix
    apply = tool_call_text("shell", command=f"git apply <<'EOF'\n{inst.patch}EOF")
    assert play_text(env, {"task": name}, [apply, "done"])[0].reward == 1.0


def test_history_after_base_commit_is_not_in_the_box(tmp_path: Path) -> None:
    bwrap()
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        env = {**GIT_ENV, "PATH": "/usr/bin:/bin"}
        return subprocess.run(
            ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
        ).stdout

    git("init", "-q")
    (repo / "a.py").write_text("X = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD").strip()
    (repo / "a.py").write_text("X = 2  # the fix\n")
    git("commit", "-qam", "fix")
    later = git("rev-parse", "HEAD").strip()
    row = {"instance_id": "h-1", "base_commit": base, "problem_statement": "p", "test_patch": "", "FAIL_TO_PASS": ["t.py::t"],
           "repo_path": "repo", "test_cmd": "true"}  # fmt: skip
    (tmp_path / "i.jsonl").write_text(json.dumps(row) + "\n")
    env = get_task(f"swebench:{tmp_path / 'i.jsonl'}", sandbox={"backend": "bwrap"}, validate_oracle=False)
    probe = tool_call_text(
        "shell", command=f"git cat-file -t {later} || echo gone; git log --all --oneline | wc -l"
    )
    out = play_text(env, {"task": "h-1"}, [probe])[2][0].messages[0]["content"]
    assert "stdout:\ngone\n1\n" in out  # the later commit is not there; one commit in all


def test_statuses_and_instance_errors(instances: Path, tmp_path: Path) -> None:
    bwrap()
    row = json.loads(instances.read_text().splitlines()[0])
    row["repo_path"] = str(instances.parent / row["repo_path"])
    (tmp_path / "runner.jsonl").write_text(json.dumps({**row, "test_cmd": "nosuchrunner -rA"}) + "\n")
    env = get_task(
        f"swebench:{tmp_path / 'runner.jsonl'}", sandbox={"backend": "bwrap"}, validate_oracle=False
    )
    score = env.oracle(row["instance_id"])
    assert score.status == "verifier_error" and "`nosuchrunner` is not in the box" in score.info["error"]
    (tmp_path / "bad.jsonl").write_text(
        json.dumps({**row, "test_patch": "diff --git a/x b/x\nnot a patch\n"}) + "\n"
    )
    env = get_task(f"swebench:{tmp_path / 'bad.jsonl'}", sandbox={"backend": "bwrap"}, validate_oracle=False)
    assert env.untouched(row["instance_id"]).info["reason"] == "test_patch"
    (tmp_path / "broken.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({"instance_id": "x"}) + "\n")
    with pytest.raises(TaskError, match=r"broken\.jsonl:2: not a SWE-bench instance"):
        get_task(f"swebench:{tmp_path / 'broken.jsonl'}", sandbox={"backend": "bwrap"}, validate_oracle=False)


def test_an_instance_must_name_a_failing_test_and_blank_ids_name_none(instances: Path) -> None:
    row = json.loads(instances.read_text().splitlines()[0])
    # with no FAIL_TO_PASS test any run would be "resolved": a reward of 1 nobody earned
    for empty in ("[]", [], "", [" "]):
        with pytest.raises(ValidationError, match=r"(?s)FAIL_TO_PASS.*names no test"):
            Instance.model_validate({**row, "FAIL_TO_PASS": empty})
    inst = Instance.model_validate({**row, "PASS_TO_PASS": ""})
    assert inst.PASS_TO_PASS == []  # not [""], a test that can never pass


def test_log_reading() -> None:
    log = "PASSED tests/a.py::test_x\nFAILED tests/a.py::test_y - AssertionError\ntests/b.py::test_z XFAIL\nnoise\n"
    assert log_outcomes(log) == {
        "tests/a.py::test_x": "PASSED",
        "tests/a.py::test_y": "FAILED",
        "tests/b.py::test_z": "XFAIL",
    }
    inst = Instance.model_validate({"instance_id": "i", "base_commit": "c", "problem_statement": "p", "test_patch": "",
                                    "FAIL_TO_PASS": '["tests/b.py::test_z"]', "PASS_TO_PASS": ["tests/a.py::test_x"]})  # fmt: skip
    assert judge_log(inst, Ran(1, log.encode(), b"", 1.0), 60, True).reward == 1.0
    inst.PASS_TO_PASS.append("tests/a.py::test_y")
    assert judge_log(inst, Ran(1, log.encode(), b"", 1.0), 60, True).reward == 0.0
    inst.PASS_TO_PASS.append("tests/a.py::test_missing")  # absent from the log: not passed
    assert judge_log(inst, Ran(0, b"", b"", 1.0), 60, True).info["pass_to_pass"] == "0/3"


def test_log_reading_of_parametrised_ids_with_spaces() -> None:
    # pytest prints a parametrised test's whole id, spaces included; SWE-bench's own lists hold ids cut at the
    # first space (its harness splits log lines on whitespace): both are read
    log = (
        "tests/t.py::test_v[a b] PASSED   [ 33%]\n"
        "PASSED tests/t.py::test_a[1-2]\nPASSED tests/t.py::test_b[x y]\n"
        "FAILED tests/t.py::test_c[p q] - AssertionError: 1 - 2\nXFAIL tests/t.py::test_d[u v] - reason\n"
    )
    ids = [
        "tests/t.py::test_a[1-2]",
        "tests/t.py::test_b[x y]",
        "tests/t.py::test_b[x",
        "tests/t.py::test_d[u v]",
    ]
    inst = Instance.model_validate({"instance_id": "i", "base_commit": "c", "problem_statement": "p", "test_patch": "",
                                    "FAIL_TO_PASS": json.dumps(ids), "PASS_TO_PASS": ["tests/t.py::test_v[a b]"]})  # fmt: skip
    assert judge_log(inst, Ran(1, log.encode(), b"", 1.0), 60, True).reward == 1.0
    for wrong in ("tests/t.py::test_c[p q]", "tests/t.py::test_b", "tests/t.py::test_b[x y"):
        inst.PASS_TO_PASS = [wrong]
        assert judge_log(inst, Ran(1, log.encode(), b"", 1.0), 60, True).reward == 0.0, wrong
    assert log_outcomes(log)["tests/t.py::test_c[p q]"] == "FAILED"


def test_the_test_command_gets_the_files_the_test_ids_name(tmp_path: Path) -> None:
    # pylint's tests/checkers/unittest_*.py and pytest's testing/python/*.py are test files by their ids only
    class Recorder:
        def __init__(self) -> None:
            self.commands: list[str] = []

        def exec(self, command: str, **kwargs: object) -> Ran:
            self.commands.append(command)
            return Ran(0, b"", b"", 0.1)

    diff = "".join(
        f"diff --git a/{f} b/{f}\n"
        for f in ("tests/checkers/unittest_x.py", "tests/test_self.py", "tests/util.py")
    )
    row = {"instance_id": "i", "base_commit": "c", "problem_statement": "p", "test_patch": diff, "image": "img",
           "FAIL_TO_PASS": ["tests/checkers/unittest_x.py::TestX::test_y"], "PASS_TO_PASS": []}  # fmt: skip
    (tmp_path / "i.jsonl").write_text(json.dumps(row) + "\n")
    task = SweBench(str(tmp_path / "i.jsonl"), SweBenchParams())
    box = Recorder()
    task.verify(task.items["i"], box, True)  # type: ignore[arg-type]
    assert box.commands[-1] == "pytest -rA tests/checkers/unittest_x.py tests/test_self.py"


@pytest.mark.slow
def test_the_container_backend_builds_each_instance_once(
    instances: Path, container_runtime: str, capsys
) -> None:
    from keelrl.sandbox.boxes import find_runtime
    from keelrl.sandbox.images import make_stand_ins

    make_stand_ins(find_runtime(container_runtime), ["python:3.12-slim"])
    assert main(["tasks", "check", str(instances), "--json", "--backend", "container"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["oracle_reward"], r["untouched_reward"]) for r in rows] == [(1.0, 0.0)] * 3
