"""Guards: divergence rules over a run's metrics, and the actions taken on them (warn / skip / rollback /
stop). The trainer runs them live; `keelrl doctor` replays them over a finished run: the same code.
base.py: what a rule reads and returns; rules/: the rules and their [guards] config; engine.py: running
them and acting on findings; step.py: the per-update checks before the optimizer step.
"""
