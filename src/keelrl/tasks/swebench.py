"""SWE-bench-style instances (`task.name = "swebench:FILE.jsonl"`): one instance per line, with SWE-bench's fields
(SWE-Gym's too):

    instance_id, repo, base_commit, problem_statement   what the model is told is the problem statement
    patch                                               the gold patch (the oracle of `keelrl tasks check`)
    test_patch                                          the tests that judge a fix, applied only afterwards
    FAIL_TO_PASS, PASS_TO_PASS                          test ids (lists, or JSON strings of lists, as SWE-bench
                                                        ships them): all must pass for reward 1
and keelrl's fields for where the repository and its environment come from:
    image       a container image holding the repository at `workdir` (SWE-bench's and SWE-Gym's images do, at
                /testbed), or the base on which `setup` runs and the repository is copied in
    setup       shell commands run once when that image is built (installing git, the test runner, the package)
    repo_path   a local clone or a mirror URL of the repository (relative paths: from the .jsonl file's folder);
                it is cloned once (cached), checked out at base_commit, and every ref and object after it removed,
                so the model cannot read the fix out of the history
    workdir     where the repository is (default /testbed); test_cmd: the test command (default `pytest -rA`),
                given the test files of test_patch (by their names, or named by a test id) or where `{tests}`
                says; difficulty: a bucket name (optional)
A row as SWE-bench publishes it (with hints_text, created_at, version, environment_setup_commit, ...: kept, `where`
can filter on them) has neither image nor repo_path: it runs in SWE-bench's evaluation image for its instance
(`SWEBENCH_IMAGE`, to be pulled beforehand) with its conda test environment activated (`SWEBENCH_TESTS`).

An episode works on the repository at base_commit with the terminal tools (tasks/terminal.py); on the container
backend the image is `image` (no repo_path) or, with repo_path, one built once per instance from `image` (default
`base_image`), `setup` and the checkout; on the bwrap backend the checkout is copied into `workdir` and the host's
programs run it (`image` and `setup` are not applied). Afterwards, as SWE-bench's harness does: the files test_patch
touches are put back as they are at base_commit (those it creates are removed), test_patch is applied (`git apply`),
test_cmd runs on its test files, and the log is read for per-test outcomes (pytest's `-rA` summary lines `PASSED
path::name`, or `path::name PASSED`). Reward 1 (correct) when every FAIL_TO_PASS and PASS_TO_PASS test passed
(PASSED or XFAIL), else 0 (a row whose FAIL_TO_PASS names no test is refused: any run would be resolved); status
`verifier_error` when test_patch does not apply, the tests time out, or nothing
ran because a program or module is missing (named); `agent_error` when the box does not start.

`write_swe_mini(out, count)` (`keelrl tasks swe-mini OUT`) writes swe_mini's generated repositories as real git
repositories with instances in this format, so the path runs offline: its hidden tests become the test_patch
(with a small runner printing `-rA` lines, so no pytest is needed), the planted bug's undoing the gold patch.
docs/tasks.md says how to point it at SWE-bench or SWE-Gym data and images on a machine with a registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keelrl.sandbox.boxes import Backend, Box, BoxError, BoxSpec, Ran
from keelrl.sandbox.config import SandboxConfig, sandbox_of
from keelrl.tasks.base import Score, Split, unscored
from keelrl.tasks.terminal import TaskDirError, Terminal, TerminalParams, cache_dir, missing_program

PASSING = ("PASSED", "XFAIL")
STATUSES = "PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED"
# `STATUS id[ - message]` (-rA) or `id STATUS` (-v); an id may hold spaces (a parameter: `test_a[a b]`)
OUTCOME_RE = re.compile(
    rf"^({STATUSES})[ \t]+(\S[^\n]*?)[ \t]*$|^(\S+::[^\n]*?)[ \t]+({STATUSES})(?=\s|$)", re.M
)
TEST_FILE_RE = re.compile(r"(^|/)(test[^/]*|[^/]*_test\.\w+|tests\.py)$")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "keelrl", "GIT_AUTHOR_EMAIL": "keelrl@localhost", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "keelrl", "GIT_COMMITTER_EMAIL": "keelrl@localhost", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}  # fmt: skip
# a row as SWE-bench publishes it (no image, no repo_path) runs in SWE-bench's evaluation image, named as its harness
# names them, with the test environment its harness activates
SWEBENCH_IMAGE = "docker.io/swebench/sweb.eval.x86_64.{}:latest"
SWEBENCH_TESTS = "source /opt/miniconda3/bin/activate && conda activate testbed && pytest -rA"


class Instance(BaseModel):
    """One instance (a .jsonl row): SWE-bench's fields, keelrl's, and any other (kept: `where` filters on them)."""

    model_config = ConfigDict(extra="allow")
    instance_id: str
    repo: str = ""
    base_commit: str
    problem_statement: str
    patch: str = ""
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    image: str | None = None
    setup: list[str] = Field(default_factory=list)
    repo_path: str | None = None
    workdir: str = "/testbed"
    test_cmd: str = "pytest -rA"
    difficulty: str = "all"  # SWE-bench Verified's "15 min - 1 hour" is a bucket too

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "setup", mode="before")
    @classmethod
    def _listed(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = json.loads(v) if v.strip().startswith("[") else [v]
        # a blank entry names nothing (a published "" is no test, not a test that never passes)
        return [x for x in v if not (isinstance(x, str) and not x.strip())] if isinstance(v, list) else v

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _some_test_must_fail_first(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("names no test: with none to fix, a run that changes nothing would be resolved")
        return v

    @model_validator(mode="after")
    def _published(self) -> Instance:
        if self.image is None and self.repo_path is None:
            self.image = SWEBENCH_IMAGE.format(self.instance_id.replace("__", "_1776_").lower())
            self.test_cmd = self.test_cmd if "test_cmd" in self.model_fields_set else SWEBENCH_TESTS
        return self

    def touched(self) -> list[str]:
        """The files test_patch changes."""
        return sorted({b for _, b in re.findall(r"^diff --git a/(\S+) b/(\S+)", self.test_patch, re.M)})

    # what tasks/terminal.py's Item asks for
    prompt = property(lambda self: f"Repository {self.repo} (in {self.workdir}).\n\n{self.problem_statement}")
    meta = property(lambda self: self.model_dump())
    bucket = property(lambda self: self.difficulty)
    # SWE-bench's harness runs the tests offline; the agent's commands get no network either
    nets: ClassVar[tuple[bool, bool]] = (False, False)
    agent_timeout: ClassVar[float | None] = None
    agent_user: ClassVar[str | None] = None
    fingerprint = property(lambda self: self.model_dump_json())


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    )
    if done.returncode != 0:
        raise BoxError(f"git {' '.join(args[:3])} in {repo} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def log_outcomes(log: str) -> dict[str, str]:
    """test id -> PASSED / FAILED / ERROR / XFAIL / XPASS / SKIPPED, from pytest's -rA or -v lines (an -rA
    line's ` - message` cut off)."""
    return {(m[2] or m[3]).split(" - ", 1)[0]: m[1] or m[4] for m in OUTCOME_RE.finditer(log)}


