"""The whole run config: `Config`, which mounts every section, the checks across sections it runs on
validation (batch arithmetic and other stage-specific checks are the stage's: keelrl.stages), and loading
(`load_config`). A config that cannot be run (unknown key, wrong type, value out of range, settings that do not
fit together) raises `ConfigError` before any work starts, naming the field and what is allowed
(`keelrl.config.load`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from pydantic import model_validator

from keelrl.algo.config import AlgoConfig
from keelrl.config.base import Section, section
from keelrl.config.data import DataConfig
from keelrl.config.ladder import LadderConfig
from keelrl.config.load import apply_overrides, parse_override, read_toml, validate
from keelrl.config.log import LogConfig
from keelrl.config.reward import RewardConfig
from keelrl.config.sections import (
    CheckpointConfig,
    CurriculumConfig,
    DistributedConfig,
    EpisodeConfig,
    EvalConfig,
    FaultsConfig,
    ModelConfig,
    RolloutConfig,
    SupervisorConfig,
    TaskConfig,
    TrainConfig,
)
from keelrl.config.selfplay import SelfPlayConfig
from keelrl.config.vllm import VLLMConfig
from keelrl.guards.rules import GuardsConfig
from keelrl.sandbox.config import SandboxConfig


class Config(Section):
    model: ModelConfig = section(ModelConfig, "The policy and tokenizer.")
    task: TaskConfig = section(TaskConfig, "What is trained on and how it is scored.")
    sandbox: SandboxConfig = section(SandboxConfig, "Where model-written commands and code run.")
    rollout: RolloutConfig = section(RolloutConfig, "Sampling.")
    episode: EpisodeConfig = section(
        EpisodeConfig, "Budgets of multi-turn episodes (environments); rollout.max_new_tokens caps each turn."
    )
    vllm: VLLMConfig = section(VLLMConfig, "The vLLM engine (rollout.engine = 'vllm').")
    algo: AlgoConfig = section(AlgoConfig, "RL algorithm settings.")
    reward: RewardConfig = section(RewardConfig, "A learned reward model scoring RL's completions.")
    data: DataConfig = section(
        DataConfig, "What SFT (examples) and reward-model training (preference pairs) train on."
    )
    train: TrainConfig = section(TrainConfig, "Loop settings.")
    eval: EvalConfig = section(EvalConfig, "Held-out evaluation during training.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "Checkpointing.")
    log: LogConfig = section(LogConfig, "Logging.")
    supervisor: SupervisorConfig = section(SupervisorConfig, "Crash and hang recovery.")
    faults: FaultsConfig = section(FaultsConfig, "Fault injection for recovery drills (off by default).")
    guards: GuardsConfig = section(
        GuardsConfig, "Per-step guards and divergence rules, and the actions taken on them."
    )
    curriculum: CurriculumConfig = section(
        CurriculumConfig, "Problem order, adaptive curriculum, dynamic sampling."
    )
    distributed: DistributedConfig = section(
        DistributedConfig, "Several processes (torchrun) and remote scoring (Ray)."
    )
    selfplay: SelfPlayConfig = section(
        SelfPlayConfig, "Self-play (train.stage = 'selfplay'): proposals and their buffer."
    )
    ladder: LadderConfig = section(
        LadderConfig,
        "Scaling ladders (`keelrl ladder`): a grid of short runs, fitted and extrapolated; training ignores it.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        check_engine(self)
        check_off_policy(self)
        if self.task.name == "dataset":  # its reward functions import now, not in the worker
            from keelrl.tasks.dataset import check_params

            check_params(self.task.params)
        check_packages(self)
        return self

    @property
    def prompts_per_step(self) -> int:
        return self.rollout.batch_size // self.rollout.group_size


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    return validate(Config, data, source)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a TOML file (or start from defaults when path is None), apply `--set` overrides, validate."""
    data = read_toml(Path(path)) if path is not None else {}
    source = str(Path(path)) if path is not None else "defaults"
    renamed = [value for key, value in map(parse_override, overrides or []) if key == ["task", "name"]]
    task = data.get("task", {})
    if renamed and renamed[-1] != task.get("name"):  # the file's task.params are for the file's task
        task.pop("params", None)
    data = apply_overrides(data, overrides or [])
    return config_from_dict(data, source + (" with --set overrides" if overrides else ""))


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def check_packages(cfg: Config) -> None:
    """Raise ValueError naming the setting and the `pip install` that fixes it when `cfg` needs an optional
    package that is not installed (checked on load: a run never starts only to crash on an import)."""
    c = cfg
    ray_pool = "scorer" if c.distributed.scorer == "ray" else "sampler"
    needs = {  # import name -> (the setting that needs it, needed?, keelrl's extra that installs it)
        "wandb": ("log.wandb = true", c.log.wandb, "wandb"),
        "mlflow": ("log.mlflow = true", c.log.mlflow, "mlflow"),
        "vllm": ("rollout.engine = 'vllm'", c.rollout.engine == "vllm", "vllm"),
        "peft": (f"model.lora.rank = {c.model.lora.rank}", c.model.lora.rank > 0, "peft"),
        "ray": (f"distributed.{ray_pool} = 'ray'", "ray" in (c.distributed.scorer, c.distributed.sampler), "ray"),
        "gguf": (f"model.path = {c.model.path!r}", c.model.path.endswith(".gguf") or c.model.path == "smollm2", "gguf"),
        "reasoning_gym": (f"task.name = {c.task.name!r}", c.task.name.startswith("reasoning_gym:"), "envs"),
    }  # fmt: skip
    for module, (setting, needed, extra) in needs.items():
        if needed and importlib.util.find_spec(module) is None:
            raise ValueError(
                f"{setting} needs the {module} package, which is not installed here: {pip_install(extra, module)} "
                f"(or pip install 'keelrl[{extra}]'), or change {setting.split(' = ')[0]}"
            )


