"""`ProcessSampler`: a `Sampler` whose `HFSampler` runs in a child process of its own (spawned), over its own
copy of the policy, so that generation can run while the trainer updates (`rollout.max_staleness` >= 1, the
asynchronous pipeline in keelrl/rollout/pipeline.py). The child builds the policy from `model.path` (architecture and
tokenizer); its weights always come from `update_weights`.

Guarantees:
- The weights reach the child, checked: after each load the child returns a fingerprint of the tensors it
  holds (per tensor, the float64 sum and sum of squares) and it must equal the fingerprint of what was sent.
- Results equal an in-process `HFSampler`'s with the same settings and weights (row i's randomness comes from
  `seeds[i]` alone); a child that dies (killed, out of memory) is replaced, loaded with the last weights pushed,
  and the call is redone from its start, at most `MAX_RESTARTS` times in a row; nothing is lost or duplicated
  because a call's result is the pure function of (weights, prompts, seeds).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp

from keelrl.models.weights import untied_state_dict
from keelrl.rollout.types import Generation, ReplacementCount, SamplingSettings, Versioned

if TYPE_CHECKING:
    from keelrl.config import Config
    from keelrl.models.weights import NamedTensors

MAX_RESTARTS = 3  # child deaths in a row within one call before giving up
PROGRESS_EVERY_S = 1.0  # the child's progress messages while it decodes
START_TIMEOUT_S = 600.0  # for the child to import torch and build the policy
Fingerprint = list[tuple[str, float, float]]


class SamplerProcessError(RuntimeError):
    """The sampling process cannot go on; the message says why."""


def fingerprint(weights: dict[str, torch.Tensor]) -> Fingerprint:
    """Per tensor (sorted by name): its float64 sum and sum of squares. Equal tensors give equal fingerprints."""
    out = []
    for name in sorted(weights):
        t = weights[name].detach().double()
        out.append((name, float(t.sum()), float(t.square().sum())))
    return out


def _serve(conn: Any, cfg: Config, threads: int) -> None:
    """The child: build the policy and an HFSampler, then answer ("load", weights, version) and
    ("generate", prompts, settings, seeds) until ("stop",) or the parent goes away."""
    torch.set_num_threads(threads)
    from keelrl.models.load import load_policy
    from keelrl.rollout.hf import HFSampler

    policy, tokenizer = load_policy(cfg.model)
    policy.eval()
    last = [0.0]

    def progress() -> None:  # at most one message a second: the parent's heartbeat follows decoding
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            conn.send(("progress",))

    r, t = cfg.rollout, cfg.train
    sampler = HFSampler(policy, tokenizer, r.chunk_size, t.share_prefix, t.autocast, progress, r.decode)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        try:
            if msg[0] == "stop":
                return
            if msg[0] == "load":
                sampler.update_weights(msg[1], msg[2])  # loads them into the policy (load_untied)
                conn.send(("ok", fingerprint(untied_state_dict(policy))))
            elif msg[0] == "generate":
                conn.send(("ok", sampler.generate(*msg[1:])))
        except Exception as err:
            conn.send(("error", f"{type(err).__name__}: {err}"))


class ProcessSampler(ReplacementCount, Versioned):
    """A `Sampler` in a child process (see the module docstring). `threads`: the child's torch threads;
    `on_progress` is called while the child decodes (about once a second), as `HFSampler`'s is per step."""

    def __init__(self, cfg: Config, threads: int = 1, on_progress: Callable[[], None] | None = None) -> None:
        self.cfg, self.threads, self.on_progress = cfg, threads, on_progress
        self._ctx = mp.get_context("spawn")
        self._weights: dict[str, torch.Tensor] | None = None
        self._version = -1
        self._proc: Any = None
        self._conn: Any = None
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.cfg, self.threads), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        reply = self._wait(START_TIMEOUT_S, "starting")
        if reply[0] != "ready":
            raise SamplerProcessError(f"the sampling process did not start: {reply}")

    @property
    def engine_pid(self) -> int | None:
        """The child's pid (the kill_engine_at_step drill)."""
        return self._proc.pid if self._proc is not None else None

    def _wait(self, timeout_s: float, doing: str) -> Any:
        """The child's next reply; EOFError when it died. Polls so that a dead child is noticed; the child's
        progress messages (about one a second while it decodes) go to `on_progress`."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._conn.poll(1.0):
                msg = self._conn.recv()
                if msg[0] != "progress":
                    return msg
                if self.on_progress is not None:
                    self.on_progress()
            elif not self._proc.is_alive() and not self._conn.poll(0):
                raise EOFError(f"the sampling process died while {doing} (exit code {self._proc.exitcode})")
            if time.monotonic() > deadline:
                raise SamplerProcessError(
                    f"the sampling process did not answer within {timeout_s:g} s while {doing}"
                )

    def _call(self, msg: tuple[Any, ...], doing: str) -> Any:
        """Send `msg` and return the child's answer, replacing a dead child (loaded with the last weights) and
        redoing the call, at most MAX_RESTARTS times in a row."""
        for attempt in range(MAX_RESTARTS + 1):
            try:
                self._conn.send(msg)
                reply = self._wait(float("inf"), doing)
            except (EOFError, BrokenPipeError, ConnectionResetError) as err:
                if attempt == MAX_RESTARTS:
                    raise SamplerProcessError(
                        f"the sampling process died {MAX_RESTARTS + 1} times in a row while {doing}: {err}"
                    ) from None
                self._restart()
                continue
            if reply[0] == "error":
                raise SamplerProcessError(f"the sampling process failed while {doing}: {reply[1]}")
            return reply[1]
        raise AssertionError("unreachable")

    def _restart(self) -> None:
        self._proc.join(timeout=5)
        self._conn.close()
        self._start()
        self._count_replacement()
        if self._weights is not None:
            self._load(self._weights, self._version)

    def _load(self, weights: dict[str, torch.Tensor], version: int) -> None:
        held = self._call(("load", weights, version), f"loading weights version {version}")
        if held != fingerprint(weights):
            raise SamplerProcessError(
                f"the sampling process holds other weights than the ones sent (version {version}): their "
                "fingerprints differ"
            )

    def update_weights(self, weights: NamedTensors, version: int) -> None:
        """Send a copy of the named tensors to the child (and keep it, for a replacement child), checked."""
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in dict(weights).items()}
        self._weights, self._version = snapshot, version
        self._load(snapshot, version)

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        if self._weights is None:
            raise SamplerProcessError(
                "ProcessSampler.generate before update_weights: the child holds no weights"
            )
        return self._call(("generate", prompts, settings, seeds), f"generating {len(prompts)} completions")

    def shutdown(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(("stop",))
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
        self._conn.close()
        self._proc = None
