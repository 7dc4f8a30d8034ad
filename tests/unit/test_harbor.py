"""Harbor task directories (tasks/harbor.py), without running a box: reading the verifier's reward files as Harbor
does, the statuses of a verifier run, loading and refusing task directories, the task set's filter and splits, and
the terminal tools' path rules (tasks/terminal.py). tests/integration/test_harbor_tasks.py runs tasks in boxes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keelrl.sandbox.boxes import BoxError, Ran
from keelrl.sandbox.dockerfile import dockerfile_steps
from keelrl.tasks import get_task
from keelrl.tasks.harbor import (
    dockerfile_workdir,
    load_task,
    read_reward,
    size_mb,
    stage_environment,
    verdict,
)
from keelrl.tasks.terminal import TaskDirError, matches, missing_program, resolve_env, resolve_path

OK_RUN = Ran(0, b"", b"", 0.5)
BWRAP = {"backend": "bwrap"}  # the [sandbox] section


def files(**kw: object) -> dict[str, bytes]:
    return {k.replace("_", "."): v if isinstance(v, bytes) else json.dumps(v).encode() for k, v in kw.items()}


def test_reward_json_wins_and_its_other_numbers_are_metrics() -> None:
    both = {
        "reward.json": b'{"reward": 0, "passed": 3, "total": 4, "note": "x", "flag": true}',
        "reward.txt": b"1",
    }
    assert read_reward(both) == (0.0, {"passed": 3.0, "total": 4.0}, "")
    assert read_reward({"reward.json": b'{"reward": 0.5}'}) == (0.5, {}, "")
    # without a reward key, reward.txt gives it; the JSON's numbers are still recorded
    assert read_reward({"reward.json": b'{"tests": 3}', "reward.txt": b" 0.25\n"}) == (
        0.25,
        {"tests": 3.0},
        "",
    )
    assert read_reward({"reward.txt": b"1"}) == (1.0, {}, "")


@pytest.mark.parametrize(
    "found, why",
    [
        ({}, "no reward file"),
        ({"reward.json": b""}, "reward.json is empty"),
        ({"reward.json": b"{reward: 1"}, "not JSON"),
        ({"reward.json": b"[1]"}, "not a JSON object"),
        ({"reward.json": b'{"reward": "1"}'}, "not a finite number"),
        ({"reward.json": b'{"reward": true}'}, "not a finite number"),
        ({"reward.json": b'{"reward": NaN}'}, "not a finite number"),
        ({"reward.json": b'{"score": 1}'}, "no reward key"),
        ({"reward.txt": b""}, "reward.txt is empty"),
        ({"reward.txt": b"passed"}, "not a number"),
        ({"reward.txt": b"inf"}, "'inf'"),
        ({"reward.txt": b"nan"}, "'nan'"),
    ],
)
def test_no_usable_reward_is_said_not_guessed(found: dict[str, bytes], why: str) -> None:
    reward, _, error = read_reward(found)
    assert reward is None and why in error


def test_the_exit_status_never_decides_and_every_run_ends_with_a_status() -> None:
    failed_but_rewarded = verdict({"reward.txt": b"1"}, Ran(1, b"", b"", 0.5), 60, True)
    assert (failed_but_rewarded.status, failed_but_rewarded.reward, failed_but_rewarded.correct) == (
        "ok",
        1.0,
        True,
    )
    passed_without_reward = verdict({"test-stdout.txt": b"all good"}, OK_RUN, 60, True)
    assert (
        passed_without_reward.status == "verifier_error"
        and "no reward file" in passed_without_reward.info["error"]
    )
    partial = verdict({"reward.json": b'{"reward": 0.5, "passed": 1}'}, OK_RUN, 60, True)
    assert (partial.status, partial.reward, partial.correct) == ("ok", 0.5, False)
    assert partial.info["verifier_metrics"] == {"passed": 1.0}
    # a verifier killed at its timeout: no reward, even if an earlier file is there
    late = verdict({"reward.txt": b"1"}, Ran(124, b"", b"", 61.0), 60, True)
    assert late.status == "verifier_error" and late.info["reason"] == "verifier_timeout"
    # a runner that could not be installed is named
    offline = (
        b"curl: (6) Could not resolve host: astral.sh\n/tests/test.sh: line 10: uvx: command not found\n"
    )
    missing = verdict({"test-stdout.txt": offline}, Ran(127, b"", b"", 1.0), 60, True)
    assert missing.status == "verifier_error" and "`uvx` is not in the box" in missing.info["error"]
    # Terminal-Bench's test.sh offline: its runner could not be fetched, and it wrote 0 anyway: a 0 that says
    # nothing about the answer is a verifier_error, naming the program and the network failure
    zero = verdict({"test-stdout.txt": offline, "reward.txt": b"0"}, OK_RUN, 60, True)
    assert (zero.status, zero.info["reason"]) == ("verifier_error", "offline")
    assert "`uvx` is not in the box" in zero.info["error"] and "astral.sh" in zero.info["error"]
    # uv fetched, but not the packages it installs: the same
    uv = b"Temporary failure resolving 'deb.debian.org'\nerror: Failed to fetch: `https://pypi.org/simple/pytest/`\n"
    assert verdict({"test-stdout.txt": uv, "reward.txt": b"0"}, OK_RUN, 60, True).status == "verifier_error"
    # apt offline but the tests ran and judged: an ordinary 0 (and a 1 after a network failure is a 1)
    apt = b"E: Failed to fetch http://deb.debian.org/x  Temporary failure resolving 'deb.debian.org'\n1 failed\n"
    assert verdict({"test-stdout.txt": apt, "reward.txt": b"0"}, OK_RUN, 60, True).status == "ok"
    assert verdict({"test-stdout.txt": offline, "reward.txt": b"1"}, OK_RUN, 60, True).reward == 1.0
    # a missing program without a network failure (the agent's tool the tests look for) is an ordinary 0
    absent = verdict(
        {"test-stdout.txt": b"line 3: mytool: command not found\n", "reward.txt": b"0"}, OK_RUN, 60, True
    )
    assert (absent.status, absent.reward, absent.info["missing"]) == ("ok", 0.0, "mytool")


def test_helpers() -> None:
    assert missing_program("sh: 1: pytest: not found") == "pytest"
    assert missing_program("ModuleNotFoundError: No module named 'numpy'") == "numpy"
    assert missing_program("all fine") is None
    assert (size_mb("2G"), size_mb("512M"), size_mb("1.5g"), size_mb("4096k"), size_mb("10Gi")) == (
        2048,
        512,
        1536,
        4,
        10240,
    )
    steps = dockerfile_steps(
        "# c\nFROM python:3.13 AS build\nWORKDIR /src\nFROM debian\nRUN a && \\\n  b\nWORKDIR /app\nWORKDIR sub\n"
    )
    assert (
        steps[3][0] == "RUN"
        and steps[3][1].split() == ["a", "&&", "b"]
        and dockerfile_workdir(steps) == "/app/sub"
    )
    assert dockerfile_workdir(dockerfile_steps("FROM x\n")) == "/app"
    assert resolve_path("/app/src/a.py", "/app") == "/app/src/a.py" == resolve_path("src/../src/a.py", "/app")
    for bad in ("/etc/passwd", "../x", "/application", ""):
        with pytest.raises(ValueError, match=r"working tree /app|non-empty"):
            resolve_path(bad, "/app")
    assert resolve_env({"A": "${KEELRL_NOPE:-dflt}", "B": "x${HOME}y"}, "t") == {
        "A": "dflt",
        "B": f"x{Path.home()}y",
    }
    with pytest.raises(BoxError, match="KEELRL_NOPE"):
        resolve_env({"A": "${KEELRL_NOPE}"}, "task t's [verifier] env")
    assert matches(
        {"difficulty": "easy", "tags": ["a", "b"]}, {"difficulty": ["easy", "medium"], "tags": "b"}
    )
    assert not matches({"difficulty": "hard", "tags": ["a"]}, {"tags": "b"})


def write_task(root: Path, name: str, toml: str = "", **extra: str) -> Path:
    d = root / name
    for rel, text in {
        "instruction.md": "Write hello to /app/answer.txt.",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "#!/bin/bash\necho hello > answer.txt\n",
        "task.toml": toml,
        **extra,
    }.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def test_published_task_toml_forms_load(tmp_path: Path) -> None:
    tb2 = write_task(
        tmp_path,
        "tb2",
        'version = "1.0"\n[metadata]\ndifficulty = "medium"\ntags = ["git"]\n[verifier]\ntimeout_sec = 7200.0\n'
        '[verifier.env]\nPYTHONPATH = "/app"\n[agent]\ntimeout_sec = 900.0\n[environment]\nbuild_timeout_sec = 600.0\n'
        'docker_image = "alexgshaw/x:20251031"\ncpus = 2\nmemory = "4G"\nstorage = "10G"\n',
    )
    harbor = write_task(
        tmp_path,
        "harbor",
        'schema_version = "1.1"\nartifacts = []\n[task]\nname = "org/harbor"\n[[task.authors]]\nname = "A"\n'
        '[verifier]\nuser = "nobody"\n[environment]\nmemory_mb = 1024\nnetwork_mode = "no-network"\nos = "linux"\n'
        'mcp_servers = []\n[environment.env]\n[solution.env]\nK = "v"\n',
        **{".hidden/secret": "x", "environment/blob.bin": "\x00\xff", "environment/.env": "A=1"},
    )
    for i in range(250):  # more files than the old loader allowed, hidden ones too
        (harbor / "environment" / f"f{i}.txt").write_text(str(i))
    a, b = load_task(tb2), load_task(harbor)
    assert (a.config.schema_version, a.config.verifier.timeout_sec, a.config.environment.memory_mb) == (
        "1.0",
        7200,
        4096,
    )
    assert a.config.environment.storage_mb == 10240 and a.config.environment.network and a.bucket == "medium"
    assert a.config.verifier.env == {"PYTHONPATH": "/app"} and a.workdir == "/app"
    assert (
        b.config.verifier.user == "nobody"
        and not b.config.environment.network
        and b.config.solution.env == {"K": "v"}
    )
    assert b.bucket == "all" and a.fingerprint != b.fingerprint


@pytest.mark.parametrize(
    "change, message",
    [
        ({"environment/Dockerfile": None}, "environment/ is empty"),
        ({"tests/test.sh": None}, r"lacks tests/test\.sh"),
        ({"task.toml": "[verifier]\ntimeout_sec = 'soon'\n"}, "verifier.timeout_sec"),
        ({"task.toml": "[environment]\ngpus = 1\n"}, "no GPU"),
        ({"task.toml": '[environment]\nos = "windows"\n'}, "environment.os"),
        ({"task.toml": "[[steps]]\nname = 'a'\n"}, "multi-step"),
        ({"task.toml": "[verifier\n"}, "task.toml"),
        ({"task.toml": None, "instruction.md": None, "task.yaml": "instruction: x\n"}, "Terminal-Bench 1"),
        (
            {"task.toml": '[environment]\nmemory = "2G"\nmemory_mb = 4096\n'},
            "memory = '2G' .2048 MB. and memory_mb = 4096",
        ),
        ({"task.toml": '[verifier]\nenvironment_mode = "separate"\n'}, "own container"),
        ({"task.toml": "[verifier.environment]\ncpus = 1\n"}, "own container"),
        (
            {"task.toml": '[[environment.mcp_servers]]\nname = "s"\nurl = "http://s:8000/mcp"\n'},
            "MCP servers",
        ),
        ({"task.toml": '[environment.tpu]\ntype = "v5e"\n'}, "no GPU or TPU"),
        (
            {
                "environment/docker-compose.yaml": "services:\n  main:\n    depends_on: [api]\n  api:\n    build: ./api\n"
            },
            "adds the services api: multi-container",
        ),
    ],
)
def test_layout_errors_are_clear(tmp_path: Path, change: dict, message: str) -> None:
    d = write_task(tmp_path, "t")
    for rel, text in change.items():
        if text is None:
            (d / rel).unlink()
        else:
            (d / rel).write_text(text)
    with pytest.raises(TaskDirError, match=message):
        load_task(d)
    with pytest.raises(TaskDirError, match=message):  # the same sentence through get_task
        get_task(f"dir:{d}", sandbox=BWRAP, validate_oracle=False)


def test_a_set_leaves_out_what_does_not_load_and_filters_by_metadata(tmp_path: Path) -> None:
    for i in range(12):
        write_task(
            tmp_path,
            f"t{i:02d}",
            f'[metadata]\ndifficulty = "{["easy", "hard"][i % 2]}"\ntags = ["n{i % 3}"]\n',
        )
    (write_task(tmp_path, "broken") / "environment" / "Dockerfile").unlink()
    env = get_task(f"dir:{tmp_path}", sandbox=BWRAP, validate_oracle=False, test_fraction=0.3)
    assert "broken" in env.excluded and "environment/ is empty" in env.excluded["broken"]
    train, test = set(env.splits["train"]), set(env.splits["test"])
    assert train and test and not train & test and train | test == {f"t{i:02d}" for i in range(12)}
    assert {env.problem("test", i)["task"] for i in range(len(test))} == test  # one pass visits each once
    again = get_task(f"dir:{tmp_path}", sandbox=BWRAP, validate_oracle=False, test_fraction=0.3)
    assert [env.problem("train", i) for i in range(20)] == [again.problem("train", i) for i in range(20)]
    easy = get_task(
        f"dir:{tmp_path}", sandbox=BWRAP, validate_oracle=False, where={"difficulty": "easy", "tags": "n0"}
    )
    assert sorted(easy.items) == ["t00", "t06"] and easy.buckets() == ["easy"]
    with pytest.raises(TaskDirError, match="no task to train on"):
        get_task(f"dir:{tmp_path}", sandbox=BWRAP, validate_oracle=False, where={"difficulty": "impossible"})
    single = get_task(f"dir:{tmp_path / 't01'}", sandbox=BWRAP, validate_oracle=False)
    assert single.problem("train", 0) == single.problem("test", 3) == {"task": "t01"}


def test_newer_harbor_fields_are_honoured(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Harbor's phase overrides of the network, [environment] workdir over the Dockerfile's, the agent's user
    t = load_task(
        write_task(
            tmp_path,
            "new",
            '[environment]\nnetwork_mode = "no-network"\nworkdir = "/srv/w"\n'
            '[agent]\nuser = "agent"\ntimeout_sec = 900\n[verifier]\nnetwork_mode = "public"\n',
        )
    )
    assert (t.nets, t.workdir, t.agent_user, t.agent_timeout) == ((False, True), "/srv/w", "agent", 900.0)
    old = load_task(write_task(tmp_path, "old", "[environment]\nallow_internet = false\n"))
    assert old.nets == (False, False) and old.agent_user is None and old.agent_timeout is None
    # a compose file that only sets main's options loads, saying they are not applied
    compose = {"environment/docker-compose.yaml": "services:\n  main:\n    platform: linux/amd64\n"}
    assert load_task(write_task(tmp_path, "composed", **compose)).name == "composed"
    assert "docker-compose.yaml's settings for main (platform) are not applied" in caplog.text


def test_where_episodes_run_is_the_sandbox_section_only(tmp_path: Path) -> None:
    from keelrl.config import ConfigError, load_config
    from keelrl.tasks import TaskError

    d = write_task(tmp_path, "t")
    env = get_task(f"dir:{d}", sandbox={"backend": "bwrap", "agent_network": True}, validate_oracle=False)
    assert (env.backend, env.sandbox.agent_network) == ("bwrap", True)
    for moved in ({"backend": "bwrap"}, {"agent_network": True}, {"runtime": "podman"}):
        with pytest.raises(
            TaskError, match=rf"task.params.{next(iter(moved))} is not a task parameter.*\[sandbox\]"
        ):
            get_task(f"dir:{d}", validate_oracle=False, **moved)
    with pytest.raises(TaskError, match=r"sandbox\.isolation = 'rlimit'"):
        get_task("code", isolation="rlimit")
    cfg = load_config(None, ['sandbox.backend="bwrap"', 'sandbox.isolation="rlimit"'])
    assert (cfg.sandbox.backend, cfg.sandbox.isolation) == ("bwrap", "rlimit")
    assert (
        get_task("code", sandbox=cfg.sandbox).sandbox.isolation == "rlimit"
    )  # the code sandbox reads it too
    mixed = get_task("mixture", sandbox=cfg.sandbox, tasks=[{"task": "code"}, {"task": "countdown"}])
    assert mixed.members["code"].sandbox.isolation == "rlimit"
    with pytest.raises(ConfigError, match=r"sandbox\.backend"):
        load_config(None, ['sandbox.backend="docker"'])


def test_a_multi_stage_dockerfile_stages_only_what_reaches_the_final_image(tmp_path: Path) -> None:
    dockerfile = (
        "ARG V=3.12\nFROM python:${V} AS build\nWORKDIR /app\nCOPY builder.txt ./\nENV BUILD=1\n"
        "FROM --platform=linux/amd64 python:${V}-slim AS Base\nWORKDIR /app\nCOPY base.txt ./\nENV A=1\n"
        "FROM base\nCOPY data/ data/\nCOPY --from=build /app/builder.txt ./\nENV B=2\n"
    )
    extra = {
        "environment/Dockerfile": dockerfile,
        "environment/builder.txt": "b",
        "environment/base.txt": "x",
    }
    task = load_task(write_task(tmp_path, "t", **extra, **{"environment/data/d.txt": "d"}))
    out = tmp_path / "staged"
    # the final stage is built on `Base` (stage names are case-insensitive) and inherits its files and ENV;
    # the build stage's reach the image only through COPY --from, which bwrap cannot apply
    assert (task.workdir, stage_environment(task, out)) == ("/app", {"A": "1", "B": "2"})
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "base.txt",
        "data/d.txt",
    ]
    # WORKDIR is inherited from the stage built on, and not from one that is not
    assert dockerfile_workdir(
        dockerfile_steps("FROM x AS base\nWORKDIR /srv\nFROM base\nWORKDIR code\n")
    ) == ("/srv/code")
    assert dockerfile_workdir(dockerfile_steps("FROM x AS one\nWORKDIR /one\nFROM y\n")) == "/app"


def test_a_reward_too_large_for_a_float_is_not_a_reward() -> None:
    huge = ("1" + "0" * 400).encode()
    assert read_reward({"reward.json": b'{"reward": ' + huge + b', "n": 2}'}) == (
        None,
        {"n": 2.0},
        f"reward.json's reward is {int(huge)!r}, not a finite number",
    )


def test_a_bwrap_box_reads_the_verifier_files_not_what_a_link_points_to_on_the_host(tmp_path: Path) -> None:
    from keelrl.sandbox.boxes import READ_CAP, BoxSpec, BwrapBox

    secret = tmp_path / "host_secret"
    secret.write_text("1")
    box = BwrapBox(BoxSpec("t"), network=False)
    try:
        logs = box.host("/logs/verifier")
        logs.mkdir(parents=True)
        (logs / "reward.txt").write_text("0")
        (logs / "reward.json").symlink_to(secret)  # written in the box, it would resolve to this host file
        with (logs / "big.log").open("wb") as f:
            f.truncate(READ_CAP + 10)
        got = box.read_dir("/logs/verifier")
        assert sorted(got) == ["big.log", "reward.txt"] and got["reward.txt"] == b"0"
        assert len(got["big.log"]) == READ_CAP
    finally:
        box.close()


def test_dockerfile_lines_are_joined_as_docker_joins_them() -> None:
    # comment and empty lines inside a continuation are dropped, and the joined lines are not spaced
    steps = dockerfile_steps(
        "FROM x\nRUN apt-get install \\\n  # the compiler\n\n  gcc\nENV A=fo\\\no\nWORKDIR /w\n"
    )
    assert [op for op, _ in steps] == ["FROM", "RUN", "ENV", "WORKDIR"]
    assert steps[1][1].split() == ["apt-get", "install", "gcc"] and steps[2][1] == "A=foo"
    # a heredoc's lines are its instruction's, not instructions (`from ...` is no FROM)
    steps = dockerfile_steps(
        "FROM x\nWORKDIR /srv\nRUN <<EOF python3\nfrom pathlib import Path\nEOF\nCOPY <<-END /srv/a.py\n"
        "\tfrom os import sep\n\tEND\nWORKDIR code\n"
    )
    assert [op for op, _ in steps] == ["FROM", "WORKDIR", "RUN", "COPY", "WORKDIR"]
    assert dockerfile_workdir(steps) == "/srv/code"
    # the escape directive changes the continuation character
    steps = dockerfile_steps("# escape=`\nFROM x\nWORKDIR /a\\b\nRUN echo `\n  hi\n")
    assert steps[1:] == [("WORKDIR", "/a\\b"), ("RUN", "echo   hi")]


def test_staging_substitutes_arg_and_env_as_docker_does(tmp_path: Path) -> None:
    from keelrl.sandbox.boxes import BASE_ENV

    dockerfile = (
        "ARG ROOT=/srv\nFROM debian\nARG ROOT\nARG SUB=app\nENV HOME_DIR=${ROOT}/$SUB\nWORKDIR $HOME_DIR\n"
        "ENV PATH=\"/opt/tool/bin:${PATH}\" MSG='$literal' OTHER=${UNSET:-fallback}\n"
        "COPY --chown=1000:1000 --chmod=644 a.txt ${HOME_DIR}/data/\nCOPY <<EOF notes.txt\nhello\nEOF\n"
    )
    task = load_task(
        write_task(tmp_path, "t", **{"environment/Dockerfile": dockerfile, "environment/a.txt": "a"})
    )
    out = tmp_path / "staged"
    env = stage_environment(task, out)
    assert task.workdir == "/srv/app"
    assert env == {
        "HOME_DIR": "/srv/app",
        "PATH": "/opt/tool/bin:" + BASE_ENV["PATH"],
        "MSG": "$literal",
        "OTHER": "fallback",
    }
    assert (out / "data" / "a.txt").read_text() == "a" and (out / "notes.txt").read_text() == "hello\n"


def test_staging_extracts_a_local_archive_that_add_names(tmp_path: Path) -> None:
    import tarfile

    d = write_task(tmp_path, "t", **{"environment/Dockerfile": "FROM x\nWORKDIR /app\nADD data.tar.gz ./\nCOPY data.tar.gz kept/\n"})  # fmt: skip
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "inner.txt").write_text("in")
    with tarfile.open(d / "environment" / "data.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "inner.txt", arcname="pkg/inner.txt")
    out = tmp_path / "staged"
    stage_environment(load_task(d), out)
    # ADD unpacks a local tar archive (gzip, bzip2, xz) into its destination; COPY copies it as it is
    assert (out / "pkg" / "inner.txt").read_text() == "in"
    assert (out / "kept" / "data.tar.gz").is_file() and not (out / "data.tar.gz").exists()


def test_staging_copies_the_whole_context_that_copy_dot_names(tmp_path: Path) -> None:
    df = "FROM x\nWORKDIR /app\nCOPY . .\nCOPY /src/../a.txt b.txt\n"
    task = load_task(write_task(tmp_path, "t", **{"environment/Dockerfile": df, "environment/a.txt": "a"}))
    out = tmp_path / "staged"
    stage_environment(task, out)
    # `.` and `/` are the build context's root, which `..` does not leave
    assert sorted(p.name for p in out.iterdir()) == ["Dockerfile", "a.txt", "b.txt"]


def test_the_file_tools_work_in_a_workdir_written_with_a_trailing_slash(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path, "t", '[environment]\nworkdir = "/srv/app/"\n'))
    # list_files() is list_files("."): the working directory itself
    assert resolve_path(".", task.workdir) == "/srv/app"
    assert (
        resolve_path("/srv/app/a.py", task.workdir) == "/srv/app/a.py" == resolve_path("a.py", task.workdir)
    )
    with pytest.raises(ValueError, match="outside the working tree"):
        resolve_path("/srv/application", task.workdir)


def test_staging_applies_copy_chmod(tmp_path: Path) -> None:
    df = "FROM x\nWORKDIR /app\nCOPY --chmod=755 run.sh ./\nCOPY --chmod=0750 tools/ tools/\nCOPY --chmod=700 <<EOF go.sh\necho\nEOF\n"  # fmt: skip
    task = load_task(write_task(tmp_path, "t", **{"environment/Dockerfile": df, "environment/run.sh": "echo", "environment/tools/t.sh": "echo"}))  # fmt: skip
    (task.path / "environment" / "run.sh").chmod(0o644)
    out = tmp_path / "staged"
    stage_environment(task, out)
    # --chmod sets the copied files' (and directories') mode, as the image would have it
    modes = {p: (out / p).stat().st_mode & 0o777 for p in ("run.sh", "tools/t.sh", "go.sh")}
    assert modes == {"run.sh": 0o755, "tools/t.sh": 0o750, "go.sh": 0o700}


def test_the_verifier_is_prepared_as_root_whatever_user_the_image_ends_with(tmp_path: Path) -> None:
    from keelrl.tasks.harbor import Harbor, HarborParams

    class Recorder:  # a box that records who runs what (an image whose Dockerfile ends with `USER app`)
        def __init__(self) -> None:
            self.calls: list[tuple[str | None, str]] = []

        def exec(self, command: str, *, user: str | None = None, **kw: object) -> Ran:
            self.calls.append((user, command))
            return OK_RUN

        def upload(self, src: Path, dest: str) -> None:
            pass

        def read_dir(self, path: str) -> dict[str, bytes]:
            return {"reward.txt": b"1"}

    fmt = Harbor(str(write_task(tmp_path, "t")), HarborParams())
    box = Recorder()
    assert fmt.verify(fmt.items["t"], box, True).reward == 1.0  # type: ignore[arg-type]
    # emptying /tests and /logs/verifier and making test.sh executable need root; test.sh runs as the image's user
    assert [user for user, command in box.calls if "test.sh >" not in command] == ["root", "root"]
    assert [user for user, command in box.calls if "test.sh >" in command] == [None]


def test_a_bwrap_box_does_not_read_a_host_folder_that_a_link_in_the_box_names(tmp_path: Path) -> None:
    from keelrl.sandbox.boxes import BoxSpec, BwrapBox

    host_dir = tmp_path / "host_tmp"
    host_dir.mkdir()
    (host_dir / "reward.txt").write_text("1")
    box = BwrapBox(BoxSpec("t"), network=False)
    try:
        # `ln -s /tmp /logs/verifier` in the box: on the host the link would name the host's folder
        (box.host("/logs") / "verifier").symlink_to(host_dir)
        assert box.read_dir("/logs/verifier") == {}
    finally:
        box.close()


def test_a_shift_or_a_quoted_double_angle_opens_no_heredoc() -> None:
    steps = dockerfile_steps('FROM x\nRUN echo $((1<<x)) "a <<b"\nWORKDIR /w\nRUN cat <<"EOF" > f\nx\nEOF\nENV A=1\n')  # fmt: skip
    assert [op for op, _ in steps] == ["FROM", "RUN", "WORKDIR", "RUN", "ENV"]


def test_a_copy_source_that_starts_with_a_bracket_is_a_wildcard_not_json(tmp_path: Path) -> None:
    df = "FROM x\nWORKDIR /app\nCOPY [ab].txt ./\n"
    task = load_task(write_task(tmp_path, "t", **{"environment/Dockerfile": df, "environment/a.txt": "a"}))
    out = tmp_path / "staged"
    stage_environment(task, out)
    # Docker reads an instruction that is not a JSON array in the shell form
    assert (out / "a.txt").read_text() == "a"
