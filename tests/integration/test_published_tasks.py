"""Tasks in the forms they are published in (tests/fixtures/: our own text, the published structure): a Terminal-Bench 2
task as Harbor's registry serves it (schema 1.1, [task] and authors, the uv + pytest test.sh that fetches its runner
from astral.sh, a docker_image with its Dockerfile), a newer Harbor task (schema 1.4: network_mode, workdir, a
healthcheck, an ENTRYPOINT that starts a service, reward.json with partial credit), an older one (version 1.0,
memory = "1G"), a multi-container one (docker-compose.yaml with a sidecar), and SWE-bench / SWE-Gym rows as those
data sets ship them. Each loads (or is refused) as docs/tasks.md says, and `keelrl tasks check` reports each
outcome honestly on both backends: offline, the Terminal-Bench verifier is a verifier_error, never a 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from keelrl.cli.main import main
from keelrl.tasks import get_task
from keelrl.tasks.env import play_text
from keelrl.tasks.harbor import load_task
from keelrl.tasks.repo import tool_call_text

FIXTURES = Path(__file__).parents[1] / "fixtures"
HARBOR = FIXTURES / "harbor"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(params=["bwrap", "container"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "container":
        from keelrl.sandbox.boxes import find_runtime
        from keelrl.sandbox.images import make_stand_ins

        make_stand_ins(find_runtime(request.getfixturevalue("container_runtime")), ["ubuntu:24.04"])
    elif shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    return request.param


def test_published_task_tomls_are_read_field_by_field() -> None:
    tb2 = load_task(HARBOR / "log-error-count")
    c = tb2.config
    assert (c.schema_version, c.verifier.timeout_sec, c.agent.timeout_sec, tb2.agent_timeout) == (
        "1.1",
        900,
        900,
        900,
    )
    assert (
        c.metadata["author_email"] == "fixtures@keelrl.invalid"
        and c.metadata["expert_time_estimate_min"] == 5.0
    )
    assert (tb2.bucket, c.metadata["category"], c.metadata["tags"]) == (
        "easy",
        "data-processing",
        ["logs", "text-processing"],
    )
    e = c.environment
    assert (e.docker_image, e.cpus, e.memory_mb, e.storage_mb, e.build_timeout_sec) == (
        "alexgshaw/log-error-count:20251031", 1, 2048, 10240, 600
    )  # fmt: skip
    assert tb2.nets == (True, True) and tb2.workdir == "/app" and tb2.dockerfile
    new = load_task(HARBOR / "stock-report")
    assert (new.config.schema_version, new.workdir, new.nets) == ("1.4", "/srv/app", (False, False))
    assert new.config.environment.healthcheck.command == "test -f /run/inventory.ready"
    assert new.config.solution.env == {"SORT_ORDER": "name"} and new.config.environment.memory_mb == 512
    old = load_task(HARBOR / "word-frequency")
    assert (old.config.schema_version, old.config.environment.memory_mb, old.config.environment.storage_mb) == (
        "1.0", 1024, 4096
    )  # fmt: skip
    assert old.nets == (False, False) and old.agent_timeout == 300


def _offline_copy(tmp_path: Path) -> Path:
    """The fixture set with the Terminal-Bench task's internet off: offline on every machine, not only here."""
    root = tmp_path / "set"
    shutil.copytree(HARBOR, root)
    toml = root / "log-error-count" / "task.toml"
    toml.write_text(toml.read_text().replace("allow_internet = true", "allow_internet = false"))
    return root


