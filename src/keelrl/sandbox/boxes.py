"""Episode boxes: where an agentic episode runs its commands (a terminal task's shell, its verifier), behind one
small interface that the tasks use (tasks/terminal.py, tasks/harbor.py, tasks/swebench.py):

    box.exec(command, timeout=..., user=, env=, stdin=, workdir=) -> Ran     bash -c COMMAND, capped output
    box.upload(host_dir, dest)        copy a host directory's contents to dest (modes kept: executable bits survive)
    box.read_dir(path) -> {name: bytes}   the files directly under path (the verifier's logs)
    box.set_network(on)               the network for what runs next (the agent's phase, the verifier's)
    box.close()                       nothing of the episode is left

Two backends:
- `ContainerBox`: one container per episode, from the task's image, through the podman or docker command line
  (`Runtime`; no daemon API, no home-made runtime). Images are built once from a build context and cached by a
  hash of it (`Runtime.image`). As in Harbor, the image's ENTRYPOINT runs with `sh -c "sleep ..."` as its command
  (an entrypoint that starts a service and then runs its arguments works). The container gets the task's cpus and
  memory limits, root inside it (nothing of the host is mounted but, while the network is allowed, the host's CA
  bundle (`Runtime.ca_mount`; image builds get it too) and pip config), its own network namespace: `--network
  none` unless some phase needs the network, else the default bridge, connected and disconnected per phase. What is enforced here, measured on the development machine (Debian podman 4.3 with
  runc, cgroup v1): memory (the kernel kills the container's process over it) and cpus (CFS quota); storage is
  not (overlay on ext4 has no quota: `--storage-opt size` needs XFS), and the box says so once.
- `BwrapBox`: bubblewrap over the host's programs (sandbox/isolation.py's read-only root: /usr, /bin, /lib*,
  /etc with /etc/shadow covered; no /home, /root, /tmp, checkouts or run directories), for machines without a
  container runtime. The episode's directories are bound read-write at the task's paths (the working directory,
  /tests, /logs, /solution) from a private host directory removed at `close`; the process is root with every
  capability dropped, in new PID, IPC, UTS and network namespaces (the host's network while `set_network(True)`).
  Enforced: time limits, output caps, the filesystem; not enforced: memory, cpus, storage, users (commands run as
  root, said once), image contents (the Dockerfile is not built: tasks/harbor.py applies its COPY steps into the
  working directory and says so).
`backend_for` picks the backend from the [sandbox] section (sandbox/config.py); `start_box` starts one.

A command's time limit is kept twice: by `timeout -k 5 T` inside the box (a killed podman/docker client would leave
its command running) and by killing the client's process group T + 10 s later.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from keelrl.sandbox.config import SandboxConfig
from keelrl.sandbox.isolation import SAFE_PATH, bwrap_command, interpreter
from keelrl.sandbox.isolation import warn_once as _warn_once

logger = logging.getLogger("keelrl.sandbox")
OUTPUT_CAP = 1 << 20  # bytes of a command's stdout (and of its stderr) kept; the rest is read and dropped
READ_CAP = 16 << 20  # bytes of a read_dir's archive
MAX_BOX_S = 86400  # a container box's longest life
CA_FILE = "/etc/ssl/certs/ca-certificates.crt"  # where the host's CA bundle is mounted, and where Debian keeps it  # fmt: skip
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
           "GIT_SSL_CAINFO")  # fmt: skip
# package-index and proxy settings passed in from the host while the network is on
PASS_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "PIP_INDEX_URL",
            "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT", "UV_INDEX_URL", "UV_DEFAULT_INDEX",
            "UV_EXTRA_INDEX_URL", "UV_NATIVE_TLS")  # fmt: skip
BASE_ENV = {  # a bwrap box's environment (a container keeps its image's)
    "PATH": SAFE_PATH + ":/usr/local/sbin:/usr/sbin:/sbin",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
}
Backend = Literal["container", "bwrap"]


# Said once per process, in the log: what a backend does not apply (not a SandboxWarning: nothing is less safe).
warn_once = functools.partial(_warn_once, loud=False)


class BoxError(RuntimeError):
    """A box could not be made or used (an image that does not build, a runtime that fails): not the agent's fault,
    not the verifier's."""


