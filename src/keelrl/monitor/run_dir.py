"""The run directory contract (DESIGN.md): one place that knows every file's name and format.

    config.json          resolved config
    metrics.jsonl        one JSON object per step: {"step": int, "time": float, ...}
    rollouts.jsonl.gz    sampled traces (one gzip member appended per step)
    events.jsonl         restarts, rollbacks, skips, checkpoints, faults, with reasons
    status.json          live: state, step, pids (on `host`), restarts, last checkpoint, heartbeat
    checkpoints/         step_XXXXXXXX/ directories and a `latest` symlink
    final/               the final policy as a standard HF directory
    summary.json         written at the end
    lock, lock.json      one trainer at a time (monitor/run_lock.py)

Only the writer (rank 0) writes. Small files are replaced atomically (write to a temporary file, fsync,
rename), so a reader never sees half a status or summary. The writer checks at once that the directory
can be created and written (`RunDirError`, a user error), rather than failing at the first save.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# the worker's liveness, written by run/supervisor.Heartbeat, read by the doctor
HEARTBEAT_FILE = "heartbeat.json"


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when the file is missing, torn, not UTF-8 or holds no object."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so lines stay valid JSON and the doctor can see them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), allow_nan=False, default=str)


def _jsonl_records(path: Path) -> Iterator[dict[str, Any] | None]:
    """Each line of a JSON-lines file parsed; None for a line that is not a JSON object (torn by a writer
    killed mid-write, or by a power loss: only the tail can be)."""
    if not path.exists():
        return
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                yield record if isinstance(record, dict) else None
    except (EOFError, gzip.BadGzipFile):
        return  # a gzip member cut short by a kill: everything before it was yielded


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file; a torn line is skipped."""
    return (r for r in _jsonl_records(path) if r is not None)


class RunDirError(RuntimeError):
    """The run directory cannot be created or written; the message says why and what to do."""


def _unusable(path: Path, err: OSError) -> RunDirError:
    """The one-paragraph error for a run directory that `err` kept from being created or written."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is None:
        why = f"it is not writable ({err.strerror or err})"
    else:
        why = "it is a file" if blocker == path else f"{blocker} is a file"
    return RunDirError(
        f"cannot use {path} as the run directory: {why}. Give --run-dir a writable directory (it is created "
        "if missing), or move what is in the way."
    )


class RunDir:
    def __init__(self, path: str | Path, writer: bool = True) -> None:
        self.path = Path(path)
        self.writer = writer
        self.config_file = self.path / "config.json"
        self.metrics_file = self.path / "metrics.jsonl"
        self.rollouts_file = self.path / "rollouts.jsonl.gz"
        self.events_file = self.path / "events.jsonl"
        self.status_file = self.path / "status.json"
        self.summary_file = self.path / "summary.json"
        self.checkpoints = self.path / "checkpoints"
        self.final_dir = self.path / "final"
        if writer:
            probe = self.path / f".write-probe-{os.getpid()}"
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                self.checkpoints.mkdir(exist_ok=True)
                probe.touch()
                probe.unlink()
            except OSError as err:
                raise _unusable(self.path, err) from None

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        if not self.writer:
            return
        with open(path, "a") as f:
            f.write(dumps(record) + "\n")
            f.flush()

    def write_config(self, config: dict[str, Any]) -> None:
        if self.writer:
            atomic_write_text(self.config_file, json.dumps(config, indent=2) + "\n")

    def append_metrics(self, record: dict[str, Any]) -> None:
        self._append(self.metrics_file, record)

    def event(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        record = {"time": time.time(), "step": step, "kind": kind, **fields}
        self._append(self.events_file, record)
        return record

    def append_rollouts(self, records: list[dict[str, Any]]) -> None:
        if not self.writer or not records:
            return
        with gzip.open(self.rollouts_file, "at") as f:
            for r in records:
                f.write(dumps(r) + "\n")

    def write_status(self, **fields: Any) -> None:
        if not self.writer:
            return
        current = read_json(self.status_file) or {}
        current.update(fields, updated=time.time(), host=socket.gethostname())
        atomic_write_text(self.status_file, dumps(current) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.writer:
            atomic_write_text(self.summary_file, json.dumps(_clean(summary), indent=2) + "\n")

    def truncate_after(self, step: int) -> tuple[int, int]:
        """Drop metrics and rollouts recorded for steps after `step` (they will be redone on resume), and
        torn metric lines. Returns (metric lines dropped, how many of them were torn)."""
        if not self.writer:
            return 0, 0
        dropped = torn = 0
        if self.metrics_file.exists():
            records = list(_jsonl_records(self.metrics_file))
            kept = [r for r in records if r is not None and int(r.get("step", -1)) <= step]
            dropped, torn = len(records) - len(kept), records.count(None)
            atomic_write_text(self.metrics_file, "".join(dumps(r) + "\n" for r in kept))
        if self.rollouts_file.exists():
            kept = [r for r in read_jsonl(self.rollouts_file) if int(r.get("step", -1)) <= step]
            tmp = self.rollouts_file.with_name(".rollouts.tmp.gz")
            with gzip.open(tmp, "wt") as f:
                f.writelines(dumps(r) + "\n" for r in kept)
            os.replace(tmp, self.rollouts_file)
        return dropped, torn

    def sync_metrics(self) -> None:
        """fsync metrics.jsonl. Called before a checkpoint commits, so a checkpoint that survives a power loss
        has every metric line up to its step: a torn line is then always a step the resume redoes."""
        if self.writer and self.metrics_file.exists():
            with open(self.metrics_file, "rb") as f:
                os.fsync(f.fileno())

    def metrics(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.metrics_file))

    def events(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.events_file))
