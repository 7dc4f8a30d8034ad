"""Self-play (issue 29, in progress): the policy proposes its own problems and solves them. Built so far: the
proposal checks for Countdown (`countdown.py`), the problem buffer with deduplication and difficulty records
(`buffer.py`) and the proposer's learnability reward (`keelrl.algo.selfplay`). Not built yet: the
propose-then-solve step in the trainer, its guards and the demonstration; nothing calls this package yet."""