@dataclass(frozen=True)
class Ran:
    code: int | None  # None: killed at its time limit
    out: bytes
    err: bytes
    seconds: float

    def timed_out(self, limit: float) -> bool:
        """Killed at `limit` seconds: by the client's clock, or by `timeout` in the box (exit 124, or 137 after -k)."""
        return self.code is None or (self.code in (124, 137) and self.seconds >= limit)

    @property
    def stdout(self) -> str:
        return self.out.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")


@dataclass(frozen=True)
class BoxSpec:
    """What an episode's box starts from. Container: `image` when it exists here, else the build of `context` (a
    directory with a Dockerfile), else `image` as named. Both: `files` (a host directory) copied into `workdir`."""

    name: str
    workdir: str = "/app"
    image: str | None = None
    context: Path | None = None
    files: Path | None = None
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    env: tuple[tuple[str, str], ...] = ()
    build_timeout_s: float = 600.0
    # a command that passes once the box is ready, and how long to wait (s)
    ready: tuple[str, float] | None = None


def run_capped(
    argv: list[str], *, stdin: bytes | None = None, timeout: float = 60.0, cap: int = OUTPUT_CAP,
    env: Mapping[str, str] | None = None,
) -> Ran:  # fmt: skip
    """Run argv (own process group); keep the first `cap` bytes of stdout and of stderr; kill the group at
    `timeout` (then `code` is None)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=dict(env) if env is not None else None, start_new_session=True,
        )  # fmt: skip
    except OSError as err:
        raise BoxError(f"cannot run {argv[0]}: {err}") from None
    bufs = (bytearray(), bytearray())

    def pump(fd: int, buf: bytearray) -> None:
        while chunk := os.read(fd, 65536):
            buf += chunk[: max(0, cap - len(buf))]

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            proc.stdin.write(stdin or b"")
            proc.stdin.close()

    assert proc.stdout is not None and proc.stderr is not None
    threads = [threading.Thread(target=pump, args=(f.fileno(), b), daemon=True) for f, b in zip((proc.stdout, proc.stderr), bufs)]  # fmt: skip
    threads += [threading.Thread(target=feed, daemon=True)] if stdin is not None else []  # fmt: skip
    for t in threads:
        t.start()
    code: int | None
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        code = None
    for t in threads:
        t.join(5.0)
    proc.stdout.close()
    proc.stderr.close()
    return Ran(code, bytes(bufs[0]), bytes(bufs[1]), time.perf_counter() - t0)


def in_time(timeout: float, script: str) -> list[str]:
    """`bash -c script` under `timeout -k 5` in the box (the first of a command's two time limits, see above)."""
    return ["timeout", "-k", "5", f"{timeout:g}", "bash", "-c", script]


def tree_digest(root: Path) -> str:
    """sha256 of a directory tree: every path, executable bit and content (a symlink's target). Raises OSError
    naming a file that cannot be read."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            h.update(f"\0L{rel}\0{os.readlink(p)}".encode())
        elif p.is_file():
            h.update(f"\0F{rel}\0{os.stat(p).st_mode & 0o111:o}\0".encode())
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        elif p.is_dir():
            h.update(f"\0D{rel}".encode())
    return h.hexdigest()


def network_env() -> dict[str, str]:
    """What a box gets from the host while its network is on: proxy and package-index settings, and the CA bundle
    (mounted at CA_FILE) named in the variables tools read."""
    out = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    return out | ({k: CA_FILE for k in CA_VARS} if os.path.exists(CA_FILE) else {})


def _base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's FROM lines name (not its own stages, not scratch)."""
    images, stages = [], {"scratch"}
    for m in re.finditer(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", dockerfile, re.I | re.M):
        if m[1].lower() not in stages and "$" not in m[1]:
            images.append(m[1])
        stages.add((m[2] or "").lower())
    return images


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.")[:80] or "task"


class Runtime:
    """podman or docker through its command line. podman runs with `--runtime runc` when runc is installed (crun
    fails on some cgroup setups), and containers with explicit nofile / nproc limits (the host's may not apply)."""

    def __init__(self, cli: str) -> None:
        self.cli = cli
        self.argv = [cli, *(["--runtime", "runc"] if cli == "podman" and shutil.which("runc") else [])]
        self.bridge = "podman" if cli == "podman" else "bridge"
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._built: set[str] = set()  # tags known to exist: not inspected again

    def __call__(self, *args: str, stdin: bytes | None = None, timeout: float = 120.0, check: bool = True,
                 cap: int = OUTPUT_CAP) -> Ran:  # fmt: skip
        ran = run_capped([*self.argv, *args], stdin=stdin, timeout=timeout, cap=cap)
        if check and ran.code != 0:
            how = "timed out" if ran.code is None else f"exit {ran.code}"
            raise BoxError(f"`{self.cli} {args[0]}` failed ({how}): {ran.stderr.strip()[-600:]}")
        return ran

    def ca_mount(self) -> list[str]:
        """The host's CA bundle at CA_FILE: podman overlays the host's /etc/ssl/certs (writable, changes dropped: a
        build or a command that installs ca-certificates still works, and what it writes there is not kept); docker
        binds the bundle read-only."""
        if not os.path.exists(CA_FILE):
            return []
        return ["-v", "/etc/ssl/certs:/etc/ssl/certs:O"] if self.cli == "podman" else ["-v", f"{CA_FILE}:{CA_FILE}:ro"]  # fmt: skip

    def has_image(self, image: str) -> bool:
        return self("image", "inspect", image, check=False, timeout=60).code == 0

    def image(self, spec: BoxSpec) -> str:
        """The image an episode of `spec` starts from (see BoxSpec); a build happens once per context and process,
        and not at all when an image of that context's hash exists; an image without a context is pulled if absent."""
        if spec.image and (spec.image in self._built or self.has_image(spec.image)):
            self._built.add(spec.image)
            return spec.image
        if spec.context is None:
            if (
                not spec.image
                or self("pull", spec.image, check=False, timeout=spec.build_timeout_s).code != 0
            ):
                raise BoxError(f"{spec.name}: the image {spec.image} is not on this machine and cannot be pulled here: "
                               f"`{self.cli} pull` it where a registry is reachable (`{self.cli} save` / `load` carry it)")  # fmt: skip
            return spec.image
        tag = f"keelrl/{_slug(spec.name)}:{tree_digest(spec.context)[:16]}"
        with self._lock:
            lock = self._locks.setdefault(tag, threading.Lock())
        with lock:
            if tag not in self._built and not self.has_image(tag):
                self.build(spec.context, tag, spec.build_timeout_s, spec.name)
            self._built.add(tag)
        return tag

    def build(self, context: Path, tag: str, timeout: float, what: str) -> None:
        dockerfile = (context / "Dockerfile").read_text(encoding="utf-8", errors="replace")
        missing = [b for b in _base_images(dockerfile) if not self.has_image(b)]
        ca = self.ca_mount() if self.cli == "podman" else []  # docker build takes no volumes
        proxies = [a for k, v in network_env().items() if k.lower().endswith("_proxy") for a in ("--build-arg", f"{k}={v}")]  # fmt: skip
        ran = self("build", *ca, *proxies, "-t", tag, str(context), timeout=timeout, check=False)
        if ran.code != 0:
            hint = (
                f" Its base image {', '.join(missing)} is not on this machine and could not be pulled: run "
                "`keelrl tasks images` to make local stand-ins for common base images (it says how each differs)."
                if missing else ""
            )  # fmt: skip
            how = "timed out" if ran.code is None else f"exit {ran.code}"
            tail = (ran.stdout + ran.stderr).strip()[-800:]
            raise BoxError(
                f"building the image of {what} failed ({how}).{hint} Build output, last lines:\n{tail}"
            )


def find_runtime(choice: str = "auto") -> Runtime | None:
    """podman or docker (auto: the first whose `info` works here); None for auto when neither does."""
    for cli in ("podman", "docker") if choice == "auto" else (choice,):
        if shutil.which(cli) and run_capped([cli, "info"], timeout=60).code == 0:
            return Runtime(cli)
    if choice != "auto":
        raise BoxError(f"container runtime {choice!r} does not work here (`{choice} info` fails or it is not installed)")  # fmt: skip
    return None


class ContainerBox:
    """One container for one episode (see the module docstring)."""

    def __init__(self, rt: Runtime, spec: BoxSpec, network: bool) -> None:
        self.rt, self.workdir, self.allowed, self.env = rt, spec.workdir, network, dict(spec.env)
        image = rt.image(spec)
        net = ["--network", "none"]
        if network:
            net = rt.ca_mount()
            net += ["-v", "/etc/pip.conf:/etc/pip.conf:ro"] if os.path.exists("/etc/pip.conf") else []
            net += [a for k, v in network_env().items() for a in ("-e", f"{k}={v}")]
        if spec.storage_mb:
            warn_once("storage", "container boxes: storage limits are not enforced (`--storage-opt size` needs "
                      "an overlay on XFS with quotas); memory and cpus are")  # fmt: skip
        limits = ["--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mb}m", "--ulimit", "nofile=1024:1024",
                  "--ulimit", "nproc=1000:1000"]  # fmt: skip
        # --rm and a day's sleep: a box left by a trainer that was killed goes away by itself
        ran = rt("run", "-d", "--rm", "--label", "keelrl.box=1", *limits, *net, image, "sh", "-c", f"sleep {MAX_BOX_S}")  # fmt: skip
        self.id = ran.stdout.strip()
        self.connected = network
        try:
            if spec.files is not None:
                self.upload(spec.files, self.workdir)
        except BoxError:
            self.close()
            raise

    def exec(self, command: str, *, timeout: float, user: str | None = None, env: Mapping[str, str] | None = None,
             stdin: bytes | None = None, workdir: str | None = None) -> Ran:  # fmt: skip
        flags = ["-i"] if stdin is not None else []
        flags += ["-u", user] if user else []
        flags += [a for k, v in {**self.env, **(env or {})}.items() for a in ("-e", f"{k}={v}")]  # fmt: skip
        wd = shlex.quote(workdir or self.workdir)  # made here if the image lacks it (exec -w would fail)
        script = f"mkdir -p {wd} && cd {wd} || exit 126\n{command}"
        argv = [*flags, self.id, *in_time(timeout, script)]
        return self.rt("exec", *argv, stdin=stdin, timeout=timeout + 10, check=False)

    def upload(self, src: Path, dest: str) -> None:
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            tar.add(src, arcname=dest.strip("/") or ".")
        self.rt("cp", "-", f"{self.id}:/", stdin=data.getvalue(), timeout=300)

    def read_dir(self, path: str) -> dict[str, bytes]:
        ran = self.rt("cp", f"{self.id}:{path}", "-", check=False, timeout=120, cap=READ_CAP)
        out: dict[str, bytes] = {}
        # a broken archive: nothing there, or an archive over READ_CAP (what was read is kept)
        with contextlib.suppress(tarfile.TarError, EOFError):
            with tarfile.open(fileobj=io.BytesIO(ran.out), mode="r|") as tar:
                for m in tar:
                    name = m.name.partition("/")[2]
                    if m.isfile() and name and "/" not in name and (f := tar.extractfile(m)) is not None:
                        out[name] = f.read()
        return out

    def set_network(self, on: bool) -> None:
        if on == self.connected:
            return
        if on and not self.allowed:
            raise BoxError("this box was started without a network")
        self.rt("network", "connect" if on else "disconnect", self.rt.bridge, self.id)
        self.connected = on

    def close(self) -> None:
        self.rt("rm", "-f", *(["-t", "0"] if self.rt.cli == "podman" else []), self.id, check=False, timeout=60)  # fmt: skip


class BwrapBox:
    """bubblewrap over the host's programs (see the module docstring)."""

    def __init__(self, spec: BoxSpec, network: bool) -> None:
        self.workdir, self.connected, self.env = spec.workdir, network, dict(spec.env)
        self.root = Path(tempfile.mkdtemp(prefix="keelrl-box-"))
        self.mounts = {
            spec.workdir: self.root / "app",
            **{p: self.root / p[1:] for p in ("/tests", "/logs", "/solution")},
        }
        for d in self.mounts.values():
            d.mkdir()
        if spec.files is not None:
            shutil.copytree(spec.files, self.root / "app", symlinks=True, dirs_exist_ok=True)

    def host(self, path: str) -> Path:
        """The host directory behind a path of the box (under one of its mounts)."""
        for inside, outside in self.mounts.items():
            rel = os.path.relpath(os.path.normpath(path), inside)
            if rel == "." or not rel.startswith(".."):
                return outside / rel
        raise BoxError(f"{path} is outside this box's writable paths ({', '.join(self.mounts)})")

    def exec(self, command: str, *, timeout: float, user: str | None = None, env: Mapping[str, str] | None = None,
             stdin: bytes | None = None, workdir: str | None = None) -> Ran:  # fmt: skip
        if user not in (None, "root", "0"):
            warn_once(f"bwrap-user-{user}", f"bwrap boxes run every command as root, not as {user}")
        flags = ["--unshare-all", *(["--share-net"] if self.connected else []), "--cap-drop", "ALL"]
        argv = bwrap_command(interpreter(), ("/etc/shadow", "/etc/gshadow"), flags)
        argv += [a for inside, outside in self.mounts.items() for a in ("--bind", str(outside), inside)]
        argv += ["--chdir", workdir or self.workdir, *in_time(timeout, command)]
        net = network_env() if self.connected else {}
        full = {**BASE_ENV, "HOME": "/tmp", **self.env, **net, **(env or {})}
        return run_capped(argv, stdin=stdin, timeout=timeout + 10, env=full)

    def upload(self, src: Path, dest: str) -> None:
        shutil.copytree(src, self.host(dest), symlinks=True, dirs_exist_ok=True)

    def read_dir(self, path: str) -> dict[str, bytes]:
        """Its regular files, each cut at READ_CAP bytes; a symlink is left out, as the container's archive leaves
        it out (here it would be followed on the host, to a host file), and so is a folder that a link names."""
        d = self.host(path)
        out: dict[str, bytes] = {}
        # a link made in the box (`ln -s /tmp /logs/verifier`) names, here, a host folder
        if not d.resolve().is_relative_to(self.root.resolve()):
            return out
        for p in d.iterdir() if d.is_dir() else ():
            if p.is_file() and not p.is_symlink():
                with p.open("rb") as f:
                    out[p.name] = f.read(READ_CAP)
        return out

    def set_network(self, on: bool) -> None:
        self.connected = on

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


Box = ContainerBox | BwrapBox


_runtime = functools.cache(find_runtime)  # one `info` probe per choice and process


def backend_for(sandbox: SandboxConfig) -> tuple[Backend, Runtime | None]:
    """The backend [sandbox] asks for, and its container runtime (auto: a container where a runtime works)."""
    if sandbox.backend == "bwrap":
        return "bwrap", None
    rt = _runtime(sandbox.runtime)
    if rt is None and sandbox.backend == "container":
        raise BoxError(
            "sandbox.backend = 'container': neither podman nor docker works here (`make system-deps`)"
        )
    if rt is None:
        warn_once("no-runtime", "no container runtime (podman or docker) works here: tasks run in bubblewrap over "
                  "the host's programs, and their Dockerfiles are not built")  # fmt: skip
        return "bwrap", None
    return "container", rt


def start_box(spec: BoxSpec, rt: Runtime | None, allowed: bool, now: bool) -> Box:
    """A started box (a container with `rt`, else bubblewrap) whose network is `now` and may later be `allowed`."""
    box: Box = ContainerBox(rt, spec, allowed) if rt is not None else BwrapBox(spec, allowed)
    try:
        box.set_network(now)
        deadline = time.perf_counter() + (spec.ready[1] if spec.ready else 0)
        while spec.ready and box.exec(spec.ready[0], timeout=60).code != 0:
            if time.perf_counter() > deadline:
                why = (
                    ""
                    if rt
                    else " (bwrap applies no image: neither its ENTRYPOINT nor the services it starts)"
                )
                raise BoxError(
                    f"{spec.name}: its healthcheck `{spec.ready[0]}` did not pass in {spec.ready[1]:g} s{why}"
                )
            time.sleep(1.0)
    except BoxError:
        box.close()
        raise
    return box
