"""The Python API's arguments (src/keelrl/__init__.py): configs given as a TOML path, a dict or a Config with dotted
overrides on top, and keelrl.sft / keelrl.evaluate, plain functions (the packages are stages/sft/ and evals/). Runs through the API:
tests/integration/test_dataset_run.py."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from keelrl import _resolve
from keelrl.config import ConfigError, config_from_dict, load_config


def test_a_path_a_dict_and_a_config_resolve_to_the_same_config() -> None:
    over = {"train.steps": 3, "task.params.test": 0.5}
    from_path, run = _resolve("configs/dataset_tiny.toml", None, over)
    assert run == Path("runs/dataset_tiny") and from_path["train"]["steps"] == 3
    from_dict, run = _resolve(from_path, "here", {})
    assert from_dict == from_path and run == Path("here")
    cfg = load_config("configs/dataset_tiny.toml")
    from_config, run = _resolve(cfg, None, over)
    assert run.parent == Path("runs") and run.name.startswith("dataset-")
    # a Config gives the fields it was given, so a default stays a default (a full dump would not validate: it
    # sets algo.correction, which the config checks refuse without an off-policy sampler)
    assert "correction" not in from_config.get("algo", {})
    assert config_from_dict(from_config) == config_from_dict(from_path)
    assert config_from_dict(from_path).task.params["test"] == 0.5
    with pytest.raises(ConfigError, match=r"overrides\['train.steps.x'\]: 'steps' is a value, not a section"):
        _resolve(from_path, None, {"train.steps.x": 1})


def test_sft_and_evaluate_are_plain_functions() -> None:
    import keelrl.evals.run
    import keelrl.stages.sft.data

    for fn in (keelrl.train, keelrl.sft, keelrl.evaluate):
        assert inspect.isfunction(fn)
        assert list(inspect.signature(fn).parameters) == ["config", "run_dir", "overrides", "reward"]
    assert "Supervised fine-tuning" in (keelrl.sft.__doc__ or "")
