"""Terminal tasks: the environment over a set of tasks whose episodes run commands in a box, whatever their
format. A format (tasks/harbor.py's task directories, tasks/swebench.py's instances) loads its tasks (`Item`s) and
says three things (`Format`): the box a task starts from, how its verifier judges a box, and what its oracle does;
`Terminal` does the rest, the same for both.

An episode runs in a box (sandbox/boxes.py: a container, or bubblewrap over the host's programs, as [sandbox]
backend says), started at its first tool call (or at `finish` when it makes none) and removed at `close`. Tools,
each run in the episode's box as the task's agent user:
- shell(command): `bash -c` in the working directory under `shell_timeout_s`: the exit status, stdout and stderr
  (`tasks/tools.py` cuts a reply to MAX_RESULT_CHARS);
- read_file(path), write_file(path, content), replace_in_file(path, old, new), list_files(path): `path` is
  relative to the working directory or absolute inside it (`/app/src/x.py`); anything else is refused with a
  message saying where the file tools work (the shell reaches the rest).
A turn without a tool call ends the episode. The agent's commands have the network only with [sandbox]
agent_network (and then as the task allows its agent); the verifier and the oracle get the task's. An episode that
runs past the task's agent timeout ([agent] timeout_sec) from its start ends there with status "timeout" (its
commands are cut at the time left); a box that cannot start makes `step` raise (status "agent_error",
rollout/multiturn.py) or `finish` return "agent_error"; a verifier that cannot judge is "verifier_error".

A set is split by a hash of each task's name (adding a task never moves another), filtered by the tasks' metadata
(`where`), and validated before training (`validate_set`): each task's oracle runs once, cached by a hash of the
task and the backend, and tasks whose oracle does not score 1 are left out with a count and the reason
(`keep_failing` keeps them), because many published verifiers write a reward of 0 when they cannot install their
test runner offline. `keelrl tasks check` (tasks/check.py) runs `oracle` and `untouched` on each task.
"""

from __future__ import annotations

import json
import logging
import math
import os
import posixpath
import re
import shlex
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from keelrl.core.seeds import stable_hash
from keelrl.sandbox.boxes import Backend, Box, BoxError, BoxSpec, Ran, backend_for, start_box
from keelrl.sandbox.config import SandboxConfig
from keelrl.tasks import TaskError
from keelrl.tasks.base import Score, Split, TaskParams, check_bucket, in_test_split, shuffled_pick, unscored
from keelrl.tasks.env import EpisodeState, ResetResult, StepResult
from keelrl.tasks.repo import replace_once
from keelrl.tasks.tools import OPEN_TAG, Tool, run_tool_calls, tool, used_tools

logger = logging.getLogger("keelrl.tasks")
SYSTEM = (
    "You are working in a Linux environment, in the directory {workdir}. Use the tools to look around, run "
    "commands, and change files. When the task is done, reply without a tool call."
)


class TaskDirError(TaskError):
    """A task (directory or instance) that does not have its format's layout, or holds what keelrl cannot run."""


class TerminalParams(TaskParams):
    shell_timeout_s: float = Field(60.0, gt=0, le=3600, description="Time limit of one shell tool call (s).")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of a set's tasks held out, by name.")
    where: dict[str, Any] = Field(
        default_factory=dict,
        description="Keep the tasks whose metadata matches, e.g. {difficulty = 'easy', tags = 'python'}: a list "
        "value matches any of its items; a list-valued field (tags) matches when it holds one.",
    )
    validate_oracle: bool = Field(
        True,
        description="Before training, run each task's oracle once (cached by the task's hash) and leave out the tasks "
        "it does not solve (reward 1).",
    )
    keep_failing: bool = Field(False, description="Keep tasks whose oracle does not score 1 (reported).")
    workers: int = Field(2, ge=1, description="Oracle runs at once when validating.")
    brief: bool = Field(
        False, description="Open with the task alone: no system text or tool list (tiny models)."
    )


class Item(Protocol):
    """What the environment reads of one task (harbor.HarborTask, swebench.Instance), attributes or properties."""

    prompt: str  # the episode's user turn
    workdir: str
    meta: Mapping[str, Any]  # what `where` filters on
    bucket: str  # the difficulty bucket
    nets: tuple[bool, bool]  # the network the task gives its agent, and its verifier
    agent_timeout: float | None  # a training episode's limit (s)
    agent_user: str | None
    fingerprint: str  # changes when the task does


