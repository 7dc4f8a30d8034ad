"""RL from a data set and a reward function (task "dataset"), end to end: 3 steps on a JSONL file with a reward
function from a module in a temporary folder, through `keelrl train` (a subprocess, under the supervisor) and
through `keelrl.train` (in this process, and from a script's `__main__` under the supervisor, on a data set
written by `datasets.save_to_disk`). Each checks that the function was called with exactly its row's fields and
that the rewards in metrics.jsonl and rollouts.jsonl.gz are what it returned; the first run is then evaluated,
compared, diagnosed, reported and judged like a built-in task's."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

import keelrl

STEPS, BATCH, EVAL = 3, 16, 4
ROWS = [
    {"prompt": f"{i}+{i + 1}=", "answer": str(2 * i + 1), "level": i % 3, "source": f"s{i}"}
    for i in range(40)
]
# what the reward function returns: deterministic, and spread out even on a random model's completions
VALUE = 'sum(map(ord, completion)) % 5 / 4 + (row["answer"] in completion)'
MODULE = f"""
import json, os

def score(completion, **row):
    value = {VALUE}
    with open(os.environ["REWARD_LOG"], "a") as f:
        f.write(json.dumps({{"completion": completion, "row": row, "value": value}}) + "\\n")
    return value
"""


def config(model_dir: Path, path: Any, **task_params: Any) -> dict[str, Any]:
    return {
        "model": {"path": str(model_dir)},
        "task": {
            "name": "dataset",
            "template": "compact",
            "params": {
                "path": path if hasattr(path, "save_to_disk") else str(path),
                "test": 0.25,
                **task_params,
            },
        },
        "rollout": {"batch_size": BATCH, "group_size": 4, "max_new_tokens": 8},
        "algo": {"lr": 1e-3},
        "train": {"steps": STEPS, "micro_batch_size": 8, "threads": 1},
        "eval": {"at_start": False, "every_steps": 0, "problems": EVAL},
        "checkpoint": {"every_steps": 2},
        "log": {"rollouts_per_step": BATCH, "progress": False},
    }


def toml(cfg: dict[str, Any]) -> str:
    """The config as TOML (JSON scalars and arrays are TOML values; tables become inline tables)."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return "[" + ", ".join(map(value, v)) + "]" if isinstance(v, list) else json.dumps(v)

    return "".join(f"[{s}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in t.items()) for s, t in cfg.items())


def check_rewards(run: Path, calls: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Every call got its row's fields, nothing else; the training calls come first, one batch per step, then
    the final eval's; metrics and rollouts hold what the function returned."""
    by_prompt = {r["prompt"]: r for r in rows}
    assert len(calls) == STEPS * BATCH + EVAL
    assert all(c["row"] == by_prompt[c["row"]["prompt"]] for c in calls)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {m["step"]: m for m in metrics if "reward/mean" in m}
    for s in range(1, STEPS + 1):
        values = [c["value"] for c in calls[(s - 1) * BATCH : s * BATCH]]
        assert steps[s]["reward/mean"] == pytest.approx(mean(values)) == steps[s]["reward/fn/score"], s
        assert steps[s]["accuracy"] == pytest.approx(mean(v >= 1 for v in values))  # correct_at = 1.0
        assert steps[s]["episode/verifier_errors"] == 0
    final = next(m for m in metrics if m["step"] == STEPS and "eval/reward/mean" in m)
    assert final["eval/reward/mean"] == pytest.approx(mean(c["value"] for c in calls[-EVAL:]))
    returned = {(c["completion"], c["row"]["prompt"]): c["value"] for c in calls}
    with gzip.open(run / "rollouts.jsonl.gz", "rt") as f:
        rollouts = [json.loads(line) for line in f]
    assert len(rollouts) == STEPS * BATCH
    assert all(r["reward"] == pytest.approx(returned[(r["text"], r["problem"]["prompt"])]) for r in rollouts)
    assert {r["problem"]["split"] for r in rollouts} == {"train"}


def read_calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: sums.jsonl, and the module `my_rewards` with the reward function `score`."""
    d = tmp_path_factory.mktemp("user")
    (d / "my_rewards.py").write_text(textwrap.dedent(MODULE))
    (d / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return d


@pytest.fixture(scope="module")
def cli_run(user_dir: Path, tiny_model_dir: Path) -> tuple[Path, dict[str, str]]:
    """`keelrl train` on the command line, the reward module found through PYTHONPATH."""
    cfg = config(tiny_model_dir, user_dir / "sums.jsonl", reward="my_rewards:score", difficulty_field="level")
    (user_dir / "run.toml").write_text(toml(cfg))
    env = {**os.environ, "PYTHONPATH": str(user_dir), "REWARD_LOG": str(user_dir / "calls.jsonl")}
    run = user_dir / "run"
    out = subprocess.run(
        [sys.executable, "-m", "keelrl", "train", str(user_dir / "run.toml"), "--run-dir", str(run)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return run, env


def test_cli_trains_on_a_jsonl_file_with_a_reward_module(
    cli_run: tuple[Path, dict[str, str]], user_dir: Path
) -> None:
    run, _ = cli_run
    check_rewards(run, read_calls(user_dir / "calls.jsonl"), ROWS)
    assert json.loads((run / "summary.json").read_text())["state"] == "finished"


def test_eval_compare_doctor_report_and_judge_work_on_the_run(
    cli_run: tuple[Path, dict[str, str]], user_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run, env = cli_run

    def keelrl_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keelrl", *args], env=env, capture_output=True, text=True, timeout=300
        )

    # keelrl eval of the run's final policy: the task's parameters come from the run; the held-out rows are
    # evaluated once each at most, scored by the same function
    ev = keelrl_cli("eval", str(run / "final"), "--task", "dataset", "--problems", "100", "--out", str(tmp_path / "a.json"), "--json")  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    result = json.loads((tmp_path / "a.json").read_text())
    held_out = [
        r for r in ROWS if any(r["prompt"] == x["problem"]["prompt"] for x in result["records"]["greedy"])
    ]
    assert 0 < len(result["records"]["greedy"]) == len(held_out) < 40
    by_level = {str(r["level"]) for r in held_out}
    assert (
        set(result["records"]["greedy"][0]) >= {"problem", "difficulty"}
        and {x["difficulty"] for x in result["records"]["greedy"]} == by_level
    )
    cmp = keelrl_cli("compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--json")
    assert cmp.returncode == 0 and json.loads(cmp.stdout)["a"] == str(tmp_path / "a.json"), cmp.stderr
    doc = keelrl_cli("doctor", str(run), "--json")
    assert doc.returncode in (0, 1, 2) and "findings" in json.loads(doc.stdout), doc.stderr
    rep = keelrl_cli("report", str(run), "-o", str(tmp_path / "report.html"))
    assert rep.returncode == 0 and (tmp_path / "report.html").stat().st_size > 1000, rep.stderr
    # a judge session between the final policy and its first checkpoint, on the run's held-out rows
    from keelrl.judge.session import create_session

    monkeypatch.syspath_prepend(str(user_dir))
    monkeypatch.setenv("REWARD_LOG", str(tmp_path / "judge_calls.jsonl"))
    ckpt = sorted((run / "checkpoints").glob("step_*"))[0]
    store = create_session([str(run / "final"), str(ckpt)], out=tmp_path / "judge", task="dataset", problems=3, device="cpu", max_new_tokens=8)  # fmt: skip
    prompts = {p.prompt for p in store.pairs()}
    assert prompts and prompts <= {r["prompt"] for r in held_out}


def test_python_api_in_this_process_calls_the_function_itself(user_dir: Path, tiny_model_dir: Path) -> None:
    calls: list[dict[str, Any]] = []

    def score(completion: str, **row: Any) -> float:  # a closure: it appends to this test's list
        value = eval(VALUE)
        calls.append({"completion": completion, "row": row, "value": value})
        return value

    cfg = config(tiny_model_dir, user_dir / "sums.jsonl")
    result = keelrl.train(
        cfg,
        run_dir=user_dir / "api_run",
        overrides={"supervisor.enabled": False, "train.steps": STEPS},
        reward=score,
    )
    check_rewards(result.run_dir, calls, ROWS)
    assert result.metrics["step"] == STEPS and result.metrics["reward/mean"] == pytest.approx(
        mean(c["value"] for c in calls[(STEPS - 1) * BATCH : STEPS * BATCH])
    )
    assert "eval/accuracy" in result.metrics and result.summary["steps"] == STEPS


SCRIPT = f"""
import json, sys
import keelrl

LOG = sys.argv[2]   # a global the function reads: cloudpickle sends its value along

def score(completion, **row):   # defined in __main__: it reaches the supervised worker by cloudpickle
    value = {VALUE}
    with open(LOG, "a") as f:
        f.write(json.dumps({{"completion": completion, "row": row, "value": value}}) + "\\n")
    return value

config = json.loads(open(sys.argv[1]).read())
result = keelrl.train(config, run_dir=sys.argv[3], overrides={{"train.steps": {STEPS}}}, reward=[{{"fn": score, "weight": 1.0}}])
print(json.dumps({{"run_dir": str(result.run_dir), "reward": result.metrics["reward/mean"]}}))
"""


def test_python_api_under_the_supervisor_with_a_main_function_and_a_saved_hub_data_set(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    import datasets

    train, test = ROWS[:30], ROWS[30:]
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(train), test=datasets.Dataset.from_list(test)
    ).save_to_disk(str(tmp_path / "hub"))
    cfg = config(tiny_model_dir, tmp_path / "hub")
    del cfg["task"]["params"]["test"]  # the data's own test split
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), str(tmp_path / "cfg.json"), str(tmp_path / "calls.jsonl"), str(run)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    calls = read_calls(tmp_path / "calls.jsonl")
    check_rewards(run, calls, ROWS)
    assert {c["row"]["prompt"] for c in calls[: STEPS * BATCH]} <= {r["prompt"] for r in train}
    assert {c["row"]["prompt"] for c in calls[-EVAL:]} <= {r["prompt"] for r in test}
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["run_dir"] == str(run) and shown["reward"] == pytest.approx(
        mean(c["value"] for c in calls[32:48])
    )
    resolved = json.loads((run / "config.json").read_text())["task"]["params"]["reward"]
    assert resolved == [{"fn": str(run.resolve() / "rewards" / "0-score.pkl"), "weight": 1.0}]


def test_a_reward_that_never_returns_a_number_stops_the_run_with_one_sentence(
    tmp_path: Path, user_dir: Path, tiny_model_dir: Path
) -> None:
    cfg = config(tiny_model_dir, user_dir / "sums.jsonl")
    with pytest.raises(
        keelrl.RunFailed,
        match=r"stopped at step 1: stopped by guards at step 1: unscored_episodes: 100% of step 1's episodes",
    ):
        keelrl.train(
            cfg, tmp_path / "run", {"supervisor.enabled": False}, reward=lambda completion, **row: None
        )
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    stop = next(e for e in events if e["kind"] == "guard_stop")
    assert stop["rule"] == "unscored_episodes"
    assert "100% of step 1's episodes ended without a reward (16 verifier errors)" in stop["message"]
    with gzip.open(tmp_path / "run" / "rollouts.jsonl.gz", "rt") as f:
        first = json.loads(f.readline())
    assert first["status"] == "verifier_error"
    assert first["info"]["error"].startswith(
        "reward function <lambda> returned None (none applies to this sample)"
    )


def test_sft_and_evaluate_take_the_same_arguments(
    tmp_path: Path, user_dir: Path, tiny_model_dir: Path
) -> None:
    examples = [{"prompt": r["prompt"], "completion": r["answer"]} for r in ROWS]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    cfg = config(tiny_model_dir, user_dir / "sums.jsonl", reward="my_rewards:score")  # the task: for its eval
    cfg["data"] = {
        "path": str(tmp_path / "sft.jsonl"),
        "batch_size": 8,
        "max_length": 32,
        "eval_fraction": 0.1,
    }
    seen: list[str] = []

    def record(completion: str, **row: Any) -> float:
        seen.append(row["prompt"])
        return 1.0

    over = {"supervisor.enabled": False, "train.steps": 2, "train.micro_batch_size": 8}
    result = keelrl.sft(cfg, tmp_path / "sft", over, reward=record)
    assert result.summary["stage"] == "sft" and result.metrics["step"] == 2 and "eval/loss" in result.metrics
    assert result.metrics["eval/accuracy"] == 1.0 and len(seen) == EVAL  # the task's eval scored by `record`
    ev = keelrl.evaluate(cfg, tmp_path / "ev", {"model.path": str(tmp_path / "sft" / "final")}, record)
    assert ev.metrics["accuracy"] == 1.0 and ev.metrics["problems"] == EVAL and len(seen) == 2 * EVAL
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["records"]["greedy"][0]["rewards"] == [1.0]
    assert keelrl.evaluate(cfg, overrides={"eval.problems": 2}, reward=record).run_dir is None


def test_api_errors_say_what_to_change(tmp_path: Path, user_dir: Path, tiny_model_dir: Path) -> None:
    import threading

    from keelrl.config import ConfigError

    cfg = config(tiny_model_dir, user_dir / "sums.jsonl")
    lock = threading.Lock()

    def holds_a_lock(completion: str, **row: Any) -> float:
        with lock:
            return 1.0

    with pytest.raises(
        ConfigError, match=r"cannot be sent to the worker process .* supervisor.enabled = false"
    ):
        keelrl.train(cfg, tmp_path / "a", reward=holds_a_lock)
    with pytest.raises(ConfigError, match=r"reward\[1\] is 3, not a function"):
        keelrl.train(cfg, tmp_path / "b", reward=["my_rewards:score", {"fn": 3}])
    with pytest.raises(ConfigError, match=r"overrides\['model.path.x'\]: 'path' is a value, not a section"):
        keelrl.train(cfg, tmp_path / "c", {"model.path.x": 1})
    with pytest.raises(ConfigError, match=r"task\.params\.reward: no reward function"):
        keelrl.train(cfg, tmp_path / "d")
    assert not (tmp_path / "d").exists()  # nothing was started


def test_a_killed_run_resumes_to_the_weights_of_the_uninterrupted_one(
    tmp_path: Path, user_dir: Path, tiny_model_dir: Path
) -> None:
    """Killed after step 3 (checkpoint at 2) and resumed, in this process and under the supervisor (a lambda
    sent by cloudpickle), with an adaptive curriculum over the difficulty column: the final weights equal an
    uninterrupted run's."""
    from keelrl.run.faults import InjectedFault

    cfg = config(tiny_model_dir, user_dir / "sums.jsonl", difficulty_field="level")
    cfg["curriculum"] = {"kind": "adaptive"}
    over = {"train.steps": 4, "supervisor.enabled": False}
    score = lambda completion, **row: sum(map(ord, completion)) % 5 / 4 + (row["answer"] in completion)  # noqa: E731
    clean = keelrl.train(cfg, tmp_path / "clean", over, reward=score).summary["weights_sha256"]
    crash = {**over, "faults.crash_at_step": 3}
    with pytest.raises(InjectedFault):
        keelrl.train(cfg, tmp_path / "here", crash, reward=score)
    assert keelrl.train(cfg, tmp_path / "here", crash, reward=score).summary["weights_sha256"] == clean
    sup = {**crash, "supervisor.enabled": True, "supervisor.backoff_s": 0.2}
    result = keelrl.train(cfg, tmp_path / "supervised", sup, reward=score)
    events = [json.loads(x) for x in (tmp_path / "supervised" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "restart" for e in events) and result.summary["weights_sha256"] == clean
    steps = [
        json.loads(x)["reward/mean"] for x in (tmp_path / "clean" / "metrics.jsonl").read_text().splitlines()
    ]
    again = [json.loads(x) for x in (tmp_path / "supervised" / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/mean"] for m in again if "reward/mean" in m][-4:] == steps[-4:]


def test_an_in_process_run_is_evaluated_by_its_directory_and_by_the_cli(
    tmp_path: Path, user_dir: Path, tiny_model_dir: Path
) -> None:
    """A notebook: keelrl.train in this process while an event loop runs, on a `datasets.Dataset` in memory (as
    TRL takes it), the reward a closure; the run is then evaluated with keelrl.evaluate(run_dir) and `keelrl eval
    RUN/final` (the data and the closure were written with the run)."""
    import asyncio

    import datasets

    bonus = 0.5

    def score(completion: str, answer: str, **row: Any) -> float:
        return bonus + (answer in completion)

    async def notebook_cell() -> keelrl.Result:
        data = datasets.Dataset.from_list(ROWS)
        return keelrl.train(config(tiny_model_dir, data), tmp_path / "nb", {"supervisor.enabled": False}, reward=score)  # fmt: skip

    result = asyncio.run(notebook_cell())
    assert (tmp_path / "nb" / "rewards" / "0-score.pkl").exists() and result.metrics["reward/mean"] >= bonus
    assert json.loads((tmp_path / "nb" / "config.json").read_text())["task"]["params"]["path"] == str(tmp_path / "nb" / "data" / "path")  # fmt: skip
    ev = keelrl.evaluate(result.run_dir, tmp_path / "ev")
    assert ev.metrics["problems"] == EVAL and json.loads((tmp_path / "ev" / "eval.json").read_text())["model"] == str(result.run_dir / "final")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "keelrl", "eval", str(result.run_dir / "final"), "--task", "dataset", "--problems", str(EVAL), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["metrics"]["accuracy"]["value"] == ev.metrics["accuracy"]
