"""The shipped configs load, and configs/countdown_tiny.toml is exactly the demo's RL stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelrl.config import config_from_dict, load_config
from keelrl.recipes.demo import DEMO_TASK_PARAMS, DemoPlan, demo_rl_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.train.steps > 0


def test_countdown_tiny_is_the_demo_rl_stage() -> None:
    shipped = load_config(Path(__file__).parents[2] / "configs" / "countdown_tiny.toml").model_dump()
    plan = DemoPlan.for_minutes(12.0)
    demo = demo_rl_config("runs/demo/base", DEMO_TASK_PARAMS, plan.rl_steps, plan.eval_every, seed=0)
    demo["train"]["threads"] = 1  # the demo runs with one thread by default
    expected = config_from_dict(demo).model_dump()
    # The demo runs in-process; a `keelrl train` of the same config is supervised. Nothing else differs.
    shipped.pop("supervisor"), expected.pop("supervisor")
    assert shipped == expected


def test_selfplay_countdown_is_the_demo_rl_stage_with_self_play() -> None:
    configs = Path(__file__).parents[2] / "configs"
    selfplay = load_config(configs / "selfplay_countdown.toml").model_dump()
    rl = load_config(configs / "countdown_tiny.toml").model_dump()
    assert (selfplay["train"].pop("stage"), rl["train"].pop("stage")) == ("selfplay", "rl")
    assert (selfplay["algo"].pop("lr"), rl["algo"].pop("lr")) == (1.5e-4, 3e-4)
    shipped = selfplay.pop("selfplay")
    # the recipe measured best in docs/RESULTS.md ("Self-play: one policy or two"): benchmarks/objectives_learning.py's
    # selfplay_worked_two variant
    assert {
        k: shipped[k] for k in ("proposer_prompts", "proposal", "proposer_max_new_tokens", "policies")
    } == {
        "proposer_prompts": 2,
        "proposal": "worked",
        "proposer_max_new_tokens": 40,
        "policies": "two",
    }
    rl.pop("selfplay")
    assert selfplay == rl


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_smollm2_presets_are_the_recipes_stages(stage: str) -> None:
    from keelrl.recipes.smollm2 import Plan, rl_config, sft_config

    runs = Path("runs/smollm2")
    recipe = {
        "sft": sft_config(runs / "sft_data.jsonl", Plan(), seed=0, threads=1),
        "grpo": rl_config(runs / "sft" / "final", Plan(), seed=0, threads=1),
    }[stage]
    shipped = load_config(Path(__file__).parents[2] / "configs" / f"smollm2_{stage}.toml").model_dump()
    expected = config_from_dict(recipe).model_dump()
    # the recipe runs its stages in-process; a `keelrl train` of the same config is supervised
    shipped.pop("supervisor"), expected.pop("supervisor")
    assert shipped == expected