def outcome_reader(log: str) -> Callable[[str], str | None]:
    """A test id's last status in the log (None when absent). The id is the whole text after (or before) the
    status word, so a parameter with spaces (`path::test_a[a b]`) is read whole; an id also names the line
    whose text goes on after it with a space (` - message`, or the rest of a parameter: SWE-bench's harness
    splits lines on whitespace, so its FAIL_TO_PASS lists hold such ids cut at their first space)."""
    lines: dict[str, list[tuple[str, str]]] = {}
    for m in OUTCOME_RE.finditer(log):
        text = m[2] or m[3]
        lines.setdefault(text.split(None, 1)[0], []).append((text, m[1] or m[4]))

    def status(test: str) -> str | None:
        for text, word in reversed(lines.get(test.split(None, 1)[0] if test.strip() else "", [])):
            if text == test or (text.startswith(test) and text[len(test)].isspace()):
                return word
        return None

    return status


def judge_log(inst: Instance, ran: Ran, limit: float, formatted: bool) -> Score:
    """The test run's Score (see the module docstring)."""
    log = ran.stdout + "\n" + ran.stderr
    got = log_outcomes(log)
    info: dict[str, Any] = {"formatted": formatted, "output": log[-500:]}
    if ran.timed_out(limit):
        return unscored("verifier_error", "tests_did_not_run", f"the tests ran past {limit:g} s", info)
    if not got and (miss := missing_program(log)):
        why = f"the tests did not run: `{miss}` is not in the box"
        return unscored("verifier_error", "tests_did_not_run", why, info)
    status = outcome_reader(log)
    f2p = sum(status(t) in PASSING for t in inst.FAIL_TO_PASS)
    p2p = sum(status(t) in PASSING for t in inst.PASS_TO_PASS)
    ok = f2p == len(inst.FAIL_TO_PASS) and p2p == len(inst.PASS_TO_PASS)
    info |= {"fail_to_pass": f"{f2p}/{len(inst.FAIL_TO_PASS)}", "pass_to_pass": f"{p2p}/{len(inst.PASS_TO_PASS)}"}  # fmt: skip
    return Score(1.0 if ok else 0.0, ok, {**info, "reason": "resolved" if ok else "unresolved"})


class SweBenchParams(TerminalParams):
    base_image: str = Field(
        "python:3.12-slim", description="Image an instance with repo_path, not image, builds on."
    )
    test_timeout_s: float = Field(900.0, gt=0, description="Time limit of an instance's test run (s).")


