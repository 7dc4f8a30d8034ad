"""The RL math: pure functions on tensors, each returning values (and metrics) with no I/O."""
