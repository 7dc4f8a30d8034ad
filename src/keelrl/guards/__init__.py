"""Guards: divergence rules over a run's metrics, and the actions taken on them (warn / skip / rollback /
stop). The trainer runs them live; `keelrl doctor` replays them over a finished run: the same code.

    base.py      the metric records a rule reads, the Finding it returns, its thresholds' base model
    rules/       RULES (name -> rule) and GuardsConfig ([guards]) in __init__.py; the rules by family,
                 each next to its thresholds
    engine.py    check (live), scan (doctor), Guardian (turns findings into actions, remembers them)
    step.py      check_update: the per-update checks before the optimizer step
"""
