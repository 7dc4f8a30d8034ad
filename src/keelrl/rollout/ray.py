"""Reward scoring (`distributed.scorer = "ray"`) and generation (`distributed.sampler = "ray"`) on pools of
Ray actors, so a cluster's CPUs score and sample while the accelerators train.

`ActorPool`, the piece both use, starts (or joins: `start_ray`) Ray and `size` actors of one class;
`run(method, chunks)` keeps each actor busy with up to two chunks and returns results in chunk order.
- `ScorerPool`: each actor builds its own task from a picklable recipe (loop/setup.py passes
  `functools.partial(get_task, ...)`), so only plain data crosses processes; chunks are consecutive samples.
- `SamplerPool` (a `Sampler`, a drop-in for `HFSampler`): each actor builds the policy and an `HFSampler`
  with the run's settings, on CPU with `threads` torch threads. `update_weights` puts the named tensors into
  the object store once per version. `generate` sends each actor the batches the in-process sampler would
  generate (`generation_chunks`), or with `rollout.chunk_size = 0` one batch per actor (`group_chunks`).
  With `rollout.engine = "vllm"` each actor drives a vLLM engine process of its own (`VLLMSamplingWorker`);
  every push is then sent (never skipped) and checked on every engine (`generate_on_each`, step/weight_sync.py).

Guarantees:
- Results equal in-process ones. Scoring uses `score_safely`, the trainer's local path. Sampling with
  `rollout.chunk_size > 0` is bit-identical; with 0, tokens are identical (row i's randomness comes from
  `seeds[i]` alone) but a log-prob may differ in its last bits (float sums depend on the batch's shape).
- No sample is lost or used twice: a chunk whose actor died (killed, out of memory, node lost) is redone
  from its start on a fresh actor, at most `max_retries` times, then `RayPoolError`; each result is written
  once (asserted). Scores and generations are pure functions of their inputs (prompt, weights, seed), so a
  redo gives the same result. A replacement sampling actor loads the latest weights before any chunk (Ray
  runs one caller's calls in order), and every chunk names the weights version the actor must hold.
- Only actor death is retried; any other failure fails the call with the actor's error.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keelrl.config import Config, ConfigError, ModelConfig
from keelrl.rollout.types import ReplacementCount, Versioned
from keelrl.tasks import Task
from keelrl.tasks.base import Score, score_safely

if TYPE_CHECKING:  # torch and transformers load in sampling processes only (scoring actors start faster)
    from keelrl.algo.logprobs import Autocast
    from keelrl.config.vllm import VLLMConfig
    from keelrl.models.weights import NamedTensors
    from keelrl.rollout.types import Generation, SamplingSettings

CHUNKS_PER_WORKER = 4  # scoring chunks per call and actor: balances load, cheap to redo
START_TIMEOUT_S = 300.0  # for the actors to come up (a cluster may first have to add nodes)
IN_FLIGHT_PER_WORKER = 2  # chunks queued on one actor, so it never waits for the driver between chunks

RAY_MISSING = (
    '{setting} = "ray" needs Ray, which is not installed in this environment. Install it with '
    "pip install 'keelrl[ray]' (or pip install 'ray>=2.9'), or set {setting} = \"local\" to {local} in the "
    "training process."
)
LOCAL_WORK = {"distributed.scorer": "score rewards", "distributed.sampler": "generate"}

_pools_on_own_ray = 0  # live pools on a Ray that `start_ray` started; the last one to shut down stops it


class RayPoolError(RuntimeError):
    """Work on a Ray actor pool cannot go on; the message says why and what to do."""


def import_ray(setting: str = "distributed.scorer") -> Any:
    """The `ray` module, or a ConfigError saying how to install it (`setting`: the key that asked for Ray)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            RAY_MISSING.format(setting=setting, local=LOCAL_WORK.get(setting, "work"))
        ) from None
    return ray


def start_ray(address: str, cpus: int) -> bool:
    """Join the cluster at `address`, or (empty) start a local Ray with `cpus` CPUs, unless this process runs
    Ray already. True when the caller shares a Ray keelrl started and must call `stop_ray`; False for a Ray
    someone else started, which keelrl never stops. The first pool to start sizes it for all of them."""
    global _pools_on_own_ray
    ray = import_ray()
    if not ray.is_initialized():
        options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        if address:
            ray.init(address=address, **options)
        else:
            # "local": a new instance even where RAY_ADDRESS or a `ray start` cluster would be joined
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **options)
        _pools_on_own_ray = 0
    elif _pools_on_own_ray == 0:
        return False
    _pools_on_own_ray += 1
    return True


