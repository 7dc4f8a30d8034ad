"""The experiment trackers a run's metrics also go to, besides metrics.jsonl: TensorBoard (`RUN/tb`, on by
default), Weights & Biases and MLflow (`[log]`: `wandb`, `mlflow`). Each gets every numeric metric of every
step under its keelrl name (docs/metrics.md). A resumed run continues the same curves: TensorBoard purges
the events written after the restored step, W&B and MLflow log into the run whose id the first start stored
in `RUN/wandb_id` / `RUN/mlflow_id` (or `log.wandb_id`). MLflow keeps the steps an interrupted attempt
logged past the checkpoint (it has no purge): the later values of a step are the ones that count.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keelrl.config.load import ConfigError
from keelrl.monitor.sinks import Sink

if TYPE_CHECKING:
    from keelrl.config.log import LogConfig


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's numeric metrics (not `step` and `time`, which every tracker has its own way of keeping)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")
    }


def _stored_id(path: Path, make: Any, given: str = "") -> str:
    """The tracker's run id: `given`, else the one kept in `path`, else `make()`; kept in `path` from now on."""
    run_id = given or (path.read_text().strip() if path.exists() else make())
    path.write_text(run_id)
    return run_id


class TensorBoardSink:
    def __init__(self, log_dir: Path, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events written after the restored step by the interrupted attempt
        self.writer = SummaryWriter(
            log_dir=str(log_dir), purge_step=resume_step + 1 if resume_step > 0 else None
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run in `log.wandb_project` (entity, name, group, tags from `[log]`), resumed by its id."""

    def __init__(self, run_dir: Path, log: LogConfig, config: dict[str, Any]) -> None:
        import wandb

        run_id = _stored_id(run_dir / "wandb_id", wandb.util.generate_id, log.wandb_id)
        self.run = wandb.init(
            project=log.wandb_project, entity=log.wandb_entity or None, name=log.wandb_name or run_dir.name,
            group=log.wandb_group or None, tags=list(log.wandb_tags) or None, id=run_id, resume="allow",
            dir=str(run_dir), config=config,
        )  # fmt: skip

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run in `log.mlflow_experiment` at `log.mlflow_tracking_uri`: the resolved config as its
    parameters (dotted keys, at the first start), every step's metrics, finished when the run ends."""

    def __init__(self, run_dir: Path, log: LogConfig, config: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.metric = Metric
        try:
            self.client = MlflowClient(log.mlflow_tracking_uri or None)
            exp = self.client.get_experiment_by_name(log.mlflow_experiment)
        except MlflowException as err:
            raise ConfigError(
                f"log.mlflow: MLflow cannot open its tracking store ({err}). Set "
                "log.mlflow_tracking_uri to your server (http://HOST:5000), or pip install mlflow for its local store"
            ) from None
        exp_id = exp.experiment_id if exp else self.client.create_experiment(log.mlflow_experiment)
        fresh = not (run_dir / "mlflow_id").exists()

        def create() -> str:
            return self.client.create_run(
                exp_id, run_name=log.mlflow_run_name or run_dir.name, tags={"keelrl.run_dir": str(run_dir)}
            ).info.run_id

        self.run_id = _stored_id(run_dir / "mlflow_id", create)
        if fresh:
            params = [Param(k, v[:500]) for k, v in flatten(config)]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
                self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        now = int(time.time() * 1000)
        # MLflow keys hold letters, digits and _ - . space : / only
        batch = [
            self.metric(re.sub(r"[^\w\-. :/]", "_", k), v, now, step) for k, v in scalars(metrics).items()
        ]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A nested config as (dotted key, JSON value) pairs: `algo.lr`, `0.001`."""
    return [
        kv
        for k, v in d.items()
        for kv in (
            flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", json.dumps(v))]
        )
    ]


def open_trackers(run_dir: Path, log: LogConfig, step: int, config: dict[str, Any]) -> list[Sink]:
    """The trackers `[log]` asks for (TensorBoard only when installed), resuming at `step`."""
    out: list[Sink] = []
    if log.tensorboard and tensorboard_available():
        out.append(TensorBoardSink(run_dir / "tb", step))
    if log.wandb:
        out.append(WandbSink(run_dir, log, config))
    if log.mlflow:
        out.append(MlflowSink(run_dir, log, config))
    return out


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
