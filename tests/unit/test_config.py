"""Config loading: overrides, and errors that name the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelrl.config import ConfigError, load_config
from keelrl.config.load import parse_override
from keelrl.stages import check_stage


def test_shipped_presets_load() -> None:
    for path in sorted(Path("configs").glob("*.toml")):
        cfg = load_config(path)
        assert cfg.rollout.batch_size % cfg.rollout.group_size == 0, path


def test_overrides_are_typed() -> None:
    cfg = load_config(
        "configs/smoke.toml",
        ["algo.lr=3e-4", "log.tensorboard=false", "model.path=some/dir", "task.params.max_number=9"],
    )
    assert cfg.algo.lr == 3e-4 and cfg.log.tensorboard is False and cfg.model.path == "some/dir"
    assert cfg.task.params["max_number"] == 9
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("algo.lr")


def test_unknown_key_names_the_field_and_suggests(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[algo]\nlrr = 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "unknown key `algo.lrr`" in msg and "did you mean `algo.lr`" in msg and "advantage" in msg


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key `trian`.*did you mean `train`"):
        load_config(None, ["trian.steps=3"])


def test_wrong_type_and_out_of_range() -> None:
    with pytest.raises(ConfigError, match=r"`train.steps`.*integer"):
        load_config("configs/smoke.toml", ['train.steps="many"'])
    with pytest.raises(ConfigError, match=r"`algo.lr`: Input should be greater than 0 \(got -1\)"):
        load_config("configs/smoke.toml", ["algo.lr=-1"])
    with pytest.raises(
        ConfigError, match=r"`algo.advantage`.*'grpo', 'dr_grpo', 'rloo', 'reinforce_pp' or 'gae'"
    ):
        load_config("configs/smoke.toml", ['algo.advantage="ppo"'])


def test_batch_arithmetic_is_spelled_out() -> None:
    """RL's batch arithmetic is the rl stage's check (`keelrl train` runs it before anything starts)."""
    with pytest.raises(
        ConfigError,
        match=r"rollout.batch_size=250 is not divisible by rollout.group_size=8 \(250 / 8 = 31.25\)",
    ):
        check_stage(load_config(None, ["rollout.batch_size=250", "rollout.group_size=8"]))
    with pytest.raises(
        ConfigError, match=r"64 sequences is not divisible by train.micro_batch_size=10 \(64 / 10 = 6.4\)"
    ):
        check_stage(load_config(None, ["rollout.batch_size=64", "train.micro_batch_size=10"]))
    with pytest.raises(ConfigError, match=r"algo.minibatches=3"):
        check_stage(load_config(None, ["rollout.batch_size=64", "algo.minibatches=3"]))


def test_malformed_toml_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[algo\nlr = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_dual_clip_must_be_off_or_above_one() -> None:
    for bad in ("0.5", "1.0"):
        with pytest.raises(
            ConfigError, match=r"`algo.dual_clip`: must be 0 \(off\) or greater than 1.*\(got "
        ):
            load_config(None, [f"algo.dual_clip={bad}"])
    assert load_config(None, ["algo.dual_clip=3.0"]).algo.dual_clip == 3.0
    assert load_config(None, ["algo.dual_clip=0"]).algo.dual_clip == 0.0
