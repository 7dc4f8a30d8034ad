"""The RL math: pure functions on tensors, each returning values (and metrics) with no I/O.

`get_objective(name)`: the policy-gradient term registered as `name` (objectives.py). It is imported on
first use, so `keelrl.algo.config` (pydantic only) stays importable without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keelrl.algo.objectives import Objective


def get_objective(name: str) -> Objective:
    """The policy-gradient term registered as `name` (`algo.objective`; ValueError lists the known ones)."""
    from keelrl.algo.objectives import get_objective as lookup

    return lookup(name)
