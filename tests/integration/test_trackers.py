"""The experiment trackers (monitor/trackers.py) on real tiny runs: TensorBoard event files in RUN/tb and an
MLflow file store hold every value metrics.jsonl holds, at its step, and a resumed run continues the same
MLflow run; W&B gets entity, name, tags, group and the resume id as `[log]` says (a stand-in `wandb` module
records what keelrl passes: the real one needs an account)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from keelrl.config import ConfigError, LogConfig, load_config
from keelrl.loop.trainer import train
from keelrl.monitor.run_dir import read_jsonl
from keelrl.monitor.trackers import WandbSink, open_trackers

ROOT = Path(__file__).resolve().parents[2]
FAST = ["train.threads=1", "log.progress=false", "supervisor.enabled=false", "eval.every_steps=2"]


def logged(run: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as {key: {step: value}} (numeric values; eval and train records of a step together)."""
    out: dict[str, dict[int, float]] = {}
    for rec in read_jsonl(run / "metrics.jsonl"):
        for k, v in rec.items():
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(k, {})[rec["step"]] = float(v)
    return out


def test_tensorboard_and_mlflow_hold_every_metric_and_a_resume_continues_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the client-only package's local store
    uri = (tmp_path / "mlruns").as_uri()
    sets = [*FAST, "log.mlflow=true", f'log.mlflow_tracking_uri="{uri}"', 'log.mlflow_run_name="smoke-a"']
    run = tmp_path / "run"
    train(load_config(ROOT / "configs" / "smoke.toml", [*sets, "train.steps=2"]), run)
    run_id = (run / "mlflow_id").read_text()
    train(load_config(ROOT / "configs" / "smoke.toml", [*sets, "train.steps=3"]), run)  # resumes at step 2
    assert (run / "mlflow_id").read_text() == run_id

    client = MlflowClient(uri)
    info = client.get_run(run_id)
    assert info.info.run_name == "smoke-a" and info.info.status == "FINISHED"
    assert client.get_experiment(info.info.experiment_id).name == "keelrl"
    assert info.data.params["algo.lr"] == "0.001" and info.data.params["task.name"] == '"countdown"'
    assert info.data.tags["keelrl.run_dir"] == str(run)
    want = logged(run)
    assert {"reward/mean", "grad_norm", "eval/accuracy", "episode/error_frac"} <= set(want)
    assert set(info.data.metrics) == set(want)
    for key, by_step in want.items():
        got = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        assert got == pytest.approx(by_step, nan_ok=True), key
    assert max(want["reward/mean"]) == 3

    tb = EventAccumulator(str(run / "tb"))
    tb.Reload()
    assert set(tb.Tags()["scalars"]) == set(want)
    for key in ("reward/mean", "grad_norm", "eval/accuracy"):
        got = {e.step: e.value for e in tb.Scalars(key)}
        assert got == pytest.approx(want[key], rel=1e-6), key  # TensorBoard keeps float32


def test_mlflow_without_a_usable_store_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    log = LogConfig(mlflow=True, mlflow_tracking_uri=(tmp_path / "mlruns").as_uri())
    with pytest.raises(ConfigError, match=r"log\.mlflow_tracking_uri"):
        open_trackers(tmp_path, log, 0, {})


class FakeWandb(types.ModuleType):
    """Records `wandb.init`'s arguments and every `run.log`."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        self.inits: list[dict[str, Any]] = []
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.util = types.SimpleNamespace(generate_id=lambda: f"gen{len(self.inits)}")

    def init(self, **kwargs: Any) -> Any:
        self.inits.append(kwargs)
        log = lambda data, step: self.logged.append((step, data))  # noqa: E731
        return types.SimpleNamespace(log=log, finish=lambda: None)


def test_wandb_gets_entity_name_tags_group_and_resumes_by_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sets = [
        "log.wandb=true",
        'log.wandb_entity="lab"',
        'log.wandb_name="lr-3e-4"',
        'log.wandb_group="sweep1"',
    ]
    cfg = load_config(ROOT / "configs" / "smoke.toml", [*sets, 'log.wandb_tags=["grpo", "tiny"]'])
    sink = WandbSink(tmp_path, cfg.log, {"algo": {"lr": 1e-3}})
    first = fake.inits[0]
    assert {k: first[k] for k in ("project", "entity", "name", "group", "tags", "id", "resume")} == {
        "project": "keelrl", "entity": "lab", "name": "lr-3e-4", "group": "sweep1", "tags": ["grpo", "tiny"],
        "id": "gen0", "resume": "allow",
    }  # fmt: skip
    assert first["config"] == {"algo": {"lr": 1e-3}} and (tmp_path / "wandb_id").read_text() == "gen0"
    sink.log(4, {"step": 4, "time": 1.0, "reward/mean": 0.5, "ok": True, "note": "x"})
    assert fake.logged == [(4, {"reward/mean": 0.5})]
    # a restart resumes the stored id; unset fields are W&B's defaults, the name the run directory's
    WandbSink(tmp_path, LogConfig(wandb=True), {})
    assert fake.inits[1]["id"] == "gen0" and fake.inits[1]["entity"] is None
    assert fake.inits[1]["name"] == tmp_path.name and fake.inits[1]["tags"] is None
    # log.wandb_id logs into that run (e.g. one begun on another machine), and is kept for later restarts
    WandbSink(tmp_path, LogConfig(wandb=True, wandb_id="abc123"), {})
    assert fake.inits[2]["id"] == "abc123" and (tmp_path / "wandb_id").read_text() == "abc123"
