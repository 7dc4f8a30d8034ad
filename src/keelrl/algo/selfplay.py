"""The proposer's reward in self-play (Absolute Zero, Zhao et al. 2025, arXiv 2505.03335, eq. 4): a proposed
problem is worth as much as the solver can still learn from it.

    r_propose = 1 - s   if 0 < s < 1,   else 0

where s is the solver group's solve rate on the problem. A problem every attempt solves (s = 1) teaches
nothing, and neither does one no attempt solves (s = 0); among the rest, the harder the better. Departure
from the paper, stated: Absolute Zero gives malformed proposals a negative format reward (-0.5 or -1);
keelrl pays invalid and duplicate proposals 0 (issue 29), so a proposer is never paid for being refused but
also not pushed away from the format by a penalty larger than any reward.
"""

from __future__ import annotations


def learnability_reward(rate: float) -> float:
    """Absolute Zero's proposer reward for a valid, new problem solved at `rate`.

    Worked numbers: 0 -> 0 (unsolvable by the solver: no signal), 0.25 -> 0.75, 0.5 -> 0.5, 0.875 -> 0.125,
    1 -> 0 (trivial)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"a solve rate lies in [0, 1], got {rate}")
    return 1.0 - rate if 0.0 < rate < 1.0 else 0.0