def pip_install(extra: str, fallback: str) -> str:
    """The `pip install` of keelrl's `extra` (its packages and versions as pyproject.toml lists them)."""
    reqs: list[str] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        reqs = importlib.metadata.requires("keelrl") or []
    wanted = [r.split(";")[0].strip() for r in reqs if r.endswith(f'extra == "{extra}"')]
    return "pip install " + " ".join(f"'{r}'" for r in wanted or [fallback])


def check_engine(cfg: Config) -> None:
    """Raise ValueError when `cfg` (a Config) asks the vLLM engine for something it does not do."""
    r, v = cfg.rollout, cfg.vllm
    if r.engine != "vllm":
        return
    if r.top_p < 1.0 or r.top_k > 0:
        raise ValueError(
            f"rollout.engine = 'vllm' with rollout.top_p = {r.top_p}, top_k = {r.top_k}: vLLM's log-probs are then "
            "renormalised over the kept tokens, while the trainer uses the whole tempered distribution, so the PPO "
            "ratio would be biased. Use top_p = 1.0 and top_k = 0 with the vLLM engine."
        )
    if v.dtype != "float32" and cfg.algo.old_logprobs == "sampler":
        raise ValueError(
            f"vllm.dtype = '{v.dtype}' with algo.old_logprobs = 'sampler': a {v.dtype} engine's log-probs differ from "
            "the trainer's by ~0.03 nats per token, too much for the PPO ratio's denominator. Set "
            "algo.old_logprobs = 'recompute' (or vllm.dtype = 'float32')."
        )


def check_off_policy(cfg: Config) -> None:
    """Raise ValueError when asynchronous sampling (`rollout.max_staleness`) or an off-policy correction is asked
    for where it cannot work."""
    r, a = cfg.rollout, cfg.algo
    if r.max_staleness == 0:
        if "correction" in a.model_fields_set and a.correction != "off" and a.old_logprobs == "sampler":
            raise ValueError(
                f"algo.correction = '{a.correction}' has nothing to correct: with algo.old_logprobs = 'sampler' and "
                "rollout.max_staleness = 0 the sampler's log-probs are the proximal policy's (rho = 1). Set "
                "algo.old_logprobs = 'recompute' to correct for a sampler whose numerics differ."
            )
        return
    k = r.max_staleness
    if cfg.curriculum.dynamic_sampling:
        raise ValueError(
            f"rollout.max_staleness = {k} with curriculum.dynamic_sampling: refills are sampled during the step, by "
            "the current policy, so the batch would mix versions. Turn one of them off."
        )
    if r.engine == "vllm":
        raise ValueError(
            f"rollout.max_staleness = {k} with rollout.engine = 'vllm' is not supported yet: the asynchronous sampler "
            "is a transformers process of its own (or, with distributed.sampler = 'ray', transformers actors). Use "
            "rollout.engine = 'hf'."
        )
