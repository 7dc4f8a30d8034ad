"""Where per-step metrics go besides metrics.jsonl (the console, TensorBoard, Weights & Biases), and the one
progress bar layout (`make_progress`) that training, eval and the demo show. Resumed runs continue the same
curves: TensorBoard purges events after the restored step, W&B resumes the run id stored in the run dir.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

CONSOLE_KEYS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.3f}"),
    ("format_rate", "fmt", "{:.2f}"),
    ("entropy", "ent", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("grad_norm", "gn", "{:.3f}"),
    ("eval/accuracy", "eval_acc", "{:.3f}"),
    ("time/step_s", "s/step", "{:.2f}"),
)


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def format_metrics(metrics: dict[str, Any]) -> str:
    parts = []
    for key, short, fmt in CONSOLE_KEYS:
        value = metrics.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{short} {fmt.format(value)}")
    return "  ".join(parts)


def make_console(*, stderr: bool = False, highlight: bool = True) -> Console:
    """A rich Console, at least 120 columns wide off a terminal (where rich would wrap every line at 80)."""
    console = Console(stderr=stderr, highlight=highlight)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    return console


def make_progress(console: Console, transient: bool = False) -> Progress:
    """The progress bar: bold label, bar, done/total, elapsed, eta, and a free-text field `info`."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=console, transient=transient,
    )  # fmt: skip


class ProgressBar:
    """`with ProgressBar(console, label, total) as advance:` then `advance(k, info)` per k units done: a bar
    on a terminal, else a line every tenth of the way (a transient one vanishes when done, prints nothing)."""

    def __init__(
        self, console: Console, label: str, total: int, info: str = "", transient: bool = False
    ) -> None:
        self.console, self.label, self.total, self.transient = console, label, total, transient
        self.done, self.started = 0, time.time()
        self.progress = make_progress(console, transient) if console.is_terminal else None
        if self.progress is not None:
            self.task = self.progress.add_task(label, total=total, info=info)

    def advance(self, k: int = 1, info: str | None = None) -> None:
        self.done += k
        every = max(1, self.total // 10)
        if self.progress is not None:
            self.progress.update(self.task, advance=k, **({} if info is None else {"info": info}))
        elif not self.transient and (
            self.done // every > (self.done - k) // every or self.done == self.total
        ):
            elapsed = time.time() - self.started
            eta = elapsed / self.done * (self.total - self.done)
            self.console.print(
                f"{self.label} {self.done}/{self.total}  {elapsed:.0f}s elapsed, eta {eta:.0f}s  {info or ''}"
            )

    def __enter__(self) -> Callable[..., None]:
        if self.progress is not None:
            self.progress.start()
        return self.advance

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


class ConsoleSink:
    """A progress bar with ETA on a terminal; plain lines (every `every` steps) otherwise."""

    def __init__(
        self, total_steps: int, start_step: int, every: int, progress: bool, description: str = "train"
    ) -> None:
        self.every = every
        self.console = make_console(stderr=True)
        self.live = progress and sys.stderr.isatty()
        self.progress: Progress | None = None
        if self.live:
            self.progress = make_progress(self.console)
            self.progress.start()
            self.task_id = self.progress.add_task(
                description, total=total_steps, completed=start_step, info=""
            )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        line = format_metrics(metrics)
        if self.progress is not None:
            self.progress.update(self.task_id, completed=step, info=line)
        elif step % self.every == 0 or "eval/accuracy" in metrics:
            self.console.print(f"step {step:>5}  {line}", highlight=False)

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class TensorBoardSink:
    def __init__(self, log_dir: Path, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events written after the restored step by the interrupted attempt
        self.writer = SummaryWriter(
            log_dir=str(log_dir), purge_step=resume_step + 1 if resume_step > 0 else None
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and key not in ("step", "time")
            ):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        import wandb

        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else wandb.util.generate_id()
        id_file.write_text(run_id)
        self.run = wandb.init(project=project, id=run_id, resume="allow", dir=str(run_dir), config=config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in metrics.items() if k not in ("step", "time")}, step=step)

    def close(self) -> None:
        self.run.finish()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
