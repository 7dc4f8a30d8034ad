"""Where keelrl's randomness comes from: `stable_hash(purpose, ...)`.

Every seed a run draws (a sampled row, an eval sample, a mini-batch permutation, a generated problem, a
train/test split) is a hash of what it is for and where it is, never a draw from a global generator. So a
completion does not depend on batch size, rank or how a restart split the work, and resume equals no-resume.
"""

from __future__ import annotations

import hashlib
from typing import Any


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash that is the same in every process and Python version (unlike hash())."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")