class SweBench:
    """SWE-bench-style instances from a .jsonl file: tasks/terminal.py's Format."""

    def __init__(self, path: str, params: SweBenchParams) -> None:
        file, self.params = Path(path).expanduser(), params
        if not file.is_file():
            raise TaskDirError(f"instance file {path!r} does not exist (task.name = 'swebench:FILE.jsonl')")
        self.label, self.items, self.excluded = f"swebench:{file.name}", {}, {}
        for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                inst = Instance.model_validate_json(line)
            except ValidationError as err:
                raise TaskDirError(f"{file}:{n}: not a SWE-bench instance: {err}") from None
            if inst.repo_path and "://" not in inst.repo_path:
                inst.repo_path = str((file.parent / inst.repo_path).resolve())
            self.items[inst.instance_id] = inst
        self.single = len(self.items) == 1
        self._lock = threading.Lock()

    def _cached(self, inst: Instance, what: str, make: Callable[[Path], None]) -> Path:
        key = hashlib.sha256(f"{inst.model_dump_json()}\0{what}\0{self.params.base_image}".encode()).hexdigest()[:24]  # fmt: skip
        out = cache_dir() / "swebench" / f"{inst.instance_id[:60]}-{key}"
        with self._lock:
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
                try:
                    make(tmp)
                    tmp.rename(out)  # another process may have made it meanwhile: then theirs is kept
                except OSError:
                    if not out.exists():
                        raise
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        return out

    def checkout(self, inst: Instance, dest: Path) -> None:
        """repo_path cloned at base_commit into dest, with no ref or object after it."""
        if not inst.repo_path:
            raise BoxError(
                f"{inst.instance_id} has no repo_path: the bwrap backend needs the repository on this machine (a "
                "local clone or a mirror URL); the container backend can run it in its image"
            )
        git(dest.parent, "clone", "-q", "--no-hardlinks", inst.repo_path, str(dest))
        git(dest, "checkout", "-q", "--detach", inst.base_commit)
        git(dest, "remote", "remove", "origin")
        for ref in git(dest, "for-each-ref", "--format=%(refname)").split():
            git(dest, "update-ref", "-d", ref)
        git(dest, "reflog", "expire", "--expire=now", "--all")
        git(dest, "gc", "-q", "--prune=now")

    def spec(self, inst: Instance, backend: Backend) -> BoxSpec:
        if backend == "bwrap":
            checkout = self._cached(inst, "checkout", lambda d: self.checkout(inst, d))
            return BoxSpec(inst.instance_id, inst.workdir, files=checkout)
        if not inst.repo_path:
            return BoxSpec(inst.instance_id, inst.workdir, image=inst.image)

        def context(d: Path) -> None:
            self.checkout(inst, d / "repo")
            run = "".join(f"RUN {line}\n" for line in inst.setup)
            base = inst.image or self.params.base_image
            (d / "Dockerfile").write_text(f"FROM {base}\n{run}COPY repo {inst.workdir}\nWORKDIR {inst.workdir}\n")  # fmt: skip

        return BoxSpec(inst.instance_id, inst.workdir, context=self._cached(inst, "context", context))

    def verify(self, inst: Instance, box: Box, formatted: bool) -> Score:
        """Put test_patch's files back as at base_commit, apply test_patch, run its tests, read the outcomes."""
        files = inst.touched()
        reset, base = " ".join(shlex.quote(f) for f in files), shlex.quote(inst.base_commit)
        script = (
            f'for f in {reset}; do if git cat-file -e {base}:"$f" 2>/dev/null; then git checkout -q {base} -- "$f"; '
            'else rm -f -- "$f"; fi; done && git apply --whitespace=nowarn -'
        )
        applied = box.exec(script, timeout=120, stdin=inst.test_patch.encode())
        if applied.code != 0:
            why = f"test_patch does not apply: {(applied.stderr or applied.stdout).strip()[-300:]}"
            return unscored("verifier_error", "test_patch", why)
        # test files by their names, or by the test ids naming them (pylint's unittest_*.py, pytest's testing/*/*.py)
        named = {t.split("::", 1)[0] for t in [*inst.FAIL_TO_PASS, *inst.PASS_TO_PASS]}
        tests = " ".join(shlex.quote(f) for f in files if TEST_FILE_RE.search(f) or f in named)
        cmd = inst.test_cmd
        command = cmd.replace("{tests}", tests) if "{tests}" in cmd else f"{cmd} {tests}"
        limit = self.params.test_timeout_s
        return judge_log(inst, box.exec(command, timeout=limit), limit, formatted)

    def solve(self, inst: Instance, box: Box) -> Score | None:
        """The gold patch."""
        ran = box.exec("git apply --whitespace=nowarn -", timeout=120, stdin=inst.patch.encode())
        why = f"the gold patch does not apply: {ran.stderr.strip()[-300:]}"
        return None if ran.code == 0 else unscored("agent_error", "gold_patch", why)


