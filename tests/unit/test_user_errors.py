"""Mistakes a user can make end in one paragraph naming the problem, with exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from keelrl.cli.main import main
from keelrl.config import ModelConfig
from keelrl.models.load import ModelLoadError, load_policy
from keelrl.tasks import TaskError, get_task


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def test_malformed_config(tmp_path: Path, capsys) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[rollout]\nbatch_size = 30\ngroup_size = 8\n")
    code, err = _run(["train", str(f), "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2
    assert "rollout.batch_size=30 is not divisible by rollout.group_size=8" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()  # stopped before any work


def test_missing_model_path(tmp_path: Path, capsys) -> None:
    code, err = _run(
        [
            "train",
            "configs/smoke.toml",
            "--set",
            f'model.path="{tmp_path}/nope"',
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert code == 2 and "does not exist" in err and str(tmp_path / "nope") in err
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_policy(ModelConfig(path=str(tmp_path)))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ModelLoadError, match="could not read the GGUF file"):
        load_policy(ModelConfig(path=str(bad)))


def test_unknown_attention_kernel(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    code, err = _run(
        [
            "train",
            "configs/smoke.toml",
            "--set",
            'model.attn_implementation="flash"',
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert code == 2 and "could not build the tiny model" in err and '"flash"' in err and "sdpa" in err
    assert "Traceback" not in err
    with pytest.raises(ModelLoadError, match=r"could not load the model in .*\"flash\""):
        load_policy(ModelConfig(path=str(tiny_model_dir), attn_implementation="flash"))


def test_unknown_task(tmp_path: Path, capsys) -> None:
    code, err = _run(
        ["train", "configs/smoke.toml", "--set", 'task.name="countdwn"', "--run-dir", str(tmp_path / "r")],
        capsys,
    )
    assert code == 2 and "unknown task 'countdwn' (did you mean 'countdown'?)" in err
    with pytest.raises(TaskError, match=r"`max_numbr`.*unknown parameter"):
        get_task("countdown", max_numbr=3)
    with pytest.raises(TaskError, match="min_numbers=5 > max_numbers=4"):
        get_task("countdown", min_numbers=5, max_numbers=4)


@pytest.mark.parametrize("setting", ["scorer", "sampler"])
def test_ray_pool_without_ray(setting: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    run = tmp_path / "r"
    argv = ["train", "configs/smoke.toml", "--no-supervisor", "--set", f'distributed.{setting}="ray"']
    code, err = _run([*argv, "--run-dir", str(run)], capsys)
    assert code == 2 and "pip install 'keelrl[ray]'" in err and f"change distributed.{setting}" in err
    assert "Traceback" not in err and not run.exists()  # stopped before any work


def test_a_reward_head_that_cannot_be_made_is_not_called_a_download_failure(
    tiny_model_dir: Path, monkeypatch
) -> None:
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from keelrl.models import load

    # a decoder without a linear `score` head, as a reward model's source: the error says so, from a local
    # directory and from the hub alike, not that the model could not be read or fetched
    monkeypatch.setattr(
        load, "_from_pretrained", lambda *a, **k: LlamaForCausalLM.from_pretrained(tiny_model_dir)
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    monkeypatch.setattr(load, "_hub_offline_reason", lambda name: None)  # as if the hub answered
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    for got in (
        lambda: load.load_local_dir(tiny_model_dir, "float32", False, head="reward"),
        lambda: load.load_hub("org/name", "float32", False, head="reward"),
    ):
        with pytest.raises(ModelLoadError, match=r"^LlamaForCausalLM has no linear `score` head"):
            got()
