"""Task directories: users' own SWE-style tasks in Harbor's layout, run as environments in keelrl's sandbox.

`task.name = "dir:PATH"`. PATH is one task directory, or a folder whose subfolders are task directories (a
data set). A task directory holds:

    instruction.md        the task, given to the model as the user turn
    task.toml             optional: [verifier] timeout_sec (default 60), [metadata] difficulty (the bucket)
    environment/          the repository: text files only (no container image is built or needed)
    tests/test.sh         the verifier, with any files it needs beside it in tests/

An episode works on a private copy of `environment/` (tasks/repo.py's `Workspace`: in memory, materialised
only inside the sandbox) with the same tools as `swe_mini`: list_files, read_file, replace_in_file,
write_file, and run_tests, which runs the working copy's own `test_*.py` files, if any. The episode ends at a
turn without a tool call or at a budget. Then the verifier runs once, in the sandbox (time, memory, process
and output limits, no network, nothing writable outside its private directory): the working copy is
materialised as `app/`, `tests/` is copied in beside it only now, and `bash tests/test.sh` runs with `app/`
as its working directory and `$APP_DIR`, `$TESTS_DIR` and `$REWARD_FILE` set. Reward (Harbor's
reward.txt convention): the number test.sh wrote to `$REWARD_FILE` if it wrote one, else 1.0 if it exited
0 and 0.0 otherwise; `correct` is reward >= 1. A sandbox that keeps failing (its fault, not the task's) makes
`finish` raise, as the code task's scoring does (`SandboxFailures`).

What is guaranteed: the model never sees the tests (they are not in the working copy, and list_files and
read_file see only the working copy), cannot edit them (they are copied in fresh after the episode), and
nothing it writes leaves the sandbox. Not defended: test.sh runs the repository's code, and that code runs
with test.sh's environment, so it can write `$REWARD_FILE` or make a test runner pass (a `conftest.py`).
Verifiers that must resist this should judge from outside the process under test, as swe_mini does
(its hidden tests compare return values in the trainer's process).

Splits: a data set's tasks are split by a hash of the folder name (`task.params.test_fraction`), so adding
a task never moves another; a single task directory serves both splits (there is nothing to hold out).
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from keelrl.sandbox.pool import SandboxPool
from keelrl.sandbox.result import Call, SandboxLimits
from keelrl.seeds import stable_hash
from keelrl.tasks.base import Score, Split, TaskParams, in_test_split, unknown_bucket
from keelrl.tasks.code import SandboxFailures, shared_pool
from keelrl.tasks.env import EpisodeState, Message, StepResult
from keelrl.tasks.repo import Workspace, run_visible_tests, sandbox_job, workspace_tools
from keelrl.tasks.tools import run_tool_calls

SYSTEM = (
    "You are working in a repository. Use the tools to look at the files, change them, and run the "
    "repository's tests. When the task is done, reply without a tool call."
)
VERIFY_ENTRY = "_keel_verify"
VERIFY_PROGRAM = f"""
def {VERIFY_ENTRY}(tests, timeout):
    import os, subprocess
    app = os.getcwd()
    work = os.path.dirname(app)
    tests_dir, logs = os.path.join(work, "tests"), os.path.join(work, "logs", "verifier")
    os.makedirs(logs, exist_ok=True)
    for path, text in tests.items():
        full = os.path.join(tests_dir, *path.split("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    reward_file = os.path.join(logs, "reward.txt")
    env = dict(os.environ, APP_DIR=app, TESTS_DIR=tests_dir, REWARD_FILE=reward_file)
    try:
        done = subprocess.run(["bash", os.path.join(tests_dir, "test.sh")], cwd=app, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        code, out = done.returncode, (done.stdout + done.stderr)[-1500:].decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        code, out = None, "test.sh timed out"
    reward = None
    if os.path.exists(reward_file):
        with open(reward_file, encoding="utf-8", errors="replace") as f:
            reward = f.read(200)
    return {{"exit": code, "reward": reward, "output": out}}
"""


class TaskDirParams(TaskParams):
    test_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="Share of a data set's tasks held out for the test split (by name)."
    )
    memory_mb: int = Field(1024, ge=64, description="Address-space limit per process of a verifier run (MB).")
    max_processes: int = Field(64, ge=4, description="Processes a verifier run may have (bash, python, ...).")
    isolation: Literal["auto", "bwrap", "unshare", "rlimit"] = Field(
        "auto",
        description="Sandbox isolation: auto picks the strongest available (bwrap > unshare > rlimit).",
    )
    workers: int = Field(0, ge=0, description="Sandboxes run at once; 0 means one per CPU.")


class TaskDirError(ValueError):
    """A task directory that does not have Harbor's layout, or holds what keelrl cannot run."""


def _read_tree(root: Path, what: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            try:
                files[rel] = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise TaskDirError(f"{p}: {what} may hold text files only (this one is not UTF-8)") from None
    return files


def load_task_dir(path: Path) -> dict[str, Any]:
    """One task directory -> {"name", "instruction", "files", "tests", "timeout_s", "difficulty"}."""
    missing = [p for p in ("instruction.md", "environment", "tests/test.sh") if not (path / p).exists()]
    if missing:
        raise TaskDirError(
            f"{path} is not a task directory: it lacks {', '.join(missing)} (a task directory holds "
            "instruction.md, environment/, tests/test.sh and optionally task.toml)"
        )
    meta: dict[str, Any] = {}
    if (path / "task.toml").exists():
        try:
            meta = tomllib.loads((path / "task.toml").read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise TaskDirError(f"{path / 'task.toml'}: {err}") from None
    timeout = meta.get("verifier", {}).get("timeout_sec", 60.0)
    if not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise TaskDirError(
            f"{path / 'task.toml'}: [verifier] timeout_sec must be a number of seconds in (0, 3600]"
        )
    return {
        "name": path.name,
        "instruction": (path / "instruction.md").read_text(encoding="utf-8"),
        "files": _read_tree(path / "environment", "environment/"),
        "tests": _read_tree(path / "tests", "tests/"),
        "timeout_s": float(timeout),
        "difficulty": str(meta.get("metadata", {}).get("difficulty", "all")),
    }


class TaskDirs:
    """Harbor-layout task directories as an environment; see the module docstring."""

    def __init__(self, path: str, seed: int = 0, **params: Any) -> None:
        self.seed, self.params = seed, TaskDirParams(**params)
        root = Path(path).expanduser()
        if not root.is_dir():
            raise TaskDirError(f"task dir {path!r} does not exist (task.name = 'dir:PATH')")
        single = (root / "instruction.md").exists()
        dirs = [root] if single else sorted(p for p in root.iterdir() if p.is_dir())
        if not dirs:
            raise TaskDirError(f"{root} holds no task directories")
        self.name = f"dir:{root.name}"
        self.tasks = {d.name: load_task_dir(d) for d in dirs}
        names = sorted(self.tasks)
        self.splits: dict[str, list[str]] = {
            s: [
                n
                for n in names
                if single or in_test_split(n, seed, self.params.test_fraction) == (s == "test")
            ]
            for s in ("train", "test")
        }
        for split, items in self.splits.items():
            if not items:
                raise TaskDirError(
                    f"{root}: the {split} split is empty ({len(names)} tasks, test_fraction "
                    f"{self.params.test_fraction}); add tasks or change test_fraction"
                )
        self.tools = workspace_tools(None, None)
        self._failures = SandboxFailures(self.name)

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return self._pick(self.splits[split], index, split)

    def difficulty(self, problem: dict[str, Any]) -> str:
        return self.tasks[problem["task"]]["difficulty"]

    def buckets(self) -> list[str]:
        return sorted({self.tasks[n]["difficulty"] for n in self.splits["train"]})

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        if bucket not in self.buckets():
            raise unknown_bucket(self.name, bucket, self.buckets())
        items = [n for n in self.splits[split] if self.tasks[n]["difficulty"] == bucket]
        if not items:
            raise ValueError(f"task {self.name}: the {split} split has no task of difficulty {bucket!r}")
        return self._pick(items, index, split, bucket)

    def _pick(self, names: list[str], index: int, *key: str) -> dict[str, Any]:
        epoch, pos = divmod(index, len(names))
        order = list(range(len(names)))
        random.Random(stable_hash("taskdir", self.seed, *key, epoch)).shuffle(order)
        return {"task": names[order[pos]]}

    def pool(self) -> SandboxPool:
        return shared_pool(self.params.isolation, self.params.workers)

    def reset(self, problem: dict[str, Any], seed: int) -> list[Message]:
        task = self.tasks[problem["task"]]
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["instruction"]}]

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        if "workspace" not in state.scratch:
            state.scratch["workspace"] = Workspace(self.tasks[state.problem["task"]]["files"])
        ws = state.scratch["workspace"]
        tools = workspace_tools(ws, lambda: run_visible_tests(ws.files, self.pool(), self.limits(30.0)))
        replies = run_tool_calls(assistant_turn, tools)
        info = {"tool_calls": replies.calls, "tool_errors": replies.errors}
        return StepResult(replies.messages, done=replies.calls == 0, info=info)

    def limits(self, wall_s: float) -> SandboxLimits:
        p = self.params
        return SandboxLimits(wall_s=wall_s, memory_mb=p.memory_mb, processes=p.max_processes, tmp_mb=256)

    def finish(self, state: EpisodeState) -> Score:
        """Run tests/test.sh on the working copy in the sandbox (the module docstring says how it is read)."""
        task = self.tasks[state.problem["task"]]
        ws = state.scratch.get("workspace")
        files = ws.files if ws is not None else task["files"]
        timeout = task["timeout_s"]
        call = Call(f"{task['tests']!r}, {timeout!r}")
        job = sandbox_job(files, VERIFY_PROGRAM, VERIFY_ENTRY, [call], self.limits(timeout + 10.0))
        result = self.pool().submit(job).result()
        self._failures.observe(result)
        return verdict(result, task["name"])


def verdict(result: Any, name: str) -> Score:
    """The verifier run's Score (reward file, else exit status)."""
    answer = result.answers[0] if result.answers else None
    if result.status != "ok" or answer is None or answer.kind != "value":
        detail = answer.text if answer is not None else result.detail
        return Score(
            0.0,
            False,
            {"formatted": True, "reason": f"verifier_{result.status}", "detail": str(detail)[:300]},
        )
    out = json.loads(answer.text)
    info: dict[str, Any] = {
        "formatted": True,
        "exit": out["exit"],
        "output": str(out["output"])[-300:],
        "task": name,
    }
    if out["reward"] is not None:
        try:
            reward = float(out["reward"].strip())
        except ValueError:
            return Score(0.0, False, {**info, "reason": "bad_reward_file", "reward_text": out["reward"][:50]})
        if not math.isfinite(reward):
            return Score(0.0, False, {**info, "reason": "bad_reward_file", "reward_text": out["reward"][:50]})
        return Score(reward, reward >= 1.0, {**info, "reason": "reward_file"})
    passed = out["exit"] == 0
    return Score(1.0 if passed else 0.0, passed, {**info, "reason": "passed" if passed else "failed"})