def swebench_tasks(path: str, seed: int = 0, sandbox: SandboxConfig | None = None, **params: Any) -> Terminal:
    """`swebench:FILE.jsonl` as an environment (get_task's factory)."""
    p = SweBenchParams(**params)
    return Terminal(SweBench(path, p), seed, p, sandbox_of(sandbox))


# ------------------------------------------------------------------------------------------ the generated set

RUNNER = '''"""Run the test functions of the files given and print pytest -rA style lines (no pytest needed)."""
import importlib.util
import os
import sys

sys.path.insert(0, os.getcwd())
for path in sys.argv[1:]:
    try:
        spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as err:
        print(f"ERROR {path} - {err!r}")
        continue
    for name, fn in list(vars(module).items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASSED {path}::{name}")
            except Exception as err:
                print(f"FAILED {path}::{name} - {err!r}")
'''


def _hidden_tests(problem: dict[str, Any]) -> tuple[dict[str, str], list[str], list[str]]:
    """swe_mini's hidden cases as test files (one per module), and which fail on the buggy code (FAIL_TO_PASS)."""
    from keelrl.tasks.swe_mini import _a, _call_args, _caught, _outcome

    files: dict[str, str] = {"tests/keel_runner.py": RUNNER}
    f2p, p2p = list[str](), list[str]()
    by_module: dict[str, list[tuple[str, str, Any]]] = {}
    for case in problem["hidden"]:
        (module, fn, *args), kwargs = _call_args(case["args"])
        by_module.setdefault(module, []).append((fn, _a(*args, **kwargs), case["expected"]))
    for module, cases in by_module.items():
        ns: dict[str, Any] = {}
        exec(compile(problem["files"][module.replace(".", "/") + ".py"], module, "exec"), ns)
        path = f"tests/test_hidden_{module.rsplit('.', 1)[1]}.py"
        names = sorted({fn for fn, _, _ in cases})
        body = [
            f"import json\n\nfrom {module} import {', '.join(names)}\n\n\ndef _j(value):\n    return json.loads(json.dumps(value))\n"
        ]
        count: dict[str, int] = {}
        for fn, args, expected in cases:
            count[fn] = k = count.get(fn, 0) + 1
            body.append(f"def test_{fn}_{k}():\n    assert _j({fn}({args})) == {expected!r}\n")
            (f2p if _caught(expected, _outcome(ns, fn, args)) else p2p).append(f"{path}::test_{fn}_{k}")
        files[path] = "\n\n".join(body)
    return files, f2p, p2p


def write_swe_mini(out: Path, count: int, seed: int = 0, split: Split = "train") -> Path:
    """swe_mini's first `count` problems of `split` as git repositories under out/repos and SWE-bench instances in
    out/instances.jsonl (returned)."""
    from keelrl.tasks.swe_mini import SweMiniParams, generate

    lines = []
    for i in range(count):
        p = generate(seed, split, i, SweMiniParams())
        iid = f"keelrl__{p['package']}-{i}"
        repo = out / "repos" / iid
        shutil.rmtree(repo, ignore_errors=True)

        def write(files: dict[str, str], repo: Path = repo) -> None:
            for rel, text in files.items():
                (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                (repo / rel).write_text(text, encoding="utf-8")

        write(p["files"])
        git(repo, "-c", "init.defaultBranch=main", "init", "-q")
        git(repo, "add", "-A")
        git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "base")
        base = git(repo, "rev-parse", "HEAD").strip()
        fix = p["fix"]
        write({fix["path"]: p["files"][fix["path"]].replace(fix["old"], fix["new"], 1)})
        gold = git(repo, "diff")
        git(repo, "checkout", "-q", "--", ".")
        tests, f2p, p2p = _hidden_tests(p)
        write(tests)
        git(repo, "add", "-A")
        test_patch = git(repo, "diff", "--cached")
        git(repo, "reset", "-q", "--hard")
        inst = {
            "instance_id": iid, "repo": f"keelrl/{p['package']}", "base_commit": base, "environment_setup_commit": base,
            "problem_statement": f"Bug report: {p['issue']}", "hints_text": "", "version": "0", "patch": gold,
            "test_patch": test_patch, "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),
            "image": "python:3.12-slim", "repo_path": f"repos/{iid}", "workdir": "/testbed",
            "setup": ["apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*"],
            "test_cmd": "python3 tests/keel_runner.py", "difficulty": p["family"],
        }  # fmt: skip
        lines.append(json.dumps(inst))
    (out / "instances.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "instances.jsonl"