def test_tasks_check_reports_each_published_task_honestly(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code = main(["tasks", "check", str(_offline_copy(tmp_path)), "--json", "--backend", backend])
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    assert code == 1 and set(rows) == {"api-client", "log-error-count", "stock-report", "word-frequency"}
    sidecar = rows["api-client"]
    assert (
        sidecar["oracle_status"] == "load_error" and "adds the services api-server" in sidecar["oracle_error"]
    )
    # its test.sh cannot fetch uv offline and writes 0: reported as what it is, not as a wrong answer
    tb2 = rows["log-error-count"]
    assert (tb2["oracle_status"], tb2["untouched_status"], tb2["oracle_reward"]) == (
        "verifier_error",
    ) * 2 + (None,)
    assert (
        "could not fetch its test runner" in tb2["oracle_error"]
        and "is not in the box" in tb2["oracle_error"]
    )
    assert rows["word-frequency"]["good"]
    service = rows["stock-report"]
    if backend == "container":  # the ENTRYPOINT's service ran and the healthcheck passed
        assert service["good"] and (service["oracle_reward"], service["untouched_reward"]) == (1.0, 0.0)
    else:  # bubblewrap applies no image, so the service never starts: the box does not, and says why
        assert service["oracle_status"] == "agent_error" and "ENTRYPOINT" in service["oracle_error"]


def test_partial_credit_from_reward_json_in_a_newer_task(container_runtime: str) -> None:
    env = get_task(
        f"dir:{HARBOR}", sandbox={"backend": "container"}, validate_oracle=False, where={"tags": "services"}
    )
    assert env.names == ["stock-report"]
    one = tool_call_text("shell", command="pwd; echo 'bolts 3' > report.txt")  # 1 of the 3 lines, in /srv/app
    score, _, results = play_text(env, {"task": "stock-report"}, [one, "done"])
    assert results[0].messages[0]["content"].startswith("exit status 0\nstdout:\n/srv/app")
    assert (score.status, round(score.reward, 3), score.correct) == ("ok", 0.333, False)
    assert score.info["verifier_metrics"] == {"found": 1.0, "expected": 3.0}


def test_swebench_and_swegym_rows_as_published_load(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = FIXTURES / "swebench" / "published.jsonl"
    env = get_task(f"swebench:{rows}", sandbox={"backend": "bwrap"}, validate_oracle=False)
    bench, gym = (env.items[n] for n in ("acme__tinyparse-101", "acme__tinyparse-102"))
    for inst in (bench, gym):  # FAIL_TO_PASS a JSON string (SWE-bench) or a list (SWE-Gym): the same lists
        assert inst.FAIL_TO_PASS == ["tests/test_numbers.py::test_underscores"]
        assert inst.PASS_TO_PASS == ["tests/test_numbers.py::test_plain"]
        assert inst.touched() == ["tests/test_numbers.py"] and inst.patch.startswith("diff --git")
        # no image and no repo_path: SWE-bench's own evaluation image, its conda environment activated
        assert (
            inst.image
            == f"docker.io/swebench/sweb.eval.x86_64.acme_1776_tinyparse-{inst.instance_id[-3:]}:latest"
        )
        assert "conda activate testbed && pytest -rA" in inst.test_cmd
    assert (bench.meta["version"], bench.meta["created_at"], bench.meta["environment_setup_commit"][:6]) == (
        "0.3", "2023-04-11T09:21:44Z", "9a8b7c"
    )  # fmt: skip
    assert bench.meta["hints_text"].startswith("Strip") and (bench.bucket, gym.bucket) == (
        "<15 min fix",
        "all",
    )
    only = get_task(
        f"swebench:{rows}", sandbox={"backend": "bwrap"}, validate_oracle=False, where={"version": "0.4"}
    )
    assert only.names == ["acme__tinyparse-102"]
    # the bwrap backend needs the repository here: said per instance, as a box that cannot start
    assert main(["tasks", "check", str(rows), "--json", "--backend", "bwrap"]) == 1
    checked = json.loads(capsys.readouterr().out)
    assert [r["oracle_status"] for r in checked] == ["agent_error"] * 2
    assert "has no repo_path" in checked[0]["oracle_error"]


def test_a_published_row_whose_image_is_not_here_says_so(
    container_runtime: str, capsys: pytest.CaptureFixture
) -> None:
    rows = FIXTURES / "swebench" / "published.jsonl"
    main(["tasks", "check", str(rows), "--json", "--backend", "container"])
    row = json.loads(capsys.readouterr().out)[0]
    assert row["oracle_status"] == "agent_error"
    assert "sweb.eval.x86_64.acme_1776_tinyparse-101:latest is not on this machine" in row["oracle_error"]
