"""Mistakes and accidents a user meets end in one paragraph and the right exit status, through the real
CLI (`python -m keelrl` in a subprocess, as a user runs it): a config that is not UTF-8, a truncated
model file (not restarted by the supervisor), an unusable run directory, `keelrl eval RUN_DIR`, a model
name with no hub to fetch it from, and a run whose supervisor was killed (doctor and report say so)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keelrl.run.supervisor import EXIT_USER_ERROR

SMOKE = "configs/smoke.toml"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, float]:
    """(exit status, stderr, seconds) of `python -m keelrl ARGS`."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "keelrl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, done.stderr.strip(), time.monotonic() - t0


def hub_reachable() -> bool:
    from keelrl.models.load import hub_reachable as probe

    return probe()


def assert_one_paragraph(err: str, *needles: str) -> None:
    assert "Traceback" not in err and "\n\n" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def test_config_not_utf8(tmp_path: Path) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes('[model]\npath = "tiny"  # café\n'.encode("latin-1"))
    code, err, _ = cli("train", str(config), "--run-dir", str(tmp_path / "run"))
    assert code == EXIT_USER_ERROR
    assert_one_paragraph(err, str(config), "not UTF-8", "line 2")
    assert not (tmp_path / "run").exists()


def test_truncated_weights_are_a_user_error_not_a_crash_to_restart(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    run = tmp_path / "run"
    code, err, _ = cli("train", SMOKE, "--set", f'model.path="{model}"', "--run-dir", str(run))
    assert code == EXIT_USER_ERROR, err  # the supervisor passed the worker's user error on
    assert_one_paragraph(err, f"could not load the model in {model}", "model.safetensors")
    events = run / "events.jsonl"
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()] if events.exists() else []
    assert "restart" not in kinds and "gave_up" not in kinds, kinds  # not retried
    assert json.loads((run / "status.json").read_text())["state"] == "failed"


@pytest.mark.parametrize("supervised", [pytest.param(True, marks=pytest.mark.slow), False])
def test_run_dir_is_a_file_or_under_one(tmp_path: Path, supervised: bool) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("not a directory\n")
    extra = [] if supervised else ["--no-supervisor"]
    code, err, _ = cli("train", SMOKE, "--run-dir", str(blocker), *extra)
    assert code == EXIT_USER_ERROR
    assert_one_paragraph(err, f"cannot use {blocker} as the run directory", "is a file", "--run-dir")
    code, err, _ = cli("train", SMOKE, "--run-dir", str(blocker / "run"), *extra)
    assert code == EXIT_USER_ERROR
    assert_one_paragraph(err, f"cannot use {blocker / 'run'} as the run directory", f"{blocker} is a file")
    assert blocker.read_text() == "not a directory\n"


