"""What a user sees of a run without a terminal (a pipe, a CI log), through the real CLI in a subprocess
(issue 46): per-step lines with each stage's figures arrive while the run runs, plain (no ANSI codes, no
carriage returns), and the same lines are in RUN/worker.log; a mistake that a restart cannot fix ends the
command with exit status 2 within seconds, in one paragraph naming the setting, with no restart and no
traceback; a worker killed by SIGKILL is still restarted and the terminal says why; a reader that goes away
(`| head`) ends the output without a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keelrl.run.supervisor import EXIT_USER_ERROR, WORKER_LOG

SMOKE = "configs/smoke.toml"
TESTS = Path(__file__).resolve().parents[1]
# issue 46: a setup error ends the command within 15 s (measured 1.9-7 s: docs/RESULTS.md); the bound leaves room for
# a loaded machine (starting the CLI took 16 s at nice 19 beside a test run), while a restart loop takes minutes
FAST_S = 30


def keelrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "keelrl", *args]


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def watch(
    argv: list[str], run_dir: Path, env: dict[str, str] | None = None
) -> tuple[list[str], list[str], str]:
    """Run `argv`, reading its stdout line by line as it comes: (every line, the step lines that arrived while
    the run was still running (before summary.json), stderr)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    lines, live = [], []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step ") and not (run_dir / "summary.json").exists():
            live.append(line)
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=300) == 0, err[-3000:]
    return lines, live, err


def step_lines(lines: list[str]) -> dict[int, str]:
    """The per-step metric lines (`step     3  reward ...`; an event's line is `step 3 guard ...`) by step."""
    return {int(m.group(1)): line for line in lines if (m := re.match(r"step +(\d+)  \S", line))}


def assert_plain(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text, repr(text[:500])


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str], str]:
    run_dir = tmp_path_factory.mktemp("terminal") / "run"
    argv = keelrl("train", SMOKE, "--run-dir", str(run_dir), *sets("train.steps=12", "eval.every_steps=6"))
    return (run_dir, *watch(argv, run_dir))


def test_rl_step_lines_arrive_while_the_run_runs(smoke_run: tuple[Path, list[str], list[str], str]) -> None:
    run_dir, lines, live, err = smoke_run
    steps = step_lines(lines)
    assert sorted(steps) == list(range(13))  # step 0: the eval before training
    assert all("reward " in steps[s] and "acc " in steps[s] for s in range(1, 13))
    assert "eval_acc " in steps[0] and "eval_acc " in steps[6] and "eval_acc " in steps[12]
    assert step_lines(live).keys() >= {1, 2, 3}, "step lines came only at the end"
    assert lines[0].startswith("keelrl: tiny") and lines[-1].startswith("done: 12 steps")
    assert_plain("".join(lines) + err)
    log = (run_dir / WORKER_LOG).read_text()
    assert all(line in log for line in steps.values())  # the terminal's lines are the worker's


def test_guard_findings_are_sentences(smoke_run: tuple[Path, list[str], list[str], str]) -> None:
    # the smoke model is random: no reward at all, which the exact_zero guard reports (a warning)
    guard = [line for line in smoke_run[1] if " guard (exact_zero): " in line]
    assert guard and "What to do: " in guard[0] and "{" not in guard[0] and "=" not in guard[0]


def test_sft_and_rm_lines_show_their_loss(tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "completion": str(2 * i)}) + "\n" for i in range(60))
    )
    run_dir = tmp_path / "sft"
    argv = keelrl("sft", SMOKE, "--run-dir", str(run_dir), *sets(f"data.path={data}", "data.batch_size=8",
                  "data.eval_fraction=0.2", "train.steps=3", "data.task_eval=false"))  # fmt: skip
    lines, live, err = watch(argv, run_dir)
    steps = step_lines(lines)
    assert all(steps[s].split()[2] == "loss" for s in (1, 2, 3)) and "eval_loss " in steps[3]
    assert step_lines(live), "no SFT step line came before the end"
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(
        "".join(
            json.dumps({"prompt": f"{i}?", "chosen": "yes", "rejected": f"no {i}"}) + "\n" for i in range(250)
        )
    )
    run_dir = tmp_path / "rm"
    argv = keelrl("rm", "train", str(prefs), "--model", "tiny", "--run-dir", str(run_dir),
                  *sets("train.steps=3", "data.batch_size=8", "model.tiny.hidden_size=32"))  # fmt: skip
    lines, _, err = watch(argv, run_dir)
    steps = step_lines(lines)
    assert all(steps[s].split()[2] == "loss" and " acc " in steps[s] for s in (1, 2, 3)), steps
    assert "eval_acc " in steps[3] and lines[-1].startswith("done: 3 steps, held-out pair accuracy")
    assert_plain("".join(lines) + err)


def _hiding(folder: Path) -> Path:
    """A folder for PYTHONPATH whose sitecustomize hides optional packages, as if they were not installed (find_spec
    and import both see None)."""
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\nfor name in ('wandb', 'peft', 'vllm', 'ray'):\n    sys.modules[name] = None\n"
    )
    return folder


