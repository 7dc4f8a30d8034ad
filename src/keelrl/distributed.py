"""The world a run sees, and the few collectives the loop needs. At world size 1 every helper is a no-op,
so the single-process run is the same program as a multi-process one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_writer(self) -> bool:
        """Only rank 0 writes the run directory's shared files."""
        return self.rank == 0

    def describe(self) -> str:
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
        return (
            f"world: {self.world_size} process(es), rank {self.rank}, device {self.device}, backend {backend}"
        )


def init_world(device_pref: str = "auto") -> World:
    """Read torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK); single process when absent."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if device_pref == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device='cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return World(rank, world_size, local_rank, device)


def all_reduce_sum(value: float, world: World) -> float:
    """Sum of `value` over ranks (identity at world size 1)."""
    if world.world_size == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def all_gather_list(values: list[Any], world: World) -> list[Any]:
    """Concatenate each rank's list in rank order (identity at world size 1)."""
    if world.world_size == 1:
        return list(values)
    gathered: list[list[Any] | None] = [None] * world.world_size
    dist.all_gather_object(gathered, values)
    return [v for part in gathered for v in (part or [])]
