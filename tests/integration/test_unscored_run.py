"""Episodes without a reward (status not "ok": a checker that raises, a verifier that cannot run) on tiny real
runs: left out of the update, counted in metrics, and a step where most have none is not trained on and stops
the run with the guard's sentence."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import load_file

from keelrl.config import load_config
from keelrl.loop.trainer import GuardStop, train

TASKS = '''
import zlib
from keelrl.tasks.multiply import Multiply

class Broken(Multiply):
    """Multiplication whose checker raises on every completion (always) or on about half of them (sometimes)."""

    def __init__(self, seed=0, always=True, **params):
        super().__init__(seed=seed, **params)
        self.always = always

    def score(self, problem, completion):
        if self.always or zlib.crc32(completion.encode()) % 2:
            raise RuntimeError("the checker cannot run")
        return super().score(problem, completion)


class Wordy(Multiply):
    """Multiplication whose prompt is 5,000 characters longer when a is odd (a data set's oversized row)."""

    def prompt(self, problem, template):
        p = super().prompt(problem, template)
        return p if problem["a"] % 2 == 0 else type(p)(p.system, p.user + " " * 5000, p.assistant_prefix)
'''


@pytest.fixture
def broken_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "broken_tasks.py").write_text(textwrap.dedent(TASKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "broken_tasks:Broken"


def _cfg(format_run: list[str], task: str, always: bool, *extra: str):
    params = f"task.params={{digits_a = 1, digits_b = 1, always = {str(always).lower()}}}"
    return load_config(
        "configs/smoke.toml",
        [*format_run, f'task.name="{task}"', params, "eval.problems=8", "eval.every_steps=0", *extra],
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_checker_that_always_raises_stops_the_run_before_any_update(
    format_run, broken_task, tmp_path
) -> None:
    run = tmp_path / "run"
    with pytest.raises(GuardStop):
        train(_cfg(format_run, broken_task, True, "train.steps=4"), run)
    stop = [e for e in _lines(run / "events.jsonl") if e["kind"] == "guard_stop"]
    assert len(stop) == 1 and stop[0]["rule"] == "unscored_episodes" and stop[0]["step"] == 1
    assert "100% of step 1's episodes ended without a reward (16 verifier errors)" in stop[0]["message"]
    step1 = next(m for m in _lines(run / "metrics.jsonl") if m["step"] == 1)
    assert step1["episode/verifier_errors"] == 16 and step1["episode/error_frac"] == 1.0
    assert step1["guard/skipped_updates"] == 1.0 and "loss/total" not in step1  # no update was computed
    # the weights the run stopped with are the ones it started from
    saved = sorted((run / "checkpoints").glob("step_*"))
    first, last = (load_file(str(p / "model.safetensors")) for p in (saved[0], saved[-1]))
    assert all(first[k].equal(last[k]) for k in first)


def test_rollouts_without_a_reward_are_left_out_of_the_update(format_run, broken_task, tmp_path) -> None:
    run = tmp_path / "run"
    train(_cfg(format_run, broken_task, False, "train.steps=2", "guards.unscored_episodes.max_frac=0.9"), run)
    metrics = [m for m in _lines(run / "metrics.jsonl") if "loss/total" in m]
    assert len(metrics) == 2 and all(0 < m["episode/verifier_errors"] < 16 for m in metrics)
    import gzip

    rollouts = [json.loads(x) for x in gzip.open(run / "rollouts.jsonl.gz", "rt")]
    unscored = [r for r in rollouts if r["status"] != "ok"]
    assert unscored and all(r["status"] == "verifier_error" and r["advantage"] == 0.0 for r in unscored)
    assert all("the checker cannot run" in r["info"]["error"] for r in unscored)


def test_a_prompt_over_max_prompt_tokens_is_not_sampled_and_not_trained_on(format_run, broken_task, tmp_path):
    """A data set's oversized row must not reach the sampler (a 1.5 MB row once asked for a terabyte): its
    rollout ends as agent_error, keeps only the first max_prompt_tokens tokens, and the run trains on the rest."""
    run = tmp_path / "run"
    cfg = load_config(
        "configs/smoke.toml",
        [*format_run, 'task.name="broken_tasks:Wordy"', "task.params={digits_a = 1, digits_b = 1}",
         "eval.problems=8", "eval.every_steps=0", "train.steps=2", "episode.max_prompt_tokens=64",
         "guards.unscored_episodes.max_frac=0.95"],
    )  # fmt: skip
    train(cfg, run)
    metrics = [m for m in _lines(run / "metrics.jsonl") if "loss/total" in m]
    assert len(metrics) == 2 and all(0 < m["episode/agent_errors"] < 16 for m in metrics)
    import gzip

    rollouts = [json.loads(x) for x in gzip.open(run / "rollouts.jsonl.gz", "rt")]
    long = [r for r in rollouts if r["problem"]["a"] % 2]
    assert long and all(r["status"] == "agent_error" and r["advantage"] == 0.0 for r in long)
    assert all(r["info"]["reason"] == "prompt_too_long" and r["info"]["prompt_tokens"] > 5000 for r in long)
    assert all("more than episode.max_prompt_tokens = 64" in r["info"]["error"] for r in long)
    assert all(r["status"] == "ok" for r in rollouts if r["problem"]["a"] % 2 == 0)
