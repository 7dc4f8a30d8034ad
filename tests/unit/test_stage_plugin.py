"""A stage is a plugin: a step, an eval and optional hooks (keelrl.stages.base.Stage), registered by name in
`STAGES`. Adding one touches only its own module plus one registry call: here a toy stage, defined in this test
module, runs through the one training loop (`keelrl.loop.trainer.train`) on the smoke config's tiny model, and
its step and its eval metric reach metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keelrl.config import ConfigError, load_config
from keelrl.loop.trainer import train
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.stages import STAGES, Stage, check_stage, get_stage
from keelrl.step.update import end_of_step

counted: list[int] = []


def count_step(run: Run, state: TrainState) -> dict[str, float]:
    """The toy step: no sampling, no update; it counts, then the step ends as every step does."""
    counted.append(state.step)
    metrics = end_of_step(run, state)  # the schedule and the policy version advance, the sampler is synced
    state.step += 1
    return {"toy/count": float(len(counted)), **metrics}


def count_eval(run: Run, state: TrainState) -> dict[str, float]:
    return {"eval/toy_steps": float(state.step)}


TOY = Stage(name="toy", step=count_step, eval=count_eval)


def test_a_toy_stage_runs_through_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STAGES, "toy", TOY)  # the one registry call
    counted.clear()
    cfg = load_config(
        "configs/smoke.toml",
        [
            'train.stage="toy"',
            "train.steps=3",
            "eval.every_steps=1",
            "eval.at_start=false",
            "train.threads=1",
        ],
    )
    summary = train(cfg, tmp_path / "run")
    assert counted == [0, 1, 2] and summary["state"] == "finished" and summary["stage"] == "toy"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["toy/count"] for r in records] == [1.0, 2.0, 3.0]
    assert [r["eval/toy_steps"] for r in records] == [1.0, 2.0, 3.0]
    assert summary["final_eval"]["toy_steps"] == 3.0


def test_an_unknown_stage_names_the_registered_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"train.stage = 'nope' is not a stage; the stages are rl, rm, selfplay, sft"
    ):
        check_stage(load_config("configs/smoke.toml", ['train.stage="nope"']))
    assert get_stage("rl").head == "lm" and get_stage("rm").head == "reward"
