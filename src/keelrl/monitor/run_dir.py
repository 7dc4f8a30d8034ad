"""The run directory contract (DESIGN.md): one place that knows every file's name and format.

    config.json          resolved config
    metrics.jsonl        one JSON object per step: {"step": int, "time": float, ...}
    rollouts.jsonl.gz    sampled traces (one gzip member appended per step)
    events.jsonl         restarts, rollbacks, skips, checkpoints, faults, with reasons
    status.json          live: state, step, pids, restarts, last checkpoint, heartbeat
    checkpoints/         step_XXXXXXXX/ directories and a `latest` symlink
    final/               the final policy as a standard HF directory
    summary.json         written at the end

Only the writer (rank 0) writes. Small files are replaced atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (a writer killed mid-write) is skipped."""
    if not path.exists():
        return
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
    except (EOFError, gzip.BadGzipFile):
        return  # a gzip member cut short by a kill: everything before it was yielded


class RunDir:
    def __init__(self, path: str | Path, writer: bool = True) -> None:
        self.path = Path(path)
        self.writer = writer
        if writer:
            self.path.mkdir(parents=True, exist_ok=True)
            self.checkpoints.mkdir(exist_ok=True)

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def rollouts_file(self) -> Path:
        return self.path / "rollouts.jsonl.gz"

    @property
    def events_file(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final_dir(self) -> Path:
        return self.path / "final"

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
        current = self.read_status()
        current.update(fields, updated=time.time())
        atomic_write_text(self.status_file, dumps(current) + "\n")

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.writer:
            atomic_write_text(self.summary_file, json.dumps(_clean(summary), indent=2) + "\n")

    def truncate_after(self, step: int) -> int:
        """Drop metrics and rollouts of steps after `step` (redone on resume); returns the lines dropped."""
        if not self.writer:
            return 0
        dropped = 0
        if self.metrics_file.exists():
            kept = []
            for rec in read_jsonl(self.metrics_file):
                if int(rec.get("step", -1)) <= step:
                    kept.append(rec)
                else:
                    dropped += 1
            atomic_write_text(self.metrics_file, "".join(dumps(r) + "\n" for r in kept))
        if self.rollouts_file.exists():
            kept_r = [r for r in read_jsonl(self.rollouts_file) if int(r.get("step", -1)) <= step]
            tmp = self.rollouts_file.with_name(".rollouts.tmp.gz")
            with gzip.open(tmp, "wt") as f:
                for r in kept_r:
                    f.write(dumps(r) + "\n")
            os.replace(tmp, self.rollouts_file)
        return dropped

    def metrics(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.metrics_file))

    def events(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.events_file))
