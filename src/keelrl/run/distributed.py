"""The world a run sees, how the policy is trained across processes, and the few collectives the loop needs.
At world size 1 every helper is a no-op, so the single-process run is the same program.

Under torchrun `init_world` joins the process group (gloo on CPU, NCCL on CUDA) with `distributed.timeout_s`
on every collective, so a dead or hung rank makes the others fail instead of waiting forever.
`wrap_for_training` returns the module the update's forward runs through:
- ddp: `DistributedDataParallel` around `LogprobModule(policy)`; each rank keeps the whole model;
- fsdp2: `fully_shard` on every decoder layer and the root; parameters, gradients and optimizer state are
  sharded (DTensors), gathered layer by layer for each forward and backward.
Both average gradients over ranks, but keelrl's loss is normalised by *global* counts (each rank's loss is
its share of the global sum), so it needs the sum: the loss is multiplied by the world size (`loss_scale`),
which cancels the average exactly (a power-of-two world scales without rounding). Gradients are
synchronised once per optimizer step, on the last micro-batch (`grad_sync`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from keelrl.algo.logprobs import LogprobModule

Strategy = Literal["ddp", "fsdp2"]


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # joined a torch.distributed process group (started by torchrun), even of one rank: the NCCL and FSDP2 paths
    # then run as they would on many (one GPU checks them); False: one plain process
    grouped: bool = False

    @property
    def is_writer(self) -> bool:
        """Only rank 0 writes the run directory's shared files."""
        return self.rank == 0

    def describe(self) -> str:
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
        return (
            f"world: {self.world_size} process(es), rank {self.rank}, device {self.device}, backend {backend}"
        )


def under_torchrun() -> bool:
    """True in a process started by torchrun (or another launcher that sets the torch.distributed env)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_world(device_pref: str = "auto", backend: str = "auto", timeout_s: float = 300.0) -> World:
    """Read torchrun's RANK, WORLD_SIZE, LOCAL_RANK (absent: one plain process); under torchrun join the
    process group, even of one rank (`World.grouped`)."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if device_pref == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device='cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if under_torchrun() and not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        if backend == "nccl" and not use_cuda:
            raise RuntimeError("distributed.backend='nccl' needs CUDA devices; use 'gloo' (or 'auto') on CPU")
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            store=_attempt_store(rank, world_size, timeout_s),
        )
    return World(rank, world_size, local_rank, device, grouped=dist.is_available() and dist.is_initialized())


# torchrun's switch for a fresh rendezvous store per restart attempt (see `_attempt_store`)
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _attempt_store(rank: int, world_size: int, timeout_s: float) -> dist.Store | None:
    """The store a restarted torchrun group joins its process group through; None for torch's default.
    torchrun (torch 2.13) keeps one rendezvous store for all restart attempts and hands it to the workers
    (TORCHELASTIC_USE_AGENT_STORE). A restarted rank then finds the previous attempt's addresses of its peers
    there and connects to dead processes (measured with gloo: "connectFullMesh ... Connection refused", the
    whole restart lost). On one node every worker has the same attempt number (TORCHELASTIC_RESTART_COUNT,
    one agent), so the group's keys go under a prefix of their own. Over several nodes the agents count
    restarts separately (one that only saw a peer node leave does not count it), so there the fix is
    torchrun's own switch, FRESH_STORE_ENV=1 in every node's environment: a new store per attempt. A
    multi-node restart without it stops with that advice instead of hanging."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        raise RuntimeError(
            f"torchrun restarted this {os.environ['GROUP_WORLD_SIZE']}-node group (attempt {attempt}) but shares "
            "its rendezvous store between attempts, where the restarted processes would find their peers' old "
            f"addresses. Set {FRESH_STORE_ENV}=1 in the environment of torchrun on every node."
        )
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,  # the agent hosts it
        timeout=timedelta(seconds=timeout_s),
    )
    return dist.PrefixStore(f"keelrl/attempt_{attempt}", store)


def close_world() -> None:
    """Leave the process group together: a rank tearing it down alone can block for the whole timeout."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def wrap_for_training(policy: torch.nn.Module, world: World, strategy: Strategy) -> torch.nn.Module:
    """The module the update's forward runs through (one plain process: `LogprobModule(policy)`). With fsdp2 the
    policy's own parameters become shards: build the optimizer over `policy.parameters()` after this call."""
    module = LogprobModule(policy)
    if not world.grouped:
        return module
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(policy, "model", None), "layers", None)
    if layers is None:
        raise RuntimeError(
            f"distributed.strategy='fsdp2' shards a decoder's layers (policy.model.layers); "
            f"{type(policy).__name__} has none. Use 'ddp'."
        )
    # The shared-prefix forward runs every layer twice (prompts, then completions) before one backward, which
    # FSDP2's per-module backward hooks do not support (measured: the second use finds the weights freed),
    # so a sharded update runs the plain padded forward (see `Run.update_share_prefix`).
    for layer in layers:
        fully_shard(layer)
    fully_shard(module)  # the rest: embeddings, final norm, head (tied weights stay together)
    return module


