"""Save, validate, load and rotate `TrainState` checkpoints, atomically.

A checkpoint `checkpoints/step_XXXXXXXX/` is also a standard HF model directory (`from_pretrained` and
`keelrl eval` read it as is) plus `trainer_state.pt` (optimizer, scheduler, RNG states), `state.json`
(counters, curriculum/guard state, the resolved config, health) and `manifest.json` (sha256 and size of
every file). With LoRA (`model.lora`) it is a peft adapter directory instead of a model one:
`adapter_model.safetensors` + `adapter_config.json`, the adapters only (the frozen base comes from `model.path`,
its sha256 recorded in state.json as `lora_base` and checked on load; keelrl/models/lora.py). A sharded (FSDP2) run
resumes from `sharded/` (every rank's own shards, nothing gathered; see `distributed.save_sharded`); its
`model.safetensors` is the sampler's whole-weights copy.

Commit protocol: everything is written under `checkpoints/.tmp-step_XXXXXXXX-PID-.../` (the ranks of a
sharded run first write `sharded/` into a directory from `stage_dir`), each file fsynced,
the manifest written last, the directory renamed to its final name (atomic on POSIX), the parent fsynced,
and only then is `latest` (a symlink) swapped to it and are old checkpoints deleted. A crash at any point
leaves the previous checkpoint intact; a half-written directory never has a final name. On load, a
checkpoint whose manifest does not verify is skipped in favour of the next older one, and so is one that
verifies but does not load (`CheckpointUnreadable`: a file replaced and its manifest rewritten to match).

`snapshot()` copies the state to CPU memory (all the loop waits for); `write_snapshot()` writes it, in a
background thread under `AsyncCheckpointer`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from keelrl.models import lora
from keelrl.models.weights import WeightsMismatch, load_untied, tensors_sha256, untied_state_dict
from keelrl.monitor.run_dir import read_json
from keelrl.run.distributed import is_sharded, load_sharded
from keelrl.run.state import TrainState, capture_rng, restore_rng

MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
TRAINER_STATE = "trainer_state.pt"
STATE_JSON = "state.json"
SHARDED = "sharded"
LATEST = "latest"
# what a failed write raises: OSError (json, tokenizer files), SafetensorError (the weights; a full disk is
# "I/O error: No space left on device"), RuntimeError (torch.save: "PytorchStreamWriter failed writing file")
WRITE_ERRORS = (OSError, SafetensorError, RuntimeError)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and why."""


class CheckpointUnreadable(RuntimeError):
    """A checkpoint that verifies against its manifest but cannot be read. Not a user error: resume passes
    it over for the next older one, as it does a checksum mismatch."""


@dataclass
class Snapshot:
    """A CPU copy of everything a checkpoint holds, taken between steps."""

    step: int
    weights: dict[str, torch.Tensor]
    trainer: dict[str, Any]  # optimizer, scheduler, rng
    state: dict[str, Any]  # JSON: counters, config, health, metrics
    model_config: Any
    generation_config: Any
    tokenizer: PreTrainedTokenizerBase
    adapter_config: dict[str, Any] | None = None  # LoRA: `weights` are the adapters (peft's file layout)


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _cpu_copy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_cpu_copy(v) for v in obj)
    return obj


def weights_sha256(model: torch.nn.Module) -> str:
    """Hash of the policy weights (names, dtypes, shapes and bytes, in name order): equal iff bit-identical. A LoRA
    policy's hash covers its base weights and its adapters alike, under the policy's own names."""
    return tensors_sha256(untied_state_dict(model))


