"""Harbor task directories (`task.name = "dir:PATH"`): the format of Terminal-Bench 2 and of the `harbor` framework,
run as published. PATH is one task directory or a folder of them (a task set). A task directory holds:

    instruction.md          the task, the episode's user turn
    task.toml               [metadata] (difficulty, tags, ...), [verifier] timeout_sec / env / user / network_mode,
                            [agent] timeout_sec / user / network_mode, [environment] docker_image / cpus / memory_mb
                            or memory = "2G" / storage_mb or storage / allow_internet or network_mode / env / workdir /
                            build_timeout_sec / healthcheck, [solution] env; `schema_version` or the older `version`;
                            other keys are ignored, as Harbor ignores what it does not use ([task], artifacts, ...)
    environment/Dockerfile  the build context of the task's image (the final image's WORKDIR is the working
                            directory, unless [environment] workdir says otherwise; else /app)
    tests/test.sh           the verifier, with the files it needs beside it in tests/ (test_outputs.py, ...)
    solution/solve.sh       the oracle (optional; without it the task cannot be validated)

An episode (tasks/terminal.py) works in its own box: a container of the task's image ([sandbox] backend =
"container"), or bubblewrap over the host's programs with the final image's COPY and ENV steps (a multi-stage
Dockerfile's last stage and the stages it is built on) applied into the working directory and its other steps not
("bwrap", said once per task). Afterwards the verifier runs as Harbor
runs it: /tests and /logs/verifier are emptied (nothing the agent left there counts), tests/ is uploaded to /tests
(executable bits kept), test.sh is made executable and run from the working directory as [verifier] user with
[verifier] env (`${VAR}` / `${VAR:-default}` from this process's environment), under [verifier] timeout_sec, with the
verifier's network, its output going to /logs/verifier/test-stdout.txt. The reward (`read_reward`) is read as
current Harbor reads it: reward.json, an object whose "reward" is the reward and whose other numeric keys are
recorded (info["verifier_metrics"]); without that key, or without reward.json, reward.txt. The exit status never
decides the reward. Statuses (`verdict`): "ok" (a finite reward; correct = reward >= 1); "verifier_error" (no reward
file, an empty or unparseable one, a reward that is not a finite number, a verifier that timed out or could not
start, or one that wrote 0 after it could not fetch its test runner: a network failure, then the runner missing or
its installer failing, as the usual Terminal-Bench test.sh does offline: that 0 says nothing about the answer);
"agent_error" (the box did not start); "timeout" (the agent, or the oracle, ran past [agent] timeout_sec). Only "ok"
episodes reach the advantages.

Loading checks each task (`load_task`): instruction.md and tests/test.sh exist, task.toml parses and its values
have the right types (memory and memory_mb that disagree are refused, as Harbor refuses them), environment/ is not
empty unless docker_image names an image, every file can be read. It refuses, with a sentence, what keelrl cannot
honour: gpus or a TPU, an os other than linux, multi-step tasks ([[steps]]), a verifier in a separate container
([verifier] environment_mode = "separate" or [verifier.environment]), MCP servers for the agent, an
environment/docker-compose.yaml that adds services beside `main` (its settings for `main` alone are not applied,
said once), Terminal-Bench 1's task.yaml. Files are never read into the episode: any number, hidden files, binary
and large files are fine. A folder's task directories that do not load are left out with their reasons.

Not defended: test.sh runs the code under test in the same box, so a policy that plants a sitecustomize, a shim on
PATH or a patched test runner can fool a verifier that trusts them; as in Harbor, such verifiers are the task's.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from keelrl.sandbox.boxes import BASE_ENV, Backend, Box, BoxError, BoxSpec, Ran, tree_digest, warn_once
from keelrl.sandbox.config import SandboxConfig, sandbox_of
from keelrl.sandbox.dockerfile import dockerfile_steps, final_steps, heredoc_body, heredocs, split_words
from keelrl.tasks.base import Score, unscored
from keelrl.tasks.terminal import TaskDirError, Terminal, TerminalParams, missing_program, resolve_env

DEFAULT_WORKDIR = "/app"
ORACLE_TIMEOUT_S = 3600.0  # solve.sh's limit when [agent] timeout_sec is not set
# Harbor's network modes; allowlist is taken as the whole network (hosts are not filtered)
NetworkMode = Literal["public", "no-network", "allowlist"]
# a verifier that could not fetch its test runner: a network failure, then the runner missing (`uvx: command not
# found`) or its installer failing (uv's and pip's own messages, not apt's)
NETWORK_FAILED = re.compile(
    r"Could not resolve|Temporary failure (?:in name resolution|resolving)|Name or service not known|dns error|"
    r"Network is unreachable|Failed to establish a new connection|No route to host|Could not connect"
)
RUNNER_FAILED = re.compile(r"error: Failed to (?:download|fetch)|No matching distribution found")


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


class VerifierSection(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, Any] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _shared(self) -> VerifierSection:
        if self.environment_mode == "separate" or self.environment is not None:
            raise ValueError(
                "a verifier in its own container (environment_mode = 'separate') is not supported"
            )
        return self


class AgentSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)
    user: str | int | None = None
    network_mode: NetworkMode | None = None


class SolutionSection(_Section):
    env: dict[str, Any] = Field(default_factory=dict)


class Healthcheck(_Section):
    command: str
    interval_sec: float = Field(5.0, gt=0)
    timeout_sec: float = Field(30.0, gt=0)
    start_period_sec: float = Field(0.0, ge=0)
    retries: int = Field(3, ge=0)


def size_mb(text: str) -> int:
    """'2G', '512M', '1.5g', '4096k', '2 GB' -> MB (Harbor's older memory / storage strings)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*", text, re.I)
    if not m:
        raise ValueError(f"{text!r} is not a size like '2G' or '512M'")
    return int(float(m[1]) * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[m[2].upper()])


class EnvironmentSection(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, ge=16)
    storage_mb: int = Field(10240, ge=0)
    memory: str | None = None  # older: "2G"
    storage: str | None = None
    gpus: int | None = None
    tpu: dict[str, Any] | None = None
    allow_internet: bool = True  # older than network_mode, which wins where both are set
    network_mode: NetworkMode | None = None
    os: Literal["linux"] = "linux"
    env: dict[str, Any] = Field(default_factory=dict)
    workdir: str | None = None
    mcp_servers: list[Any] = Field(default_factory=list)
    healthcheck: Healthcheck | None = None

    @model_validator(mode="after")
    def _checked(self) -> EnvironmentSection:
        if self.gpus or self.tpu:
            raise ValueError(f"{'gpus' if self.gpus else 'tpu'}: keelrl's backends give a task no GPU or TPU")
        if self.mcp_servers:
            raise ValueError("MCP servers for the agent (mcp_servers) are not supported")
        for text, field in ((self.memory, "memory_mb"), (self.storage, "storage_mb")):
            if text is not None:
                mb = size_mb(text)
                if field in self.model_fields_set and getattr(self, field) != mb:
                    raise ValueError(f"{field[:-3]} = {text!r} ({mb} MB) and {field} = {getattr(self, field)} disagree")  # fmt: skip
                setattr(self, field, mb)
        return self

    @property
    def network(self) -> bool:
        return self.network_mode != "no-network" if self.network_mode else self.allow_internet


class TaskToml(_Section):
    schema_version: str = "1.0"
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)

    @model_validator(mode="before")
    @classmethod
    def _older(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("steps"):
                raise ValueError("multi-step tasks ([[steps]]) are not supported")
            data = {"schema_version": str(data.get("version", "1.0")), **data}
        return data


@dataclass(frozen=True)
class HarborTask:
    """One loaded task directory: its files' facts, and what tasks/terminal.py's Item asks for."""

    name: str
    path: Path
    config: TaskToml
    dockerfile: bool
    prompt: str  # instruction.md
    workdir: str
    fingerprint: str  # a digest of every file of the task directory
    meta: dict[str, Any]  # [metadata]
    bucket: str  # its difficulty
    # the agent's network and the verifier's: each phase's network_mode, else the task's
    nets: tuple[bool, bool]
    agent_timeout: float | None
    agent_user: str | None


def dockerfile_workdir(steps: list[tuple[str, str]]) -> str:
    """The final image's WORKDIR (relative ones resolved, ARG and ENV variables replaced, inherited from the stage
    it is built on), else DEFAULT_WORKDIR."""
    workdirs = [wd for *_, wd in final_steps(steps, {}, {})]
    return (workdirs[-1] if workdirs else None) or DEFAULT_WORKDIR


def _check_compose(path: Path) -> None:
    """environment/docker-compose.yaml (Harbor merges it over its own): extra services are refused, settings for
    `main` are said not to apply."""
    compose = path / "environment" / "docker-compose.yaml"
    if not compose.is_file():
        return
    try:
        services = (yaml.safe_load(compose.read_text(encoding="utf-8")) or {}).get("services") or {}
    except (yaml.YAMLError, AttributeError) as err:
        raise TaskDirError(f"{compose}: not a compose file ({err})") from None
    if others := sorted(set(services) - {"main"}):
        raise TaskDirError(
            f"{path.name}: environment/docker-compose.yaml adds the services {', '.join(others)}: multi-container "
            "tasks are not supported (keelrl runs each episode in one container)"
        )
    if services.get("main"):
        warn_once(f"compose-{path}", f"{path.name}: environment/docker-compose.yaml's settings for main "
                  f"({', '.join(services['main'])}) are not applied")  # fmt: skip


def load_task(path: Path) -> HarborTask:
    """One task directory, checked (see the module docstring); TaskDirError says what is wrong."""
    if (path / "task.yaml").exists() and not (path / "task.toml").exists():
        raise TaskDirError(
            f"{path} is a Terminal-Bench 1 task (task.yaml): convert it to Harbor's layout (task.toml, "
            "instruction.md, environment/, tests/test.sh) with Harbor's terminal-bench adapter"
        )
    if missing := [p for p in ("instruction.md", "tests/test.sh") if not (path / p).is_file()]:
        raise TaskDirError(
            f"{path} is not a task directory: it lacks {', '.join(missing)} (Harbor's layout: instruction.md, "
            "task.toml, environment/Dockerfile, tests/test.sh, solution/solve.sh)"
        )
    try:
        toml = path / "task.toml"
        config = TaskToml.model_validate(tomllib.loads(toml.read_text(encoding="utf-8")) if toml.exists() else {})  # fmt: skip
    except tomllib.TOMLDecodeError as err:
        raise TaskDirError(f"{path / 'task.toml'}: {err}") from None
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'task.toml'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        raise TaskDirError(f"{path / 'task.toml'}: {problems}") from None
    env_dir = path / "environment"
    if not (env_dir.is_dir() and any(env_dir.iterdir())) and not config.environment.docker_image:
        raise TaskDirError(
            f"{path}: environment/ is {'empty' if env_dir.is_dir() else 'missing'}: a task's image is built from "
            "environment/Dockerfile (or [environment] docker_image names one)"
        )
    _check_compose(path)
    dockerfile = env_dir / "Dockerfile"
    try:
        digest = tree_digest(path)
        instruction = (path / "instruction.md").read_text(encoding="utf-8")
        df = dockerfile.read_text(encoding="utf-8") if dockerfile.is_file() else None
    except (OSError, UnicodeDecodeError) as err:
        raise TaskDirError(
            f"{path}: cannot read {getattr(err, 'filename', None) or 'a file'}: {err}"
        ) from None
    a, v, e = config.agent, config.verifier, config.environment
    nets = tuple(m != "no-network" if m else e.network for m in (a.network_mode, v.network_mode))
    try:
        workdir = e.workdir or (dockerfile_workdir(dockerfile_steps(df)) if df else DEFAULT_WORKDIR)
    except ValueError as err:
        raise TaskDirError(f"{dockerfile}: {err}") from None
    return HarborTask(path.name, path, config, df is not None, instruction, workdir, digest, config.metadata,
                      str(config.metadata.get("difficulty", "all")), nets, a.timeout_sec,  # type: ignore[arg-type]
                      None if a.user is None else str(a.user))  # fmt: skip


def _sources(context: Path, pattern: str) -> list[Path]:
    """What a COPY / ADD source names in the build context (its root is `/` and `.`; wildcards as in Docker)."""
    pattern = posixpath.normpath("/" + pattern).lstrip("/")  # `..` stops at the context's root, as in Docker
    return [context] if not pattern else sorted(context.glob(pattern))


def stage_environment(task: HarborTask, out: Path) -> dict[str, str]:
    """The bwrap backend's stand-in for the image: the final image's COPY / ADD of local files into the working
    directory (`final_stage`), copied to `out` (or all of environment/ when there is no Dockerfile); returns its
    ENV settings."""
    env_dir, env = task.path / "environment", {}
    if not task.dockerfile:
        shutil.copytree(env_dir, out, symlinks=True, dirs_exist_ok=True)
        return env
    skipped: list[str] = []
    steps = dockerfile_steps((env_dir / "Dockerfile").read_text(encoding="utf-8"))
    # the host's programs stand in for the base image: its PATH is what `ENV PATH=...:$PATH` extends
    for op, arg, seen, wd in final_steps(steps, BASE_ENV, env):
        if op in ("COPY", "ADD"):
            head, *lines = arg.split("\n")
            docs: dict[str, str] = {}  # `COPY <<EOF dest`: the heredoc's text is the file
            for doc in heredocs(head):
                body, end = heredoc_body(lines, 0, doc[1], doc[3])
                docs[doc[3]], lines = "".join(f"{line}\n" for line in body), lines[end:]
            try:  # the JSON form, else (`[abc]*.txt` is a wildcard) the shell form
                listed = json.loads(head) if head[:1] == "[" else None
            except ValueError:
                listed = None
            words = ["".join(split_words(str(w), seen, split=False)) for w in listed] if isinstance(listed, list) else split_words(head, seen)  # fmt: skip
            parts = [w for w in words if not w.startswith("--")]
            rel = posixpath.relpath(posixpath.normpath(posixpath.join(wd or "/", parts[-1])), task.workdir)
            if rel.startswith("..") or any(w.startswith("--from=") for w in words) or any("://" in s for s in parts[:-1]):  # fmt: skip
                skipped.append(op)
                continue
            into = parts[-1].endswith("/") or len(parts) > 2 or (out / rel).is_dir()
            copied: list[Path] = []
            for s in parts[:-1]:
                if s.startswith("<<") and (name := s[2:].lstrip("-")) in docs:
                    target = out / rel / name if into else out / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(docs[name], encoding="utf-8")
                    copied.append(target)
                    continue
                for src in _sources(env_dir, s):
                    target = out / rel
                    if src.is_dir():
                        shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
                        copied += [target / p.relative_to(src) for p in src.rglob("*") if not p.is_symlink()]
                    elif op == "ADD" and tarfile.is_tarfile(src):  # a local archive is unpacked into `target`
                        target.mkdir(parents=True, exist_ok=True)
                        with tarfile.open(src) as tar:
                            tar.extractall(target, filter="data")
                    else:
                        target = target / src.name if into or target.is_dir() else target
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(src, target)
                        copied.append(target)
            for mode in (w.partition("=")[2] for w in words if w.startswith("--chmod=")):
                if re.fullmatch(r"[0-7]{3,4}", mode):  # octal; a symbolic mode is not applied
                    for path in copied:
                        path.chmod(int(mode, 8))
        elif op not in ("ARG", "ENV", "WORKDIR", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "USER", "SHELL", "STOPSIGNAL"):  # fmt: skip
            skipped.append(op)
    if skipped:
        warn_once(f"bwrap-{task.path}", f"{task.name}: the bwrap backend does not build environment/Dockerfile: its "
                  f"base image and {len(skipped)} steps ({', '.join(sorted(set(skipped)))}) are not applied and the "
                  f"host's programs are used; COPY / ADD into {task.workdir} and ENV are")  # fmt: skip
    return env


def read_reward(files: Mapping[str, bytes]) -> tuple[float | None, dict[str, float], str]:
    """/logs/verifier's files -> (reward, other numeric keys of reward.json, why there is no reward): reward.json's
    "reward", else reward.txt (Harbor's order)."""
    metrics: dict[str, float] = {}
    why = "no reward file (/logs/verifier/reward.json or reward.txt)"

    def finite(r: object) -> bool:  # NaN fails too, and an integer too large for a float
        if not isinstance(r, (int, float)) or isinstance(r, bool):
            return False
        try:
            return math.isfinite(r)
        except OverflowError:
            return False

    if "reward.json" in files:
        raw = files["reward.json"].decode("utf-8", "replace")
        try:
            obj = json.loads(raw) if raw.strip() else None
        except ValueError as err:
            return None, metrics, f"reward.json is not JSON ({err})"
        if not isinstance(obj, dict):
            return None, metrics, "reward.json is empty" if obj is None else "reward.json is not a JSON object"  # fmt: skip
        metrics = {k: float(v) for k, v in obj.items() if finite(v)}
        if "reward" in obj:
            if not finite(obj["reward"]):
                return None, metrics, f"reward.json's reward is {obj['reward']!r}, not a finite number"
            return metrics.pop("reward"), metrics, ""
        why = "reward.json has no reward key and there is no reward.txt"
    if "reward.txt" in files:
        text = files["reward.txt"].decode("utf-8", "replace").strip()
        try:
            r = float(text)
        except ValueError:
            return None, metrics, f"reward.txt holds {text[:40]!r}, not a number" if text else "reward.txt is empty"  # fmt: skip
        return (r, metrics, "") if finite(r) else (None, metrics, f"reward.txt holds {text!r}")
    return None, metrics, why


def verdict(files: Mapping[str, bytes], ran: Ran, limit: float, formatted: bool) -> Score:
    """The verifier run's Score (see the module docstring for the statuses)."""
    output = files.get("test-stdout.txt", b"").decode("utf-8", "replace")
    info: dict[str, Any] = {"formatted": formatted, "exit": ran.code, "output": output[-500:]}
    reward, metrics, why = read_reward(files)
    miss = missing_program(output + "\n" + ran.stderr)
    if ran.timed_out(limit):
        why, reason = f"tests/test.sh ran past its timeout_sec of {limit:g} s", "verifier_timeout"
    elif reward is not None and reward <= 0 and (net := NETWORK_FAILED.search(output)) and (miss or RUNNER_FAILED.search(output)):  # fmt: skip
        line = output[output.rfind("\n", 0, net.start()) + 1 :].split("\n", 1)[0].strip()
        why = f"the verifier could not fetch its test runner ({f'`{miss}` is not in the box; ' if miss else ''}{line})"
        reason = "offline"
    elif reward is None:
        detail = (ran.stderr.strip() or output.strip())[-300:]
        why += f" after tests/test.sh exited {ran.code}" + (f"; `{miss}` is not in the box" if miss else f" ({detail})")  # fmt: skip
        reason = "no_reward"
    else:
        return Score(reward, reward >= 1.0, {**info, "reason": "reward", "verifier_metrics": metrics, "missing": miss})  # fmt: skip
    return unscored("verifier_error", reason, why, info)


def run_script(box: Box, script: str, log: str, user: str | None, **kw: Any) -> Ran:
    """`script` made executable (as root, as Harbor does) and run as `user`, its output in `log` (whose folder
    `user` can write)."""
    logs = posixpath.dirname(log)
    box.exec(f"chmod +x {script} && mkdir -p {logs} && chmod 777 {logs}", timeout=60, user="root")
    return box.exec(f"{script} > {log} 2>&1", user=user, **kw)


class HarborParams(TerminalParams):
    default_image: str = Field(
        "python:3.12-slim",
        description="Container image of a task whose environment/ holds plain files and no Dockerfile (copied to /app).",
    )


class Harbor:
    """A Harbor task directory, or a folder of them: tasks/terminal.py's Format."""

    def __init__(self, path: str, params: HarborParams) -> None:
        root, self.params = Path(path).expanduser(), params
        if not root.is_dir():
            raise TaskDirError(f"task dir {path!r} does not exist (task.name = 'dir:PATH')")
        self.single = any((root / f).exists() for f in ("task.toml", "instruction.md", "task.yaml"))
        dirs = [root] if self.single else sorted(p for p in root.iterdir() if p.is_dir() and p.name[0] != ".")
        self.label, self.items, self.excluded = f"dir:{root.name}", {}, {}
        for d in dirs:
            try:
                self.items[d.name] = load_task(d)
            except TaskDirError as err:
                if self.single:
                    raise
                self.excluded[d.name] = f"load_error: {err}"
        self._staged: dict[str, tuple[Path, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def spec(self, task: HarborTask, backend: Backend) -> BoxSpec:
        e, env_dir = task.config.environment, task.path / "environment"
        env = tuple(resolve_env(e.env, f"task {task.name}'s [environment] env").items())
        ready = e.healthcheck and (e.healthcheck.command, e.healthcheck.start_period_sec + e.healthcheck.retries * (
            e.healthcheck.interval_sec + e.healthcheck.timeout_sec))  # fmt: skip
        common: dict[str, Any] = dict(name=task.name, workdir=task.workdir, cpus=e.cpus, memory_mb=e.memory_mb,
                                      storage_mb=e.storage_mb, build_timeout_s=e.build_timeout_sec, ready=ready or None)  # fmt: skip
        if backend == "container" and task.dockerfile:
            return BoxSpec(**common, image=e.docker_image, context=env_dir, env=env)
        if backend == "container":
            files = env_dir if env_dir.is_dir() and any(env_dir.iterdir()) else None
            return BoxSpec(**common, image=e.docker_image or self.params.default_image, files=files, env=env)
        with self._lock:
            if task.name not in self._staged:
                out = Path(tempfile.mkdtemp(prefix="keelrl-stage-"))
                weakref.finalize(self, shutil.rmtree, out, True)
                try:
                    self._staged[task.name] = (out, stage_environment(task, out))
                # a Dockerfile this reading cannot follow
                except (OSError, ValueError, tarfile.TarError) as err:
                    raise BoxError(f"{task.name}: cannot apply environment/Dockerfile's COPY steps: {err}") from None  # fmt: skip
        files, df_env = self._staged[task.name]
        return BoxSpec(**common, files=files, env=(*df_env.items(), *env))

    def verify(self, task: HarborTask, box: Box, formatted: bool) -> Score:
        """Run tests/test.sh in the box as Harbor does and read its reward (module docstring)."""
        v = task.config.verifier
        prep = "mkdir -p /tests /logs/verifier && find /tests /logs/verifier -mindepth 1 -delete && chmod 777 /logs/verifier"
        if (ran := box.exec(prep, timeout=60, user="root")).code != 0:  # whatever USER the image ends with
            raise BoxError(f"cannot empty /tests and /logs/verifier: {ran.stderr.strip()[-300:]}")
        box.upload(task.path / "tests", "/tests")
        env = resolve_env(v.env, f"task {task.name}'s [verifier] env")
        user = None if v.user is None else str(v.user)
        ran = run_script(box, "/tests/test.sh", "/logs/verifier/test-stdout.txt", user, timeout=v.timeout_sec, env=env)  # fmt: skip
        return verdict(box.read_dir("/logs/verifier"), ran, v.timeout_sec, formatted)

    def solve(self, task: HarborTask, box: Box) -> Score | None:
        """solution/solve.sh ([solution] env, as the agent user, under [agent] timeout_sec)."""
        if not (task.path / "solution" / "solve.sh").is_file():
            return unscored("agent_error", "no_solution", f"{task.name} has no solution/solve.sh")
        limit = task.agent_timeout or ORACLE_TIMEOUT_S
        box.upload(task.path / "solution", "/solution")
        env = {"DEBIAN_FRONTEND": "noninteractive", **resolve_env(task.config.solution.env, f"task {task.name}'s [solution] env")}  # fmt: skip
        ran = run_script(box, "/solution/solve.sh", "/logs/agent/oracle.txt", task.agent_user, timeout=limit, env=env)  # fmt: skip
        why = f"solution/solve.sh ran past [agent] timeout_sec = {limit:g} s"
        return unscored("timeout", "agent_timeout", why) if ran.timed_out(limit) else None


def harbor_tasks(path: str, seed: int = 0, sandbox: SandboxConfig | None = None, **params: Any) -> Terminal:
    """`dir:PATH` as an environment (get_task's factory)."""
    p = HarborParams(**params)
    return Terminal(Harbor(path, p), seed, p, sandbox_of(sandbox))