def is_sharded(module: torch.nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in module.parameters())


def loss_scale(world: World) -> float:
    """Undo the frameworks' average over ranks: keelrl's per-rank losses already sum to the global loss."""
    return float(world.world_size)


@contextlib.contextmanager
def grad_sync(module: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Inside, backward syncs gradients across ranks only when `enabled` (a step's last micro-batch)."""
    if enabled:
        yield
    elif hasattr(module, "no_sync"):  # DistributedDataParallel
        with module.no_sync():
            yield
    elif hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    else:
        yield


def full_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A sharded policy's full weights on the CPU, on every rank (a collective: every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().to("cpu") for k, v in sd.items()}


def save_sharded(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str) -> bool:
    """Write a sharded policy's weights and optimizer state with torch.distributed.checkpoint, a collective:
    every rank writes its own shards into `directory` (on a file system every rank sees), keyed by parameter
    name (independent of world size); nothing is gathered. Returns whether optimizer state was written:
    before the first update there is none, and asking torch for it initialises it with a zero-gradient
    step, which moves Adam's step count (measured: a first update 0.74x the single-process one's size)."""
    import torch.distributed.checkpoint as dcp

    with_optimizer = bool(optimizer.state)
    dcp.save(_sharded_state(policy, optimizer, with_optimizer), checkpoint_id=directory)
    return with_optimizer


def _sharded_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, with_optimizer: bool
) -> dict[str, Any]:
    """The sharded (DTensor) state dicts `save_sharded` writes and `load_sharded` reads into, by name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: dict[str, Any] = {"model": get_model_state_dict(policy)}
    if with_optimizer:
        state["optimizer"] = get_optimizer_state_dict(policy, optimizer)
    return state


def load_sharded(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str, with_optimizer: bool
) -> None:
    """Read what `save_sharded` wrote (a collective; each rank reads its own shards). Without saved optimizer
    state the optimizer is reset to empty, as a single-process step-0 `load_state_dict` does."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = _sharded_state(policy, optimizer, with_optimizer)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(policy, state["model"])
    if with_optimizer:
        set_optimizer_state_dict(policy, optimizer, state["optimizer"])
    else:
        optimizer.state.clear()


def broadcast_object(value: Any, world: World) -> Any:
    """Rank 0's `value` on every rank (identity at world size 1)."""
    if world.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_sum(value: float, world: World) -> float:
    """Sum of `value` over ranks (identity at world size 1)."""
    if world.world_size == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def all_reduce_stats(stats: dict[str, float], world: World) -> dict[str, float]:
    """Per-rank partial sums -> global sums in one collective ('/max' keys: max); same keys on all ranks."""
    if world.world_size == 1:
        return dict(stats)
    keys = sorted(stats)
    sums = torch.tensor(
        [0.0 if k.endswith("/max") else stats[k] for k in keys], dtype=torch.float64, device=world.device
    )
    maxes = torch.tensor(
        [stats[k] if k.endswith("/max") else 0.0 for k in keys], dtype=torch.float64, device=world.device
    )
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    return {k: float(maxes[i] if k.endswith("/max") else sums[i]) for i, k in enumerate(keys)}


def agree_on_norm(value: float, world: World) -> float:
    """A per-rank gradient norm every rank agrees on (NaN if any is not finite, else the largest), so all
    ranks skip or apply an update together even when one rank's gradients went bad after the sync."""
    if world.world_size == 1:
        return value
    finite = math.isfinite(value)
    t = torch.tensor(
        [0.0 if finite else 1.0, value if finite else 0.0], dtype=torch.float64, device=world.device
    )
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float("nan") if t[0] > 0 else float(t[1])


def all_gather_list(values: list[Any], world: World) -> list[Any]:
    """Concatenate each rank's list in rank order (identity at world size 1)."""
    if world.world_size == 1:
        return list(values)
    gathered: list[list[Any] | None] = [None] * world.world_size
    dist.all_gather_object(gathered, values)
    return [v for part in gathered for v in (part or [])]