SETUP_ERRORS = {  # --set items -> what the message must name
    "task constructor TypeError": (
        ["task.name=user_tasks:NeedsLevel"],
        ["task.params", "TypeError", "'level'"],
    ),
    "task split empty": (["task.name=user_tasks:NoTestSplit"], ["task.name", "no test problem"]),
    "task module missing": (["task.name=no_such_module:Task"], ["cannot load task", "no_such_module"]),
    "task dir missing": (["task.name=dir:/nonexistent/tasks"], ["task.name = 'dir:PATH'", "does not exist"]),
    "reward function missing": (
        [
            "task.name=dataset",
            'task.params={path = "configs/dataset/sums.jsonl", reward = "no_such_module:fn"}',
        ],
        ["task.params.reward", "no_such_module"],
    ),
    "wandb missing": (["log.wandb=true"], ["log.wandb", "pip install 'wandb"]),
    "peft missing": (["model.lora.rank=4"], ["model.lora.rank", "pip install 'peft"]),
    "vllm missing": (["rollout.engine=vllm"], ["rollout.engine", "pip install 'vllm"]),
    "ray missing": (["distributed.sampler=ray"], ["change distributed.sampler", "pip install 'ray"]),
    "model path missing": (["model.path=/nonexistent/model"], ["model.path", "does not exist"]),
    "model run dir missing": (["model.path=runs/nothing/final"], ["model.path", "does not exist"]),
}


@pytest.mark.parametrize("case", list(SETUP_ERRORS))
def test_setup_errors_exit_2_in_seconds_without_a_restart(tmp_path: Path, case: str) -> None:
    overrides, needles = SETUP_ERRORS[case]
    path = [
        str(_hiding(tmp_path / "hide")),
        str(TESTS),
        os.environ.get("PYTHONPATH", ""),
    ]  # TESTS: user_tasks
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    done = subprocess.run(keelrl("train", SMOKE, "--run-dir", str(run_dir), *sets(*overrides)),
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    seconds = time.monotonic() - t0
    assert done.returncode == EXIT_USER_ERROR and seconds < FAST_S, (seconds, done.stderr)
    err = done.stderr.strip()
    assert "Traceback" not in err and "\n\n" not in err and err.startswith("keelrl train: error:"), err
    assert all(needle in err for needle in needles), (needles, err)
    assert not run_dir.exists(), "nothing is started (so nothing is restarted) for a mistake in the inputs"


def test_rm_train_refuses_too_few_pairs(tmp_path: Path) -> None:
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(
        "".join(json.dumps({"prompt": f"{i}?", "chosen": "a", "rejected": "b"}) + "\n" for i in range(14))
    )
    t0 = time.monotonic()
    done = subprocess.run(keelrl("rm", "train", str(prefs), "--model", "tiny", "--run-dir", str(tmp_path / "rm")),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == EXIT_USER_ERROR and time.monotonic() - t0 < FAST_S, done.stderr
    assert "14 preference pairs" in done.stderr and "data.eval_fraction" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "rm").exists()


def test_a_killed_worker_is_restarted_and_the_terminal_says_why(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = keelrl("train", SMOKE, "--run-dir", str(run_dir),
                  *sets("train.steps=8", "checkpoint.every_steps=2", "supervisor.backoff_s=0.2"))  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the worker has trained a step and checkpointed one
            if line.startswith("step     3 "):
                break
        worker = json.loads((run_dir / "status.json").read_text())["worker_pid"]
        os.kill(worker, signal.SIGKILL)
        out = line + proc.stdout.read()
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.wait(timeout=300) == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    restarts = [
        e
        for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
        if e["kind"] == "restart"
    ]
    assert len(restarts) == 1 and "SIGKILL" in restarts[0]["cause"]
    said = [
        line for line in out.splitlines() if line.startswith("keelrl supervisor: worker killed by SIGKILL")
    ]
    assert said and ", at step " in said[0] and "; restart 1 in " in said[0], out[-3000:]
    assert out.rstrip().splitlines()[-1].startswith("done: 8 steps") and "Traceback" not in err


@pytest.mark.parametrize(
    "args", [["doctor", "RUN"], ["doctor", "RUN", "--json"], ["config-fields"], ["--help"]]
)
def test_a_reader_that_goes_away_ends_without_a_traceback(
    smoke_run: tuple[Path, list[str], list[str], str], args: list[str]
) -> None:
    argv = keelrl(*[str(smoke_run[0]) if a == "RUN" else a for a in args])
    head = subprocess.run(
        " ".join(argv) + " | head -1", shell=True, capture_output=True, text=True, timeout=120
    )
    assert head.returncode == 0 and len(head.stdout.splitlines()) == 1 and head.stderr == "", head.stderr
    # the reader closes before the first byte: every write meets a broken pipe
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) in (0, 128 + signal.SIGPIPE) and err == "", err


def test_training_goes_on_when_its_reader_goes_away(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = keelrl("train", SMOKE, "--run-dir", str(run_dir), *sets("train.steps=2", "eval.every_steps=0"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


def test_a_guard_stop_ends_with_the_findings_sentence(tmp_path: Path) -> None:
    (tmp_path / "broken_tasks.py").write_text(
        "from keelrl.tasks.multiply import Multiply\n"
        "class Broken(Multiply):\n"
        "    def score(self, problem, completion):\n"
        "        raise RuntimeError('the checker cannot run')\n"
    )
    run_dir = tmp_path / "run"
    argv = keelrl(
        "train",
        SMOKE,
        "--run-dir",
        str(run_dir),
        *sets("task.name=broken_tasks:Broken", "eval.every_steps=0"),
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]  # a guard's stop: not restarted
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"run stopped at step 1 (run dir {run_dir}): stopped by guards at step 1: unscored_episodes: "
    ), last
    assert "100% of step 1's episodes ended without a reward" in last and "What to do: " in last
    assert "Traceback" not in done.stderr and "step 1 guard (unscored_episodes): " in done.stdout
