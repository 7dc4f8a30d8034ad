"""keelrl: RL post-training for language models on tasks whose answers can be checked."""

__version__ = "0.1.0"