def stop_ray() -> None:
    """One user of keelrl's own Ray is done; the last one shuts it down."""
    global _pools_on_own_ray
    _pools_on_own_ray -= 1
    if _pools_on_own_ray == 0:
        import_ray().shutdown()


def ray_cpus(cfg: Config) -> int:
    """CPUs of the local Ray the run's pools share (the first pool to start sizes it for both): one per scoring
    actor, and per sampling actor one (transformers) or `vllm.threads` (a vLLM engine)."""
    d = cfg.distributed
    per_sampler = cfg.vllm.threads if cfg.rollout.engine == "vllm" else 1
    return d.ray_workers * (d.scorer == "ray") + d.ray_sampler_workers * per_sampler * (d.sampler == "ray")


def lost_actor_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The errors a call gets when its actor died (and only then)."""
    return (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError)


class ActorPool(ReplacementCount):
    """`size` Ray actors of `actor_cls(*args)` (which needs a `pid()` method), each reserving `actor_cpus`
    CPUs, and the loop that runs chunks on them. `prepare(actor)` brings a replacement actor to the others'
    state before it gets work (Ray runs its calls first); `on_progress` is called as chunks finish."""

    def __init__(
        self,
        actor_cls: type,
        args: tuple[Any, ...],
        size: int,
        *,
        role: str,
        size_setting: str,
        start_hint: str,
        max_retries: int = 3,
        address: str = "",
        ray_cpus: int = 0,
        actor_cpus: int = 1,
        prepare: Callable[[Any], None] | None = None,
        on_progress: Callable[[], None] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        """`role` and `size_setting` (the config key of `size`) name the pool in errors, `start_hint` says
        what to check when actors cannot start; `ray_cpus`: a local Ray's CPUs (0: enough for these);
        `start_timeout_s`: how long the actors may take to come up."""
        ray = import_ray()
        self.role, self.max_retries, self.prepare = role, max_retries, prepare
        self.on_progress = on_progress if on_progress is not None else lambda: None
        self.owns_ray = start_ray(address, ray_cpus or size * actor_cpus)
        self._actor = ray.remote(num_cpus=actor_cpus, max_restarts=0)(actor_cls)
        self._args = args
        self.handles: list[Any] = []
        try:  # build them now, so a broken task or model fails here and not in the middle of a step
            self.handles = [self._actor.remote(*args) for _ in range(size)]
            ray.get([h.pid.remote() for h in self.handles], timeout=start_timeout_s)
        except BaseException as err:
            free = ray.available_resources().get("CPU", 0.0)
            self.shutdown()
            if isinstance(err, ray.exceptions.GetTimeoutError):
                raise RayPoolError(
                    f"Ray did not start {size} {role} actors ({actor_cpus} CPU each) within "
                    f"{start_timeout_s:.0f} s; the cluster has {free:g} CPUs free. Lower {size_setting} or give "
                    "the cluster more CPUs."
                ) from err
            if isinstance(err, ray.exceptions.RayError):
                raise RayPoolError(f"the Ray {role} workers could not start: {err}. {start_hint}") from err
            raise

    @property
    def size(self) -> int:
        return len(self.handles)

    def _replace(self, slot: int) -> None:
        ray = import_ray()
        ray.kill(self.handles[slot], no_restart=True)
        self.handles[slot] = self._actor.remote(*self._args)
        if self.prepare is not None:
            self.prepare(self.handles[slot])
        self._count_replacement()

    def run(self, method: str, chunks: Sequence[tuple[Any, ...]], labels: Sequence[str]) -> list[Any]:
        """`actor.<method>(*chunks[i])` per chunk, results in chunk order; `labels[i]` names it in errors."""
        ray = import_ray()
        results: list[Any] = [None] * len(chunks)
        written = [False] * len(chunks)
        deaths = [0] * len(chunks)
        pending = deque(range(len(chunks)))
        in_flight: dict[Any, tuple[int, int, Any]] = {}  # result ref -> (chunk, actor slot, actor)
        while pending or in_flight:
            # a chunk for every actor before a second for any
            for depth in range(1, IN_FLIGHT_PER_WORKER + 1):
                for slot, actor in enumerate(self.handles):
                    queued = sum(1 for _, s, _ in in_flight.values() if s == slot)
                    if pending and queued < depth:
                        chunk = pending.popleft()
                        in_flight[getattr(actor, method).remote(*chunks[chunk])] = (chunk, slot, actor)
            done, _ = ray.wait(list(in_flight), num_returns=1)
            self.on_progress()
            for ref in done:
                chunk, slot, actor = in_flight.pop(ref)
                try:
                    value = ray.get(ref)
                except lost_actor_errors(ray) as err:
                    deaths[chunk] += 1
                    if deaths[chunk] > self.max_retries:
                        raise RayPoolError(
                            f"{labels[chunk]} lost their Ray {self.role} actor {deaths[chunk]} times "
                            f"(distributed.ray_max_retries={self.max_retries}); last error: {err}. Actors keep "
                            "dying: look for out-of-memory kills or code that crashes its process in the Ray "
                            "logs (/tmp/ray/session_latest/logs on the node), or raise distributed.ray_max_retries."
                        ) from err
                    pending.appendleft(chunk)
                    if self.handles[slot] is actor:  # the first of its chunks to report the death
                        self._replace(slot)
                    continue
                assert not written[chunk], f"chunk {chunk} would be written twice"
                results[chunk], written[chunk] = value, True
        assert all(written)
        return results

    def call_all(self, method: str, *args: Any) -> None:
        """`actor.<method>(*args)` on every actor, replacing those that died. A replacement gets `prepare`,
        not this call, so update what `prepare` reads first."""
        ray = import_ray()
        refs = [getattr(actor, method).remote(*args) for actor in self.handles]
        for slot, ref in enumerate(refs):
            try:
                ray.get(ref)
            except lost_actor_errors(ray):
                self._replace(slot)  # one call per actor: none other can have replaced it (unlike `run`)

    def ask_each(self, method: str, *args: Any) -> list[Any]:
        """`actor.<method>(*args)` on every actor, results in actor order. An actor that died is replaced
        (`prepare`) and asked again, at most `max_retries` times, so every answer comes from a live actor."""
        ray = import_ray()
        refs = [getattr(actor, method).remote(*args) for actor in self.handles]
        results = []
        for slot, ref in enumerate(refs):
            for attempt in range(self.max_retries + 1):
                try:
                    results.append(ray.get(ref))
                    break
                except lost_actor_errors(ray) as err:
                    if attempt == self.max_retries:
                        raise RayPoolError(
                            f"Ray {self.role} actor {slot} died {attempt + 1} times answering {method} "
                            f"(distributed.ray_max_retries={self.max_retries}); last error: {err}"
                        ) from err
                    self._replace(slot)
                    ref = getattr(self.handles[slot], method).remote(*args)
        return results

    def shutdown(self) -> None:
        """Stop the actors (and keelrl's own Ray when no other pool uses it)."""
        ray = import_ray()
        if ray.is_initialized():
            for actor in self.handles:
                ray.kill(actor, no_restart=True)
        self.handles = []
        if self.owns_ray:
            self.owns_ray = False
            stop_ray()


class ScoringWorker:
    """One Ray actor: builds the task once, then scores chunks with the trainer's code path."""

    def __init__(self, make_task: Callable[[], Task]) -> None:
        self.task = make_task()

    def pid(self) -> int:
        return os.getpid()

    def score(self, problems: list[dict[str, Any]], completions: list[str]) -> tuple[list[Score], list[str]]:
        return score_safely(self.task, problems, completions)


class ScorerPool:
    """`workers` Ray actors scoring one task; `score` is a drop-in for in-process scoring."""

    def __init__(
        self,
        make_task: Callable[[], Task],
        workers: int,
        max_retries: int = 3,
        address: str = "",
        chunk_size: int = 0,
        ray_cpus: int = 0,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        """`make_task`: a picklable recipe each actor runs; `ray_cpus` 0: `workers`; `chunk_size` 0: auto."""
        self.chunk_size = chunk_size
        self.actors = ActorPool(
            ScoringWorker,
            (make_task,),
            workers,
            role="scoring",
            size_setting="distributed.ray_workers",
            start_hint="Check that the task can be built from its name, seed and params in a fresh process, "
            'or set distributed.scorer = "local".',
            max_retries=max_retries,
            address=address,
            ray_cpus=ray_cpus,
            on_progress=on_progress,
        )

    def score(self, problems: list[dict[str, Any]], completions: list[str]) -> tuple[list[Score], list[str]]:
        """(scores, checker errors) of `completions[i]` against `problems[i]`, as `score_safely` here."""
        n = len(problems)
        size = self.chunk_size or max(1, math.ceil(n / (self.actors.size * CHUNKS_PER_WORKER)))
        spans = [(start, min(start + size, n)) for start in range(0, n, size)]
        results = self.actors.run(
            "score",
            [(problems[start:end], completions[start:end]) for start, end in spans],
            [f"completions {start}..{end - 1}" for start, end in spans],
        )
        scores: list[Score] = [s for chunk_scores, _ in results for s in chunk_scores]
        errors: list[str] = [e for _, chunk_errors in results for e in chunk_errors]
        assert len(scores) == n
        return scores, errors

    def shutdown(self) -> None:
        """Stop the actors (and keelrl's own Ray when no other pool uses it)."""
        self.actors.shutdown()


def group_chunks(prompts: list[list[int]], order: list[int], parts: int) -> list[list[int]]:
    """Cut `order` (identical prompts adjacent) into about `parts` similar runs, never inside a group."""
    target = max(1, math.ceil(len(order) / max(1, parts)))
    chunks: list[list[int]] = []
    for row in order:
        if chunks and (len(chunks[-1]) < target or prompts[row] == prompts[chunks[-1][-1]]):
            chunks[-1].append(row)
        else:
            chunks.append([row])
    return chunks


class SamplingWorker:
    """One Ray actor: an `HFSampler` over its own policy, generating with the weights version chunks name."""

    def __init__(
        self, model: ModelConfig, share_prefix: bool, autocast: Autocast, threads: int, compile: bool = False
    ) -> None:
        import torch

        from keelrl.models.load import compile_decoder, load_policy
        from keelrl.rollout.hf import HFSampler

        torch.set_num_threads(threads)
        policy, tokenizer = load_policy(model)
        if compile:  # train.compile: the actor compiles on its first batch, as the training process does
            compile_decoder(policy)
        # chunk_size 0: each chunk is one batch (the pool has cut the batches already)
        self.sampler = HFSampler(policy, tokenizer, 0, share_prefix, autocast)
        self.version: int | None = None  # of the loaded weights; None before any load or after a failed one

    def pid(self) -> int:
        return os.getpid()

    def load_weights(self, weights: NamedTensors, version: int, *push_args: Any) -> None:
        """`push_args`: the rest of the sampler's `update_weights` (a vLLM engine's `reset_prefix_cache`)."""
        from keelrl.models.weights import WeightsMismatch

        self.version = None
        try:
            self.sampler.update_weights(weights, version, *push_args)
        except WeightsMismatch as err:
            raise RayPoolError(
                f"the weights sent to a sampling actor do not fit its model: {err}. The actors build the policy "
                "from model.path."
            ) from None
        self.version = version

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int], version: int
    ) -> list[Generation]:
        if self.version != version:
            raise RayPoolError(
                f"sampling actor {os.getpid()} holds weights version {self.version}, but the chunk is for version "
                f"{version} (None: loading them failed; its error is in the Ray worker log)"
            )
        return self.sampler.generate(prompts, settings, seeds)


