"""RL: sample, score, update (the default stage): the step (step.py), its checks (checks.py), the held-out
task eval every stage that samples shares (step.py: `task_eval`)."""
