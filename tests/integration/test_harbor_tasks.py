"""Harbor-format tasks written for these tests, each in the published layout (task.toml, instruction.md,
environment/Dockerfile, tests/test.sh, solution/solve.sh), run in real boxes on both backends: a container
(podman or docker, from the debian:bookworm-slim stand-in; skipped, saying why, only where no runtime can run) and
bubblewrap over the host's programs. `keelrl tasks check` gives oracle 1 / untouched 0 on working tasks;
reward.json wins over reward.txt and the exit status; a verifier that needs the network or a missing program is a
verifier_error; executable bits survive; what the agent leaves in /logs/verifier or /tests does not count."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from keelrl.cli.main import main
from keelrl.tasks import get_task
from keelrl.tasks.env import play_text
from keelrl.tasks.repo import tool_call_text
from keelrl.tasks.terminal import Terminal

CHECK = "#!/bin/bash\nif grep -qx hello /app/answer.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
SOLVE = "#!/bin/bash\necho hello > /app/answer.txt\n"


def task(root: Path, name: str, test: str = CHECK, solve: str = SOLVE, toml: str = "", env: dict | None = None,
         tests: dict | None = None) -> Path:  # fmt: skip
    """A task directory; `env` / `tests`: extra files (text, or (text, mode)) in environment/ (each COPYed to
    /app) and tests/. test.sh is written without its executable bit, as Harbor makes it executable."""
    d = root / name
    env, tests = env or {}, tests or {}
    dockerfile = "FROM debian:bookworm-slim\nWORKDIR /app\n" + "".join(f"COPY {f} /app/{f}\n" for f in env)
    written = {
        "instruction.md": ("Write hello to /app/answer.txt.", 0o644),
        "task.toml": ('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n' + toml, 0o644),
        "environment/Dockerfile": (dockerfile, 0o644),
        "tests/test.sh": (test, 0o644),
        "solution/solve.sh": (solve, 0o644),
        **{f"environment/{k}": v if isinstance(v, tuple) else (v, 0o644) for k, v in env.items()},
        **{f"tests/{k}": v if isinstance(v, tuple) else (v, 0o644) for k, v in tests.items()},
    }
    for rel, (text, mode) in written.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
        (d / rel).chmod(mode)
    return d


@pytest.fixture(params=["bwrap", "container"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "container":
        request.getfixturevalue("container_runtime")
    elif shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    return request.param


def env_of(path: Path, backend: str, agent_network: bool = False, **params: object) -> Terminal:
    sandbox = {"backend": backend, "agent_network": agent_network}
    return get_task(f"dir:{path}", sandbox=sandbox, validate_oracle=False, **params)  # type: ignore[return-value]


def test_tasks_check_gives_oracle_1_and_untouched_0(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    task(tmp_path, "hello")
    task(tmp_path, "hollow", solve="#!/bin/bash\necho hallo > /app/answer.txt\n")  # a wrong oracle
    (task(tmp_path, "empty") / "environment" / "Dockerfile").unlink()
    code = main(["tasks", "check", str(tmp_path), "--json", "--backend", backend])
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    assert code == 1 and set(rows) == {"hello", "hollow", "empty"}
    assert rows["hello"] == {
        "task": "hello", "oracle_reward": 1.0, "oracle_status": "ok", "oracle_error": "", "untouched_reward": 0.0,
        "untouched_status": "ok", "untouched_error": "", "good": True,
    }  # fmt: skip
    assert (rows["hollow"]["oracle_reward"], rows["hollow"]["good"]) == (0.0, False)
    empty = rows["empty"]
    assert (
        empty["oracle_status"] == empty["untouched_status"] == "load_error" and empty["oracle_reward"] is None
    )
    assert "environment/ is empty" in empty["oracle_error"]
    # the table, for people
    assert main(["tasks", "check", str(tmp_path / "hello"), "--backend", backend]) == 0
    assert "1 of 1 tasks good (oracle 1, untouched 0)" in capsys.readouterr().out


def test_reward_json_wins_over_reward_txt_and_the_exit_status(backend: str, tmp_path: Path) -> None:
    write = "#!/bin/bash\necho '{json}' > /logs/verifier/reward.json\necho {txt} > /logs/verifier/reward.txt\nexit {code}\n"
    task(tmp_path, "zero", write.format(json='{"reward": 0}', txt=1, code=0))  # the false 1.0 of before
    task(tmp_path, "half", write.format(json='{"reward": 0.5, "passed": 1, "total": 2}', txt=1, code=0))
    task(tmp_path, "txt", write.format(json='{"tests": 3}', txt=0.25, code=0))
    task(tmp_path, "failing_exit", write.format(json='{"reward": 1}', txt=0, code=3))
    env = env_of(tmp_path, backend)
    got = {n: env.untouched(n) for n in ("zero", "half", "txt", "failing_exit")}
    assert {n: (s.status, s.reward, s.correct) for n, s in got.items()} == {
        "zero": ("ok", 0.0, False), "half": ("ok", 0.5, False), "txt": ("ok", 0.25, False),
        "failing_exit": ("ok", 1.0, True),
    }  # fmt: skip
    assert got["half"].info["verifier_metrics"] == {"passed": 1.0, "total": 2.0}
    assert got["txt"].info["verifier_metrics"] == {"tests": 3.0}
    assert got["zero"].info["container_s"] >= got["zero"].info["verifier_s"] > 0


def test_a_verifier_that_cannot_run_is_a_verifier_error_not_0(backend: str, tmp_path: Path) -> None:
    offline = "[environment]\nallow_internet = false\n"
    net = "#!/bin/bash\ntimeout 5 bash -c 'exec 3<>/dev/tcp/deb.debian.org/80' || { echo offline >&2; exit 1; }\n"
    task(tmp_path, "needs_network", net + "echo 1 > /logs/verifier/reward.txt\n", toml=offline)
    runner = "#!/bin/bash\nset -e\nuvx -w pytest==8.4.1 pytest /tests/test_outputs.py -rA\necho 1 > /logs/verifier/reward.txt\n"
    task(tmp_path, "needs_uvx", runner, toml=offline)
    task(tmp_path, "garbage", "#!/bin/bash\necho 'all tests passed' > /logs/verifier/reward.txt\n")
    env = env_of(tmp_path, backend)
    for name, why in (
        ("needs_network", "no reward file"),
        ("needs_uvx", "`uvx` is not in the box"),
        ("garbage", "not a number"),
    ):
        score = env.oracle(name)
        assert (score.status, score.correct) == ("verifier_error", False) and why in score.info["error"], name


def test_executable_bits_survive(backend: str, tmp_path: Path) -> None:
    run = ("#!/bin/bash\necho hello\n", 0o755)
    check = (
        '#!/bin/bash\n/tests/helper.sh && [ "$(./run.sh)" = hello ] && echo 1 > /logs/verifier/reward.txt\n'
    )
    task(tmp_path, "modes", check, solve="#!/bin/bash\n./run.sh > answer.txt\n", env={"run.sh": run},
         tests={"helper.sh": ("#!/bin/bash\ntrue\n", 0o755)})  # fmt: skip
    assert env_of(tmp_path, backend).oracle("modes").reward == 1.0


def test_tools_and_what_the_agent_leaves_behind(backend: str, tmp_path: Path) -> None:
    strict = "#!/bin/bash\ngrep -qx hello /app/answer.txt || exit 1\necho 1 > /logs/verifier/reward.txt\n"
    task(tmp_path, "t", strict, env={"notes.txt": "draft: helo\n"})
    env = env_of(tmp_path, backend)
    look = [
        tool_call_text("shell", command="pwd; ls; echo oops >&2; exit 3"),
        tool_call_text("read_file", path="/app/notes.txt"),
        tool_call_text("read_file", path="/etc/passwd"),
        tool_call_text("replace_in_file", path="notes.txt", old="helo", new="hello"),
        tool_call_text("write_file", path="/app/sub/answer.txt", content="hello\n"),
    ]
    # planting a reward and a verifier of its own: both are gone before the real verifier runs
    hack = tool_call_text("shell", command="mkdir -p /logs/verifier /tests; echo 1 > /logs/verifier/reward.txt; "
                          "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh")  # fmt: skip
    score, state, results = play_text(env, {"task": "t"}, ["".join(look), hack, "done"])
    shell, notes, outside, replaced, wrote = (m["content"] for m in results[0].messages)
    assert shell.startswith("exit status 3") and "/app" in shell and "notes.txt" in shell and "oops" in shell
    assert notes == "draft: helo\n" and "outside the working tree /app" in outside
    assert replaced.startswith("wrote /app/notes.txt") and wrote.startswith("wrote /app/sub/answer.txt")
    assert results[0].info == {"tool_calls": 5, "tool_errors": 1} and "box" not in state.scratch  # closed
    assert (
        score.status == "verifier_error" and score.info["formatted"]
    )  # the answer is in sub/: test.sh exits 1
    right = tool_call_text("shell", command="cp sub/answer.txt answer.txt")
    assert play_text(env, {"task": "t"}, ["".join(look) + right, "done"])[0].reward == 1.0
    idle = play_text(env, {"task": "t"}, ["I am done."])[0]  # no tool call: the box starts at finish
    assert idle.status == "verifier_error" and not idle.info["formatted"]


def test_timeouts_env_and_user(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task(tmp_path, "slow", "#!/bin/bash\nsleep 60\necho 1 > /logs/verifier/reward.txt\n", toml="")
    (tmp_path / "slow" / "task.toml").write_text("[verifier]\ntimeout_sec = 2\n")
    report = '#!/bin/bash\necho "{\\"reward\\": 1, \\"uid\\": $(id -u), \\"x\\": ${X:-0}, \\"y\\": $Y}" > /logs/verifier/reward.json\n'
    task(
        tmp_path,
        "who",
        report,
        toml='user = "nobody"\n[verifier.env]\nX = "${KEELRL_TEST_X}"\nY = "${KEELRL_TEST_Y:-7}"\n',
    )
    (tmp_path / "who" / "task.toml").write_text(
        '[verifier]\nuser = "nobody"\n[verifier.env]\nX = "${KEELRL_TEST_X}"\nY = "${KEELRL_TEST_Y:-7}"\n'
    )
    monkeypatch.setenv("KEELRL_TEST_X", "5")
    env = env_of(tmp_path, backend, shell_timeout_s=2)
    t0 = time.perf_counter()
    slow = env.untouched("slow")
    assert slow.status == "verifier_error" and slow.info["reason"] == "verifier_timeout"
    assert time.perf_counter() - t0 < 30
    who = env.untouched("who")
    assert who.status == "ok" and who.info["verifier_metrics"] == {
        "uid": 65534.0 if backend == "container" else 0.0,  # bwrap runs the verifier as root (and says so)
        "x": 5.0,
        "y": 7.0,
    }
    # a shell call past shell_timeout_s is killed and said so
    _, _, results = play_text(env, {"task": "slow"}, [tool_call_text("shell", command="sleep 30")])
    assert results[0].messages[0]["content"].startswith("timed out after 2 s")


def test_an_episode_past_the_agent_timeout_ends_with_status_timeout(backend: str, tmp_path: Path) -> None:
    task(tmp_path, "quick", toml="[agent]\ntimeout_sec = 3\n")
    env = env_of(tmp_path, backend, shell_timeout_s=30)
    write = tool_call_text("shell", command="echo hello > /app/answer.txt")
    assert play_text(env, {"task": "quick"}, [write, "done"])[0].reward == 1.0  # within the limit: scored
    # a command that outlives the time left is cut there, and the episode ends without a reward
    t0 = time.perf_counter()
    slow = tool_call_text("shell", command="sleep 20; echo hello > /app/answer.txt")
    score, _, results = play_text(env, {"task": "quick"}, [slow, write, "done"])
    assert time.perf_counter() - t0 < 15 and results[0].messages[0]["content"].startswith("timed out after")
    assert len(results) == 2 and results[1].done and not results[1].messages  # no more tool calls run
    assert (score.status, score.reward, score.info["reason"]) == ("timeout", 0.0, "agent_timeout")
    assert "[agent] timeout_sec = 3 s" in score.info["error"]


def test_validation_leaves_out_tasks_the_oracle_does_not_solve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    task(tmp_path / "set", "good")
    task(tmp_path / "set", "offline_zero", "#!/bin/bash\nuvx pytest || echo 0 > /logs/verifier/reward.txt\n")
    env = get_task(f"dir:{tmp_path / 'set'}", sandbox={"backend": "bwrap"})
    assert sorted(env.items) == ["good"] and env.excluded == {"offline_zero": "oracle ok, reward 0"}
    assert len(list((tmp_path / "cache" / "keelrl" / "oracle").glob("*.json"))) == 2
    # cached by the task's hash: the oracle does not run again
    monkeypatch.setattr(Terminal, "oracle", lambda self, name: pytest.fail("the oracle ran again"))
    kept = get_task(f"dir:{tmp_path / 'set'}", sandbox={"backend": "bwrap"}, keep_failing=True)
    assert sorted(kept.items) == ["good", "offline_zero"] and "offline_zero" in kept.excluded


def test_bwrap_applies_the_dockerfiles_copy_steps_and_says_the_rest_is_not(tmp_path: Path, caplog) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    d = task(
        tmp_path, "copy", '#!/bin/bash\n[ "$GREETING" = hi ] && cat data/in.txt > /logs/verifier/reward.txt\n'
    )
    (d / "environment" / "data").mkdir()
    (d / "environment" / "data" / "in.txt").write_text("0.75\n")
    (d / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y jq\nWORKDIR /app\nENV GREETING=hi\n"
        "COPY data/ ./data/\nCOPY data/in.txt /etc/in.txt\n"
    )
    assert env_of(tmp_path, "bwrap").untouched("copy").reward == 0.75
    assert "does not build environment/Dockerfile" in caplog.text and "RUN" in caplog.text


def test_container_limits_network_and_a_missing_base_image(container_runtime: str, tmp_path: Path) -> None:
    probe = (
        "#!/bin/bash\nm=$(cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null | head -1)\n"
        "net=0; timeout 5 bash -c 'exec 3<>/dev/tcp/deb.debian.org/80' && net=1\n"
        'echo "{\\"reward\\": 1, \\"memory\\": $m, \\"network\\": $net}" > /logs/verifier/reward.json\n'
    )
    task(tmp_path, "limits", probe, toml='[environment]\nmemory = "256M"\ncpus = 1\nallow_internet = true\n')
    env = env_of(tmp_path, "container")
    metrics = env.untouched("limits").info["verifier_metrics"]
    assert metrics["memory"] == 256 * 1024 * 1024  # the task's memory, not a default
    # the agent's commands have no network by default, whatever the task allows its verifier
    check = tool_call_text(
        "shell", command="timeout 5 bash -c 'exec 3<>/dev/tcp/deb.debian.org/80' && echo reached"
    )
    _, _, results = play_text(env, {"task": "limits"}, [check])
    assert "reached" not in results[0].messages[0]["content"]
    if metrics["network"] == 1:  # the verifier had it (where this machine reaches its apt mirror)
        opened = env_of(tmp_path, "container", agent_network=True)
        assert "reached" in play_text(opened, {"task": "limits"}, [check])[2][0].messages[0]["content"]
    # the image's own environment (ENV PATH) is the commands' environment
    d = task(
        tmp_path,
        "pathy",
        "#!/bin/bash\nmytool > /logs/verifier/reward.txt\n",
        env={"mytool": ("#!/bin/sh\necho 1\n", 0o755)},
    )
    (d / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nENV PATH=/opt/t:$PATH\nCOPY mytool /opt/t/\nWORKDIR /app\n"
    )
    assert env_of(tmp_path, "container").untouched("pathy").reward == 1.0
    d = task(tmp_path, "nobase")
    (d / "environment" / "Dockerfile").write_text("FROM keelrl-test/no-such-base:1\nWORKDIR /app\n")
    score = env_of(tmp_path, "container").oracle("nobase")
    assert score.status == "agent_error" and "keelrl-test/no-such-base:1" in score.info["error"]
    assert "keelrl tasks images" in score.info["error"]


def test_the_overhead_benchmark_runs(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    import subprocess
    import sys

    bench = Path(__file__).parents[2] / "benchmarks" / "episode_boxes.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=600
    )
    out = json.loads(done.stdout)
    assert (
        out["quick"]
        and out["episodes"] == 2
        and out["backends"]["bwrap"]["start_to_verifier_done_ms"]["median"] > 0
    )
    if "container" in out["backends"]:
        assert out["ratio"] > 0 and out["backends"]["container"]["verifier_ms"]["median"] > 0
