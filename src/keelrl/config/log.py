"""`[log]`: the console, the rollouts kept, and the experiment trackers (TensorBoard, W&B, MLflow:
monitor/trackers.py). Pydantic only: `keelrl.config` mounts it without importing any tracker."""

from __future__ import annotations

from pydantic import Field

from keelrl.config.base import Section


class LogConfig(Section):
    console_every: int = Field(1, ge=1, description="Print a console line every this many steps.")
    progress: bool = Field(True, description="Show a progress bar on a terminal.")
    tensorboard: bool = Field(
        True, description="Write TensorBoard event files under RUN/tb when tensorboard is installed."
    )
    wandb: bool = Field(
        False, description="Log to Weights & Biases (pip install wandb; `wandb login` first)."
    )
    wandb_project: str = Field("keelrl", description="W&B project name.")
    wandb_entity: str = Field(
        "", description="W&B entity (team or user) owning the project; empty: your default."
    )
    wandb_name: str = Field("", description="W&B run name; empty: the run directory's name.")
    wandb_group: str = Field(
        "", description="W&B group to show runs together (e.g. the seeds of one setting)."
    )
    wandb_tags: list[str] = Field(default_factory=list, description="W&B tags of the run.")
    wandb_id: str = Field(
        "", description="W&B run id to log into, resuming its curves; empty: RUN/wandb_id's, else a new one."
    )
    mlflow: bool = Field(
        False, description="Log metrics, and the config as parameters, to MLflow (pip install mlflow)."
    )
    mlflow_tracking_uri: str = Field(
        "",
        description="MLflow tracking server or store (http://HOST:5000, sqlite:///mlflow.db); empty: "
        "MLflow's default (MLFLOW_TRACKING_URI).",
    )
    mlflow_experiment: str = Field("keelrl", description="MLflow experiment (created when missing).")
    mlflow_run_name: str = Field("", description="MLflow run name; empty: the run directory's name.")
    rollouts_per_step: int = Field(8, ge=0, description="Rollouts per step written to rollouts.jsonl.gz.")