class VLLMSamplingWorker(SamplingWorker):
    """One Ray actor driving a vLLM engine process of its own (`VLLMSampler`, which restarts a dead engine and
    redoes its call; `take_replaced` passes the count on). The engine dies with the actor."""

    def __init__(self, model: ModelConfig, settings: VLLMConfig) -> None:
        from keelrl.models.load import load_policy
        from keelrl.rollout.vllm import VLLMSampler

        policy, tokenizer = load_policy(model)  # for its architecture and stop tokens; weights come by push
        self.sampler = VLLMSampler(policy, tokenizer, settings)
        self.version = None

    def engine_pid(self) -> int | None:
        return self.sampler.engine_pid

    def take_replaced(self) -> int:
        return self.sampler.take_replaced()


class SamplerPool(Versioned):
    """`workers` Ray actors generating with the policy's weights; a `Sampler` (see the module docstring)."""

    def __init__(
        self,
        model: ModelConfig,
        workers: int,
        chunk_size: int = 0,
        share_prefix: bool = True,
        autocast: Autocast = "off",
        compile: bool = False,
        threads: int = 1,
        max_retries: int = 3,
        address: str = "",
        ray_cpus: int = 0,
        worker: type[SamplingWorker] | None = None,
        vllm: VLLMConfig | None = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        """`model` is built in each actor (a local path made absolute); `chunk_size` (0: one batch per actor),
        `share_prefix`, `autocast`, `compile` are `HFSampler`'s; each actor runs and reserves `threads` CPUs;
        `ray_cpus` 0: `workers * threads`; `worker`: the actor class. `vllm`: actors drive vLLM engines with
        these settings (`threads` is then `vllm.threads`). No weights until `update_weights`."""
        path = Path(model.path).expanduser()
        if model.path not in ("tiny", "smollm2") and path.exists():
            model = model.model_copy(update={"path": str(path.resolve())})
        self.chunk_size = chunk_size
        self.checks_sync = vllm is not None  # engines with a copy of the weights: every push is checked
        self._version = -1
        self._weights: Any = None  # object ref of the current weights
        args: tuple[Any, ...] = (model, share_prefix, autocast, threads, compile)
        start_timeout_s = START_TIMEOUT_S
        if vllm is not None:  # a vLLM actor starts its engine first: allow the engine's own start timeout
            worker, args, threads = worker or VLLMSamplingWorker, (model, vllm), vllm.threads
            start_timeout_s = max(START_TIMEOUT_S, vllm.start_timeout_s)
        self.replaced_total = 0  # actors replaced and engines restarted inside actors
        self.actors = ActorPool(
            worker or SamplingWorker,
            args,
            workers,
            role="sampling",
            size_setting="distributed.ray_sampler_workers",
            start_hint="Check that model.path can be loaded on the Ray nodes (a local path must exist there "
            'too), or set distributed.sampler = "local".',
            max_retries=max_retries,
            address=address,
            ray_cpus=ray_cpus,
            actor_cpus=threads,
            prepare=self._prepare,
            on_progress=on_progress,
            start_timeout_s=start_timeout_s,
        )

    def _prepare(self, actor: Any) -> None:
        if self._weights is not None:
            actor.load_weights.remote(self._weights, self._version)

    def update_weights(self, weights: NamedTensors, version: int, reset_prefix_cache: bool = True) -> None:
        """Send the named tensors to every actor, unless they hold `version` (kept on rollback/resume) and are
        not checked engines (`checks_sync`: always sent, then each engine's prefix cache is emptied;
        `reset_prefix_cache` False: the stale-cache drill)."""
        if version == self._version and not self.checks_sync:
            return
        ray = import_ray()
        self._weights = ray.put({k: v.detach().cpu() for k, v in dict(weights).items()})
        self._version = version
        push_args = (reset_prefix_cache,) if self.checks_sync else ()
        self.actors.call_all("load_weights", self._weights, version, *push_args)

    def generate_on_each(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[list[Generation]]:
        """`generate` on every actor, whole (the weight-sync probe checks each engine)."""
        return self.actors.ask_each("generate", prompts, settings, seeds, self._version)

    @property
    def engine_pid(self) -> int | None:
        """The first actor's vLLM engine process (the kill_engine_at_step drill; on this node with a local
        Ray); None for transformers actors."""
        return self.actors.ask_each("engine_pid")[0] if self.checks_sync else None

    def take_replaced(self) -> int:
        """Actors replaced, and (vLLM) engines restarted inside actors, since the last call."""
        n = self.actors.take_replaced()
        if self.checks_sync:
            n += sum(self.actors.ask_each("take_replaced"))
        self.replaced_total += n
        return n

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        """One completion per prompt, `seeds[i]` driving row i, in input order (see the module docstring)."""
        from keelrl.rollout.hf import generation_chunks

        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if self._weights is None:
            raise RayPoolError("SamplerPool.generate before update_weights: the actors hold no weights yet")
        if not prompts:
            return []
        if self.chunk_size:
            chunks = generation_chunks(prompts, self.chunk_size)
        else:
            chunks = group_chunks(prompts, generation_chunks(prompts, 0)[0], self.actors.size)
        labels = [f"{len(rows)} prompts (rows {', '.join(map(str, rows[:3]))}, ...)" for rows in chunks]
        work = [
            ([prompts[i] for i in rows], settings, [seeds[i] for i in rows], self._version) for rows in chunks
        ]
        results = self.actors.run("generate", work, labels)
        by_row = {i: gen for rows, gens in zip(chunks, results) for i, gen in zip(rows, gens, strict=True)}
        assert len(by_row) == len(prompts)
        return [by_row[i] for i in range(len(prompts))]

    def shutdown(self) -> None:
        """Stop the actors (and keelrl's own Ray when no other pool uses it)."""
        self.actors.shutdown()
