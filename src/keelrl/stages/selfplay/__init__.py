"""Self-play (`train.stage = "selfplay"`, issue 29): the policy proposes its own training problems and solves
them (`step.py`). Proposals are checked by the task's rules (`countdown.py`), kept deduplicated with their
difficulty records in a buffer that is the run's problem source (`buffer.py`, `source.py`), and a new one is
paid by its learnability (`keelrl.algo.selfplay`)."""
