"""Where per-step metrics go besides metrics.jsonl: the console (the experiment trackers, TensorBoard, W&B
and MLflow, are in trackers.py), the one progress bar layout (`make_progress`) that training, eval and the
demo show, and what the supervisor shows on its terminal (`Terminal`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
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

RL_KEYS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.3f}"),
    ("format_rate", "fmt", "{:.2f}"),
    ("entropy", "ent", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
)
LOSS = ("loss/total", "loss", "{:.4f}")
# the end of every line: gradient norm, evals, time
TAIL = (
    ("grad_norm", "gn", "{:.3f}"),
    ("eval/accuracy", "eval_acc", "{:.3f}"),
    ("eval/loss", "eval_loss", "{:.4f}"),
    ("time/step_s", "s/step", "{:.2f}"),
)
# What a step's console line shows, by train.stage: (metric, short name, format), each when the step has it
CONSOLE_KEYS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "rl": (*RL_KEYS, *TAIL),
    "selfplay": (*RL_KEYS[:2], ("selfplay/valid_frac", "valid", "{:.2f}"), *RL_KEYS[2:], *TAIL),
    "sft": (LOSS, *TAIL),
    "rm": (LOSS, ("rm/accuracy", "acc", "{:.3f}"), ("rm/margin", "margin", "{:.3f}"), *TAIL),
}


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def describe_event(kind: str, step: int, fields: dict[str, Any]) -> str:
    """An event as a line people read: `step N kind (rule): its message (other fields) What to do: ...`; tables
    (a guard's evidence, a curriculum cursor) stay in events.jsonl."""
    shown = {k: v for k, v in fields.items() if k not in ("message", "suggestion", "rule")}
    details = ", ".join(
        f"{k.replace('_', ' ')} {f'{v:.4g}' if isinstance(v, float) else v}"
        for k, v in shown.items()
        if not isinstance(v, dict | list)
    )
    text = f"step {step} {kind.replace('_', ' ')}" + (f" ({fields['rule']})" if "rule" in fields else "")
    if "message" in fields:
        text += f": {fields['message']}" + (f" ({details})" if details else "")
    elif details:
        text += f": {details}"
    return text + (f" What to do: {fields['suggestion']}" if fields.get("suggestion") else "")


def make_console(*, stderr: bool = False, highlight: bool = True) -> Console:
    """A rich Console, at least 120 columns wide off a terminal (where rich would wrap every line at 80)."""
    console = Console(stderr=stderr, highlight=highlight)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    return console


def make_progress(console: Console, transient: bool = False) -> Progress:
    """The progress bar, as wide as the terminal: bold label, bar, done/total, elapsed, eta, and a free-text
    field `info`."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(bar_width=None), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=console, transient=transient, expand=True,
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


def say(text: str, err: bool = False) -> bool:
    """Write a line to stdout (stderr) now; False when its reader has gone away (`| head`): the stream then
    writes to /dev/null (`silence`), so nothing fails later."""
    stream = sys.stderr if err else sys.stdout
    try:
        stream.write(text + "\n")
        stream.flush()
        return True
    except BrokenPipeError:
        return silence(stream)


def silence(stream: Any) -> bool:
    """Point `stream`'s file descriptor at /dev/null: what is still buffered and all that follows goes nowhere,
    instead of a second BrokenPipeError when it is flushed (at exit: a traceback). Returns False."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    return False


class Terminal:
    """The run as people watch it (a Sink): a line per `every` steps and at every eval with the stage's figures
    (`CONSOLE_KEYS[label]`), and every line `say` is given (events as sentences; under the supervisor, the
    worker's output), on stdout (`err=True`: stderr); on a terminal a progress bar of `total` steps under them, as
    wide as the terminal. Off a terminal (a pipe, a file, the supervisor's pipe) plain lines, flushed one by one.
    A reader that goes away (`| head`) ends the lines, not the run (the run directory keeps everything)."""

    def __init__(
        self, total: int, start: int = 0, label: str = "rl", bar: bool = True, every: int = 1
    ) -> None:
        console = make_console()
        self.every, self.keys = every, CONSOLE_KEYS.get(label, CONSOLE_KEYS["rl"])
        self.progress = make_progress(console) if bar and total and console.is_terminal else None
        if self.progress is not None:
            self.task_id = self.progress.add_task(label, total=total, completed=start, info="")
            self.progress.start()
        self.lock, self.gone = threading.Lock(), False

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.advance_to(step)
        if step % self.every == 0 or any(k.startswith("eval/") for k in metrics):
            shown = [
                f"{name} {fmt.format(metrics[k])}"
                for k, name, fmt in self.keys
                if isinstance(metrics.get(k), float | int)
            ]
            self.say(f"step {step:>5}  " + "  ".join(shown))

    def say(self, text: str, err: bool = False) -> None:
        with self.lock:
            if self.gone:
                return
            if self.progress is None:
                self.gone = not say(text, err)
                return
            try:  # above the bar, wrapped by the terminal
                self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
            except BrokenPipeError:
                self.gone = not silence(sys.stdout)

    def advance_to(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task_id, completed=step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
