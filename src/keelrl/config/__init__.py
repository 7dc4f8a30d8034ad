"""A run's configuration: pydantic sections (their base, and the field that mounts one in another: base.py;
sections.py, and one module per section that has its own home here: data.py, ladder.py, log.py, lora.py, reward.py,
selfplay.py, vllm.py), the whole `Config` with its checks across sections (root.py), TOML loading, `--set` overrides
and error messages (load.py), and the checks of what a run names outside its config (checks.py). The sections of
the folders below config (`[algo]`, `[guards]`, `[sandbox]`) live beside their code; config mounts them."""

from keelrl.config.data import DataConfig
from keelrl.config.ladder import LadderConfig
from keelrl.config.load import ConfigError
from keelrl.config.log import LogConfig
from keelrl.config.lora import LoraConfig
from keelrl.config.reward import RewardConfig
from keelrl.config.root import Config, config_from_dict, config_to_dict, load_config
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
    TinyModelConfig,
    TrainConfig,
)
from keelrl.config.selfplay import SelfPlayConfig
from keelrl.config.vllm import VLLMConfig

__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "CurriculumConfig",
    "DataConfig",
    "DistributedConfig",
    "EpisodeConfig",
    "EvalConfig",
    "FaultsConfig",
    "LadderConfig",
    "LogConfig",
    "LoraConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "SelfPlayConfig",
    "SupervisorConfig",
    "TaskConfig",
    "TinyModelConfig",
    "TrainConfig",
    "VLLMConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
]
