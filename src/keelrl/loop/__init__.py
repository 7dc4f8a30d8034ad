"""The training loop: setup (a config -> `Run` and `TrainState`, resumed), the loop itself (loop/trainer.py, one screen) and recovery (guards' actions, rollbacks, saves, the final export)."""
