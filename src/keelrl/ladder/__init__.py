"""Scaling ladders (`keelrl ladder`): a grid of short runs of one config (model sizes, recipe variants, seeds),
ScaleRL's sigmoid per point (scaling.py) or Chinchilla's law for pretraining (chinchilla.py), size laws, and a
held-out target predicted with an interval, then run and compared (analysis.py, runner.py, page.py)."""
