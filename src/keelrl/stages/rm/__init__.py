"""Reward models: fitted to preference pairs by `keelrl rm train` (`train.stage = "rm"`, the same loop as RL and
SFT with another step) and scoring RL's completions with `reward.model` (learned.py)."""