def snapshot(
    train_state: TrainState,
    tokenizer: PreTrainedTokenizerBase,
    config: dict[str, Any],
    extra: dict[str, Any],
    whole_policy: torch.nn.Module | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Snapshot:
    """Copy everything a restart needs to CPU memory. A sharded run passes the whole-weights copy and, as
    `optimizer_state`, `{"format": "sharded", "with_state": ...}` (what `save_sharded` wrote)."""
    policy = whole_policy if whole_policy is not None else train_state.policy
    adapter = lora.has_lora(policy)
    tensors = lora.adapter_state_dict(policy) if adapter else untied_state_dict(policy)
    weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    if optimizer_state is None:
        optimizer_state = train_state.optimizer.state_dict()
    trainer = {
        "optimizer": _cpu_copy(optimizer_state),
        "scheduler": train_state.scheduler.state_dict(),
        "rng": capture_rng(),
    }
    if train_state.pipeline:
        trainer["pipeline"] = train_state.pipeline  # plain data: token ids, log-probs, problems
    if train_state.critic is not None and train_state.critic_optimizer is not None:
        trainer["critic"] = {
            "weights": _cpu_copy(train_state.critic.state_dict()),
            "optimizer": _cpu_copy(train_state.critic_optimizer.state_dict()),
        }
    if train_state.proposer is not None:  # selfplay.policies = "two" (stages/selfplay/roles.py)
        trainer["proposer"] = _cpu_copy(train_state.proposer.state_dict())
    state = {**train_state.counters(), "config": config, **extra}
    if train_state.lora_base is not None:
        state["lora_base"] = train_state.lora_base
    return Snapshot(
        step=train_state.step,
        weights=weights,
        trainer=trainer,
        state=state,
        model_config=policy.config,
        generation_config=getattr(policy, "generation_config", None),
        tokenizer=tokenizer,
        adapter_config=lora.adapter_config(policy, (train_state.lora_base or {}).get("path", ""))
        if adapter
        else None,
    )


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage_dir(checkpoints_dir: Path, step: int) -> Path:
    """An empty temp directory for checkpoint `step`'s early files (shards): `write_snapshot`'s `staged`."""
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    tmp = checkpoints_dir / f".tmp-{step_dir_name(step)}-{os.getpid()}-staged"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def write_snapshot(
    snap: Snapshot,
    checkpoints_dir: Path,
    healthy: bool = True,
    staged: Path | None = None,
    on_file: Callable[[str], None] | None = None,
) -> Path:
    """Write `snap` as a committed checkpoint and point `latest` at it; files already in `staged` (from
    `stage_dir`) become part of it. Raises CheckpointError when a write fails (a full disk: OSError, or
    SafetensorError / RuntimeError from the libraries); the temporary directory is removed whatever failed and
    the previous checkpoints are untouched. `on_file(name)` is called after each file is written (the
    `[faults]` drills fail or kill the save there)."""
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(snap.step)
    final = checkpoints_dir / name
    tmp = staged or checkpoints_dir / f".tmp-{name}-{os.getpid()}-{threading.get_ident()}"
    if staged is None and tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(exist_ok=staged is not None)
        files: list[str] = []
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            _fsync(f)
            files.append(str(f.relative_to(tmp)))

        def done(fname: str) -> None:
            _fsync(tmp / fname)
            files.append(fname)
            if on_file is not None:
                on_file(fname)

        if snap.adapter_config is not None:  # LoRA: a peft adapter directory (module docstring)
            save_file(snap.weights, str(tmp / lora.ADAPTER_WEIGHTS), metadata={"format": "pt"})
            done(lora.ADAPTER_WEIGHTS)
            (tmp / lora.ADAPTER_CONFIG).write_text(json.dumps(snap.adapter_config, indent=2, default=str))
            done(lora.ADAPTER_CONFIG)
        else:
            save_file(snap.weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
            done(WEIGHTS)
            snap.model_config.save_pretrained(tmp)
            done("config.json")
        if snap.generation_config is not None:
            snap.generation_config.save_pretrained(tmp)
            done("generation_config.json")
        before = set(os.listdir(tmp))
        snap.tokenizer.save_pretrained(tmp)
        for fname in sorted(set(os.listdir(tmp)) - before):
            done(fname)
        torch.save(snap.trainer, tmp / TRAINER_STATE)
        done(TRAINER_STATE)
        state = {**snap.state, "healthy": healthy, "saved_at": time.time()}
        (tmp / STATE_JSON).write_text(json.dumps(state, indent=2, default=str))
        done(STATE_JSON)
        manifest = {
            "step": snap.step,
            "healthy": healthy,
            "files": {f: {"sha256": sha256_file(tmp / f), "bytes": (tmp / f).stat().st_size} for f in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _fsync(tmp / MANIFEST)
        _fsync(tmp, directory=True)
        if final.exists():  # a checkpoint of this step from an earlier attempt: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(checkpoints_dir, directory=True)
        set_latest(checkpoints_dir, name)
    except WRITE_ERRORS as err:
        raise CheckpointError(
            f"saving checkpoint {name} failed ({type(err).__name__}: {err}; "
            f"{shutil.disk_usage(checkpoints_dir).free / 1e6:.1f} MB free); the previous checkpoints are intact. "
            f"Free space under {checkpoints_dir} or lower checkpoint.keep_last."
        ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a partial directory, whatever failed (gone once renamed)
    return final


def set_latest(checkpoints_dir: Path, name: str) -> None:
    link = checkpoints_dir / LATEST
    tmp = checkpoints_dir / f".{LATEST}.tmp{os.getpid()}"
    tmp.unlink(missing_ok=True)  # left by an interrupted swap
    os.symlink(name, tmp)
    os.replace(tmp, link)
    _fsync(checkpoints_dir, directory=True)


def committed(checkpoints_dir: Path) -> list[Path]:
    """Committed checkpoint directories, newest step first (temporary and partial ones excluded)."""
    dirs = [p for p in checkpoints_dir.glob("step_*") if p.is_dir() and not p.is_symlink()]
    return sorted(dirs, key=lambda p: p.name, reverse=True)


def verify(path: Path) -> str | None:
    """None if every file listed in the manifest exists with its recorded size and sha256; else why not."""
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return "no manifest.json (an interrupted or foreign save)"
    except json.JSONDecodeError as err:
        return f"manifest.json is not valid JSON ({err})"
    for fname, meta in manifest.get("files", {}).items():
        f = path / fname
        if not f.is_file():
            return f"{fname} is missing"
        if f.stat().st_size != meta["bytes"]:
            return f"{fname} has {f.stat().st_size} bytes, manifest says {meta['bytes']}"
        if sha256_file(f) != meta["sha256"]:
            return f"{fname} does not match its sha256 (corrupted)"
    return None


def read_manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / MANIFEST).read_text())


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_JSON).read_text())


def find_resumable(
    checkpoints_dir: Path, healthy_only: bool = False, older_than: str = "~"
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """Newest checkpoint that verifies (and is marked healthy, if asked), plus the (path, reason) of each
    newer one that was passed over; only those whose name sorts before `older_than`, if given."""
    skipped: list[tuple[Path, str]] = []
    for path in (p for p in committed(checkpoints_dir) if p.name < older_than):
        problem = verify(path)
        if problem is None and healthy_only and not read_manifest(path).get("healthy", True):
            problem = "marked unhealthy"
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def load_into(path: Path, train_state: TrainState) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, RNG and counters from checkpoint `path`. Returns state.json."""
    policy = train_state.policy
    try:  # first: when it fails, nothing in train_state has changed
        trainer = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, ImportError, AttributeError) as err:
        raise CheckpointUnreadable(f"{TRAINER_STATE} does not load ({type(err).__name__}: {err})") from None
    if train_state.critic is not None and "critic" not in trainer:
        raise CheckpointError(
            f"{path} has no value model (a run without algo.advantage = 'gae' saved it); start a new run directory "
            "to train with a critic"
        )
    if (train_state.proposer is not None) != ("proposer" in trainer):
        mine, saved = ("two", "one") if train_state.proposer is not None else ("one", "two")
        raise CheckpointError(
            f"{path} was saved by a self-play run with selfplay.policies = '{saved}', this run has '{mine}'; resume "
            "with the setting it was made with, or start a new run directory"
        )
    saved_sharded = trainer["optimizer"].get("format") == "sharded"
    if saved_sharded != is_sharded(policy):
        how = (
            "a sharded (FSDP2) run; resume it with distributed.strategy='fsdp2' under torchrun"
            if saved_sharded
            else "an unsharded run; resume it with distributed.strategy='ddp' (or one process)"
        )
        raise CheckpointError(f"{path} was saved by {how}")
    if saved_sharded:
        load_sharded(policy, train_state.optimizer, str(path / SHARDED), trainer["optimizer"]["with_state"])
    elif lora.has_lora(policy) or (path / lora.ADAPTER_WEIGHTS).is_file():
        _load_adapter(path, train_state)
        train_state.optimizer.load_state_dict(trainer["optimizer"])
    else:
        weights = load_file(str(path / WEIGHTS), device=str(next(policy.parameters()).device))
        try:
            load_untied(policy, weights)
        except WeightsMismatch as err:
            raise CheckpointError(f"{path} does not fit the policy: {err}") from None
        train_state.optimizer.load_state_dict(trainer["optimizer"])
    if train_state.critic is not None and train_state.critic_optimizer is not None:
        train_state.critic.load_state_dict(trainer["critic"]["weights"])
        train_state.critic_optimizer.load_state_dict(trainer["critic"]["optimizer"])
    if train_state.proposer is not None:
        train_state.proposer.load_state_dict(trainer["proposer"])
    train_state.scheduler.load_state_dict(trainer["scheduler"])
    restore_rng(trainer["rng"])
    train_state.pipeline = list(trainer.get("pipeline", []))
    state = read_state(path)
    train_state.load_counters(state)
    return state


def _load_adapter(path: Path, train_state: TrainState) -> None:
    """A LoRA checkpoint into a LoRA policy: the same base weights (sha256) and adapters of the same shapes."""
    if not lora.has_lora(train_state.policy):
        raise CheckpointError(
            f"{path} holds LoRA adapters, but this run trains the whole policy; resume it with its model.lora settings"
        )
    if not (path / lora.ADAPTER_WEIGHTS).is_file():
        raise CheckpointError(
            f"{path} holds whole weights, but this run trains LoRA adapters; resume it without model.lora, or start a "
            "new run directory"
        )
    saved = read_state(path).get("lora_base") or {}
    mine = train_state.lora_base or {}
    if saved.get("weights_sha256") != mine.get("weights_sha256"):
        raise CheckpointError(
            f"{path} holds LoRA adapters trained on other base weights: the checkpoint's base "
            f"{saved.get('path')!r} has sha256 {str(saved.get('weights_sha256'))[:12]}..., this run's "
            f"{mine.get('path')!r} {str(mine.get('weights_sha256'))[:12]}.... Adapters only make sense on their own "
            "base: point model.path at the base they were trained on (unchanged), or start a new run directory."
        )
    try:
        weights = lora.read_adapter(path)
    except (SafetensorError, OSError) as err:
        raise CheckpointUnreadable(f"{lora.ADAPTER_WEIGHTS} does not load ({err})") from None
    try:
        lora.load_adapter(train_state.policy, weights)
    except lora.LoraError as err:
        raise CheckpointError(f"{path} does not fit the policy: {err}") from None


def rollback_anchor(checkpoints_dir: Path, before_step: int) -> str | None:
    """The checkpoint retention must keep so that a rollback has somewhere to go: the newest one marked
    healthy at or before `before_step`, else the oldest healthy one (None: there is none)."""
    healthy = []
    for p in committed(checkpoints_dir):
        manifest = read_json(p / MANIFEST)
        if manifest is not None and manifest.get("healthy", True):
            healthy.append((int(manifest["step"]), p.name))
    older = [h for h in healthy if h[0] <= before_step]
    return max(older)[1] if older else min(healthy, default=(0, None))[1]


def prune(
    checkpoints_dir: Path, keep_last: int, keep_best: int, best_metric: str, protect: tuple[str, ...] = ()
) -> list[Path]:
    """After a commit, delete checkpoints not among the newest `keep_last` or `keep_best` (by `best_metric`),
    nor `latest`, nor in `protect`, and leftovers of interrupted saves; returns what was deleted."""
    ckpts = committed(checkpoints_dir)
    keep = {p.name for p in ckpts[:keep_last]} | set(protect)
    latest = checkpoints_dir / LATEST
    if latest.is_symlink():
        keep.add(os.readlink(latest))
    if keep_best > 0:
        values = {
            p.name: (read_json(p / STATE_JSON) or {}).get("metrics", {}).get(best_metric) for p in ckpts
        }
        # best first, ties by name
        scored = sorted((-value, name) for name, value in values.items() if isinstance(value, (int, float)))
        keep.update(name for _, name in scored[:keep_best])
    deleted = [p for p in ckpts if p.name not in keep]
    for p in deleted:
        shutil.rmtree(p, ignore_errors=True)
    mine = f"-{os.getpid()}-"
    for p in checkpoints_dir.glob(".tmp-step_*"):
        if mine not in p.name:  # leftovers of a crashed process, never our own in-flight save
            shutil.rmtree(p, ignore_errors=True)
    return deleted


class AsyncCheckpointer:
    """Writes snapshots in a background thread, at most one in flight: `submit` waits for the previous
    write to finish first. Every write ends in `on_done(path, error, snapshot)`, a failed one too, so its
    error reaches the trainer (recovery.collect_saves) at the next step instead of dying with the thread."""

    def __init__(self, on_done: Callable[[Path | None, BaseException | None, Snapshot], None]) -> None:
        self.on_done = on_done
        self._thread: threading.Thread | None = None

    def submit(
        self,
        snap: Snapshot,
        checkpoints_dir: Path,
        healthy: bool,
        staged: Path | None = None,
        on_file: Callable[[str], None] | None = None,
    ) -> float:
        """Start writing (as `write_snapshot`); returns the seconds spent waiting for the previous write."""
        t0 = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - t0

        def run() -> None:
            try:
                path = write_snapshot(snap, checkpoints_dir, healthy, staged, on_file)
            except Exception as err:  # not only CheckpointError: nothing may vanish with the thread
                self.on_done(None, err, snap)
                return
            self.on_done(path, None, snap)

        self._thread = threading.Thread(target=run, name="keelrl-checkpoint", daemon=False)
        self._thread.start()
        return waited

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's (2006) optimum time between checkpoints, in seconds of work, for save cost C and mean time
    between failures M: sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C when C < 2M, else M. It refines
    Young's sqrt(2CM). E.g. M = 24 h, C = 5 min gives about 117 min."""
    c, m = max(save_cost_s, 1e-9), mtbf_s
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


class CheckpointPolicy:
    """When to save: every N steps, every M minutes, or (auto) at Daly's interval computed from the measured
    save cost and the observed mean time between failures (restarts in events.jsonl over the run's wall time).
    It also tracks how far the newest good checkpoint is behind when saves fail, and when to give up."""

    def __init__(
        self,
        every_steps: int,
        every_minutes: float,
        auto: bool,
        assumed_mtbf_s: float,
        max_failed_saves: int = 0,
        max_unsaved_minutes: float = 0.0,
        step: int = 0,
    ) -> None:
        self.every_steps = every_steps
        self.every_s = every_minutes * 60.0
        self.auto = auto
        self.assumed_mtbf_s = assumed_mtbf_s
        self.last_save = time.monotonic()
        self.save_cost_s: float | None = None
        self.failures = 0
        self.wall_s = 0.0
        self.max_failed_saves, self.max_unsaved_s = max_failed_saves, max_unsaved_minutes * 60.0
        # the newest good checkpoint: where this worker resumed (or began) until it saves one itself
        self.good_step, self.good_time = step, time.time()
        self.failed_in_row, self.failed_total, self.last_error = 0, 0, ""

    def observe_failures(self, failures: int, wall_s: float) -> None:
        self.failures, self.wall_s = failures, wall_s

    def record_save(self, cost_s: float, step: int, snapshot_time: float) -> None:
        self.last_save = time.monotonic()
        self.save_cost_s = cost_s if self.save_cost_s is None else 0.5 * (self.save_cost_s + cost_s)
        self.good_step, self.good_time, self.failed_in_row = step, snapshot_time, 0

    def record_failure(self, error: str) -> None:
        """A save failed: count it, and try again one interval later (not at every step)."""
        self.last_save = time.monotonic()
        self.failed_in_row += 1
        self.failed_total += 1
        self.last_error = error

    def minutes_since_good(self) -> float:
        return (time.time() - self.good_time) / 60.0

    def behind(self, step: int) -> dict[str, float]:
        """Metrics of how far the newest good checkpoint is behind `step`: none until a save has failed in
        this worker (a healthy run's records stay as they were)."""
        if not self.failed_total:
            return {}
        return {
            "checkpoint/steps_since_good": float(step - self.good_step),
            "checkpoint/minutes_since_good": self.minutes_since_good(),
            "checkpoint/failed_saves": float(self.failed_total),
        }

    def give_up(self) -> str | None:
        """Which configured bound the failing saves crossed (the run must stop), or None. A long gap between
        saves that did not fail is the configured cadence, not a reason to stop."""
        if not self.failed_in_row:
            return None
        if self.max_failed_saves and self.failed_in_row >= self.max_failed_saves:
            return f"{self.failed_in_row} checkpoint saves in a row failed (checkpoint.max_failed_saves={self.max_failed_saves})"
        if self.max_unsaved_s and self.minutes_since_good() * 60.0 > self.max_unsaved_s:
            return (
                f"nothing was saved for {self.minutes_since_good():.1f} minutes "
                f"(checkpoint.max_unsaved_minutes={self.max_unsaved_s / 60.0:g})"
            )
        return None

    def interval_s(self) -> float | None:
        if self.auto:
            mtbf = self.wall_s / self.failures if self.failures else self.assumed_mtbf_s
            return daly_interval(self.save_cost_s if self.save_cost_s is not None else 1.0, mtbf)
        return self.every_s or None

    def due(self, step: int) -> bool:
        if not self.auto and self.every_steps and step % self.every_steps == 0:
            return True
        interval = self.interval_s()
        return interval is not None and time.monotonic() - self.last_save >= interval