def test_run_dir_read_only(tmp_path: Path) -> None:
    """root writes through permission bits, so the run directory is a read-only tmpfs mounted in a private
    mount namespace (`unshare`); skipped where the machine allows no such mount."""
    run = tmp_path / "ro"
    run.mkdir()
    probe = (
        subprocess.run(
            ["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o ro,size=64k tmpfs {run} && ! touch {run}/x"],
            capture_output=True,
        )
        if shutil.which("unshare")
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a read-only filesystem here (no unshare, or user namespaces are off)")
    argv = [sys.executable, "-m", "keelrl", "train", SMOKE, "--run-dir", str(run)]
    script = f"mount -t tmpfs -o ro,size=64k tmpfs {run} && exec " + " ".join(argv)
    done = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == EXIT_USER_ERROR, done.stderr
    assert_one_paragraph(
        done.stderr.strip(), f"cannot use {run} as the run directory", "Read-only file system"
    )


def test_eval_of_a_run_directory_names_the_model_directories(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": {"path": "tiny"}, "task": {"name": "countdown"}}))
    (run / "metrics.jsonl").write_text('{"step": 1, "time": 1.0}\n')
    code, err, _ = cli("eval", str(run), "--task", "countdown", "--problems", "1")
    assert code == EXIT_USER_ERROR
    assert_one_paragraph(
        err, f"{run} is a run directory", f"did you mean {run}/checkpoints/latest or {run}/final?"
    )


# Without the probe, transformers retries an unreachable hub for minutes. The bound leaves room for a busy
# machine: starting the CLI (torch, transformers) takes 3-8 s here under load, the probe at most HUB_PROBE_S.
FAST_S = 30


def test_unreachable_hub_id_fails_fast(tmp_path: Path) -> None:
    if hub_reachable():
        pytest.skip("the Hugging Face hub is reachable from here: 'ab' would be looked up for real")
    run = tmp_path / "run"
    code, err, seconds = cli(
        "train", SMOKE, "--no-supervisor", "--set", "model.path=ab", "--run-dir", str(run)
    )
    assert code == EXIT_USER_ERROR and seconds < FAST_S, (seconds, err)
    assert_one_paragraph(err, "'ab' was taken as a Hugging Face hub id", "no hub was reachable", ".gguf")
    code, err, seconds = cli(
        "train", SMOKE, "--no-supervisor", "--set", "model.path=ab", env={"HF_HUB_OFFLINE": "1"}
    )
    assert code == EXIT_USER_ERROR and seconds < FAST_S, (seconds, err)
    assert_one_paragraph(err, "'ab' was taken as a Hugging Face hub id", "HF_HUB_OFFLINE")


def test_cached_hub_id_loads_without_a_hub(tmp_path: Path, tiny_model_dir: Path) -> None:
    if hub_reachable():
        pytest.skip("the Hugging Face hub is reachable from here")
    # the hub cache's layout: models--ORG--NAME/{refs/main, snapshots/REVISION/...}
    repo = tmp_path / "hf" / "hub" / "models--keelrl-test--tiny"
    revision = "0" * 40
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    args = ["eval", "keelrl-test/tiny", "--task", "countdown", "--problems", "1", "--max-new-tokens", "2"]
    code, err, seconds = cli(*args, env={"HF_HOME": str(tmp_path / "hf")})
    assert code == 0 and seconds < 60, (seconds, err)  # 8 s here; the hub retried would take minutes


def _status_of_a_killed_supervisor(run: Path, silent_s: float) -> None:
    """A run directory as a SIGKILLed supervisor leaves it: status 'running', a pid that is gone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    then = time.time() - silent_s
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"supervisor": {"hang_timeout_s": 600}}))
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "time": then - 10 + s, "reward/mean": 0.5}) + "\n" for s in range(1, 4)
        )
    )
    status = {"state": "running", "step": 3, "pid": gone.pid, "host": socket.gethostname()}
    (run / "status.json").write_text(json.dumps({**status, "last_heartbeat": then, "updated": then}))
    for f in run.iterdir():
        os.utime(f, (then, then))


def test_doctor_and_report_see_a_stale_running_status(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _status_of_a_killed_supervisor(run, silent_s=2 * 3600)
    done = subprocess.run(
        [sys.executable, "-m", "keelrl", "doctor", str(run), "--json"], capture_output=True, text=True
    )
    state = json.loads(done.stdout)["headline"]["state"]
    assert state == "running (stale: no heartbeat for 2.0 h; the process is gone)", state
    assert done.returncode == 2  # critical: the run stalled
    done = subprocess.run(
        [sys.executable, "-m", "keelrl", "doctor", str(run)], capture_output=True, text=True
    )
    assert f"state {state}" in done.stdout
    out = tmp_path / "report.html"
    code, err, _ = cli("report", str(run), "-o", str(out))
    assert code == 0, err
    assert "running (stale: no heartbeat for 2.0 h; the process is gone)" in out.read_text()


def test_torchrun_without_the_supervisor_says_how(tmp_path: Path) -> None:
    code, err, _ = cli("train", SMOKE, "--torchrun", "--no-supervisor", "--run-dir", str(tmp_path / "r"))
    assert code == EXIT_USER_ERROR and "need the supervisor" in err and "torchrun" in err
    assert not (tmp_path / "r").exists()