class Format(Protocol):
    """A task format: its tasks by name, those that did not load (name -> why), and three hooks."""

    label: str
    items: dict[str, Any]
    excluded: dict[str, str]
    single: bool  # one task: it serves both splits

    def spec(self, item: Any, backend: Backend) -> BoxSpec: ...  # the box the task starts from
    def verify(self, item: Any, box: Box, formatted: bool) -> Score: ...  # BoxError: a verifier_error
    def solve(self, item: Any, box: Box) -> Score | None: ...  # the oracle's actions; a Score ends it early


def resolve_env(env: Mapping[str, Any], where: str) -> dict[str, str]:
    """Values with `${VAR}` / `${VAR:-default}` taken from this process's environment (Harbor's templates)."""

    def sub(m: re.Match[str]) -> str:
        if m[1] in os.environ or m[2] is not None:
            return os.environ.get(m[1], m[2] or "")
        raise BoxError(f"{where} needs the environment variable {m[1]}, which is not set")

    return {str(k): re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", sub, str(v)) for k, v in env.items()}


def missing_program(output: str) -> str | None:
    """The program or Python module a failed command says it could not find, if any."""
    m = re.search(r"(?:^|\s)([\w./+-]+): (?:command )?not found|No module named '?([\w.]+)", output, re.M)
    return (m[1] or m[2]) if m else None


# ------------------------------------------------------------------------------------------ tools


def resolve_path(path: object, workdir: str) -> str:
    """`path` as an absolute path inside `workdir`; a ValueError saying where the file tools work otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"a path is a non-empty string, relative to {workdir} or absolute inside it")
    workdir = posixpath.normpath(workdir)  # `/app/` is `/app`
    p = posixpath.normpath(posixpath.join(workdir, path.strip()))
    if p != workdir and not p.startswith(workdir.rstrip("/") + "/"):
        raise ValueError(
            f"{path!r} is outside the working tree {workdir}: the file tools work under {workdir} "
            "(use the shell tool for other paths)"
        )
    return p


def shell_text(ran: Ran, limit: float) -> str:
    head = f"exit status {ran.code}"
    if ran.timed_out(limit):
        head = f"timed out after {round(limit, 1):g} s (killed)"
    parts = [f"{name}:\n{text}" for name, text in (("stdout", ran.stdout), ("stderr", ran.stderr)) if text.strip()]  # fmt: skip
    return "\n".join([head, *parts])


def terminal_tools(get: Callable[[], Box] | None, workdir: str, timeout: float, user: str | None = None) -> list[Tool]:  # fmt: skip
    """shell, read_file, write_file, replace_in_file, list_files bound to the box `get()` returns, run as `user`;
    with None, placeholders that only carry the schemas (an environment's `tools`)."""

    def run(command: str, stdin: bytes | None = None, limit: float = 60.0) -> Ran:
        if get is None:
            raise ValueError("no box is bound to this tool")
        return get().exec(command, timeout=min(limit, timeout), stdin=stdin, user=user)

    def read(path: str) -> tuple[str, str]:
        p = resolve_path(path, workdir)
        ran = run(f"cat -- {shlex.quote(p)}")
        if ran.code != 0:
            raise ValueError(ran.stderr.strip() or f"cannot read {p}")
        try:
            return p, ran.out.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{p} is not a text file (use the shell tool)") from None

    def write(p: str, content: str) -> str:
        q = shlex.quote(p)
        ran = run(f'mkdir -p -- "$(dirname -- {q})" && cat > {q}', stdin=content.encode())
        if ran.code != 0:
            raise ValueError(ran.stderr.strip() or f"cannot write {p}")
        return f"wrote {p} ({len(content.splitlines())} lines)"

    def shell(command: str) -> str:
        """Run a shell command (bash) in the working directory; shows its exit status, stdout and stderr."""
        return shell_text(run(command, limit=timeout), timeout)

    def read_file(path: str) -> str:
        """Show a file's exact text. path: relative to the working directory, or absolute inside it."""
        return read(path)[1] or "(empty file)"

    def write_file(path: str, content: str) -> str:
        """Create a file, or replace a file's whole text, with `content`."""
        return write(resolve_path(path, workdir), content)

    def replace_in_file(path: str, old: str, new: str) -> str:
        """Edit a file: replace the text `old`, which must occur exactly once in the file, by `new`."""
        p, text = read(path)
        return write(p, replace_once(text, old, new, p))

    def list_files(path: str = ".") -> str:
        """List the files under a directory of the working tree (three levels down)."""
        q = shlex.quote(resolve_path(path, workdir))
        return run(f"find {q} -maxdepth 3 -not -path '*/.git/*' | sort | head -300").stdout or "(nothing there)"  # fmt: skip

    return [tool(f) for f in (shell, read_file, write_file, replace_in_file, list_files)]


# ------------------------------------------------------------------------------------------ the environment


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def matches(meta: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    """Whether every key of `where` matches: one of its values (a list, or one value) is one of meta's."""
    return all(any(w in _listed(meta.get(key)) for w in _listed(want)) for key, want in where.items())


class Terminal:
    """A format's tasks as an environment (see the module docstring). `items`: the tasks trained on, by name."""

    def __init__(self, fmt: Format, seed: int, params: TerminalParams, sandbox: SandboxConfig) -> None:
        self.fmt, self.seed, self.params, self.sandbox = fmt, seed, params, sandbox
        self.name, self.excluded = fmt.label, dict(fmt.excluded)
        if self.excluded:
            logger.warning("%s: %d tasks do not load: %s", self.name, len(self.excluded), self.excluded)
        self.items = {n: t for n, t in fmt.items.items() if matches(t.meta, params.where)}
        try:
            self.backend, self.rt = backend_for(sandbox)
        except BoxError as err:
            raise TaskDirError(str(err)) from None
        if params.validate_oracle and self.items:
            digests = {n: self.digest(n) for n in self.items}
            failing = validate_set(self.name, digests, self.oracle, params.workers)
            self.excluded.update(failing)
            self.items = {n: t for n, t in self.items.items() if params.keep_failing or n not in failing}
        if not self.items:
            why = "; ".join(f"{n}: {w}" for n, w in self.excluded.items()) or f"none matches where = {params.where}"  # fmt: skip
            raise TaskDirError(f"{self.name}: no task to train on ({why})")
        names = sorted(self.items)
        test = {n for n in names if fmt.single or in_test_split(n, seed, params.test_fraction)}
        self.splits = {"train": [n for n in names if fmt.single or n not in test], "test": sorted(test)}
        self.tools = terminal_tools(None, "/app", params.shell_timeout_s)

    @property
    def names(self) -> list[str]:
        return list(self.items)

    def digest(self, name: str) -> str:
        kind = self.rt.cli if self.rt is not None and self.backend == "container" else "bwrap"
        return f"{stable_hash(self.name.split(':')[0], self.items[name].fingerprint, kind):016x}"

    # the data: tasks by name, split by a hash of the name, buckets by difficulty
    def problem(self, split: Split, index: int, bucket: str | None = None) -> dict[str, Any]:
        names = [n for n in self.splits[split] if bucket is None or self.items[n].bucket == bucket]
        if not names:
            raise TaskDirError(
                f"{self.name}: the {split} split has no task{f' of difficulty {bucket!r}' if bucket else ''} "
                f"({len(self.items)} tasks in all); add tasks or change task.params.test_fraction"
            )
        return {
            "task": shuffled_pick(names, index, "taskdir", self.seed, split, *([bucket] if bucket else []))
        }

    def difficulty(self, problem: dict[str, Any]) -> str:
        return self.items[problem["task"]].bucket

    def buckets(self) -> list[str]:
        return sorted({self.items[n].bucket for n in self.splits["train"]})

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        check_bucket(self, bucket)
        return self.problem(split, index, bucket)

    # the episode
    def reset(self, problem: dict[str, Any], seed: int) -> ResetResult:
        item = self.items[problem["task"]]
        system = [] if self.params.brief else [{"role": "system", "content": SYSTEM.format(workdir=item.workdir)}]  # fmt: skip
        return ResetResult(
            [*system, {"role": "user", "content": item.prompt}], {"start": time.perf_counter()}
        )

    def time_left(self, state: EpisodeState) -> float:
        limit = self.items[state.problem["task"]].agent_timeout
        return math.inf if limit is None else limit - (time.perf_counter() - state.scratch["start"])

    def box(self, state: EpisodeState) -> Box:
        """The episode's box, started on first use (its start time kept for `container_s`)."""
        if "box" not in state.scratch:
            item, t0 = self.items[state.problem["task"]], time.perf_counter()
            state.scratch["box"] = self.open(item, self.sandbox.agent_network and item.nets[0])
            state.scratch["box_t0"] = t0
        return state.scratch["box"]

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        item, left = self.items[state.problem["task"]], self.time_left(state)
        if left <= 0:
            return StepResult([], done=True)
        if OPEN_TAG in assistant_turn:
            self.box(state)  # a box that cannot start ends the episode (agent_error), not as a tool error
        limit = min(self.params.shell_timeout_s, left)
        tools = terminal_tools(lambda: self.box(state), item.workdir, limit, item.agent_user)
        return run_tool_calls(assistant_turn, tools).step_result()

    def finish(self, state: EpisodeState) -> Score:
        item = self.items[state.problem["task"]]
        if self.time_left(state) <= 0:
            why = f"the episode ran past the task's agent timeout ([agent] timeout_sec = {item.agent_timeout:g} s)"
            return unscored("timeout", "agent_timeout", why)
        try:
            box = self.box(state)
        except BoxError as err:
            return unscored("agent_error", "box_error", str(err))
        return self.verify(item, box, state.scratch["box_t0"], used_tools(state.infos))

    def close(self, state: EpisodeState) -> None:
        box = state.scratch.pop("box", None)
        if box is not None:
            box.close()

    # boxes, the verifier, the oracle
    def open(self, item: Any, network: bool) -> Box:
        """A started box for `item`, with the network now as `network` says and, later, as its verifier needs."""
        return start_box(self.fmt.spec(item, self.backend), self.rt, network or item.nets[1], network)

    def verify(self, item: Any, box: Box, t0: float, formatted: bool) -> Score:
        """The format's verifier on the box, with the network the task gives it; box and verifier times in info."""
        t1 = time.perf_counter()
        try:
            box.set_network(item.nets[1])
            score = self.fmt.verify(item, box, formatted)
        except BoxError as err:
            score = unscored("verifier_error", "box_error", str(err))
        score.info.update(container_s=time.perf_counter() - t0, verifier_s=time.perf_counter() - t1)
        return score

    def oracle(self, name: str) -> Score:
        """The task's oracle (harbor: solution/solve.sh; swebench: the gold patch) in a fresh box, then the verifier."""
        item = self.items[name]
        return self._scripted(item, item.nets[0], lambda box: self.fmt.solve(item, box), True)

    def untouched(self, name: str) -> Score:
        """The verifier on the environment as it starts (a good task scores 0 here)."""
        return self._scripted(self.items[name], False, lambda box: None, False)

    def _scripted(self, item: Any, network: bool, act: Callable[[Box], Score | None], formatted: bool) -> Score:  # fmt: skip
        t0 = time.perf_counter()
        try:
            box = self.open(item, network)
        except BoxError as err:
            return unscored("agent_error", "box_error", str(err))
        try:
            return act(box) or self.verify(item, box, t0, formatted)
        except BoxError as err:
            return unscored("agent_error", "box_error", str(err))
        finally:
            box.close()


# ------------------------------------------------------------------------------------------ validation


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "keelrl"


def validate_set(label: str, digests: Mapping[str, str], oracle: Callable[[str], Score], workers: int) -> dict[str, str]:  # fmt: skip
    """Each task's oracle outcome (cached in cache_dir()/oracle by its digest); {name: why} of those not scoring 1."""
    folder = cache_dir() / "oracle"
    folder.mkdir(parents=True, exist_ok=True)

    def one(name: str) -> str | None:
        path = folder / f"{digests[name]}.json"
        if path.exists():
            rec = json.loads(path.read_text())
        else:
            s = oracle(name)
            rec = {"status": s.status, "reward": s.reward if s.status == "ok" else None, "error": s.info.get("error", "")}  # fmt: skip
            # a box that did not start says nothing of the task: try it next time
            if s.status != "agent_error":
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(rec))
                tmp.replace(path)
        if rec["status"] == "ok" and rec["reward"] >= 1.0:
            return None
        got = f", reward {rec['reward']:g}" if rec["reward"] is not None else f": {rec['error']}"
        return f"oracle {rec['status']}{got}"

    with ThreadPoolExecutor(workers) as pool:
        why = dict(zip(digests, pool.map(one, digests)))
    failing = {n: w for n, w in why.items() if w}
    if failing:
        logger.warning("%s: the oracle does not solve %d of %d tasks: %s", label, len(failing), len(digests),
                       "; ".join(f"{n} ({w})" for n, w in failing.items()))  # fmt: skip
    return failing
