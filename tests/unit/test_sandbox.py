"""Security and behaviour tests of keelrl.sandbox, run under every isolation level available here.

Each test id says the level (`[isolation=bwrap]`), the level is recorded as a junit property, and a level
that does not work on this machine is skipped with the reason. Every attack is checked from the
outside: the test process survives, the host filesystem / sockets / processes show no effect, and the
result carries a status and a reason. Tests start and stop only their own helper processes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest

from keelrl.sandbox import execute, harness, isolation, result
from keelrl.sandbox.execute import Sandbox
from keelrl.sandbox.judge import calls_of, judge
from keelrl.sandbox.pool import SandboxPool
from keelrl.sandbox.result import LEVELS, Call, Job, SandboxError, SandboxLimits

IS_ROOT = os.geteuid() == 0
LIMITS = SandboxLimits(wall_s=3.0)
SHORT = SandboxLimits(wall_s=1.0)


def _level_box(level: str) -> Sandbox:
    why = execute.probe(level)  # type: ignore[arg-type]
    if why is not None:
        pytest.skip(f"isolation {level!r} is not available here: {why}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", result.SandboxWarning)
        return Sandbox(level, LIMITS)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=LEVELS, ids=lambda lv: f"isolation={lv}")
def box(request: pytest.FixtureRequest):
    b = _level_box(request.param)
    print(f"\nsandbox isolation level under test: {b.level} (code runs as uid {b.uid})")
    yield b
    b.close()


@pytest.fixture(autouse=True)
def _record_isolation(request: pytest.FixtureRequest, record_property) -> None:
    if "box" in request.fixturenames:
        record_property("isolation", request.getfixturevalue("box").level)


def processes_matching(marker: str) -> list[str]:
    """Command lines of live processes that contain `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(f"{name}: {cmd}")
    return found


def weak_uid(box: Sandbox) -> bool:
    """rlimit level without a separate uid: the code runs as the test's own user."""
    return box.level == "rlimit" and box.uid is None


# ------------------------------------------------------------------------------------- resource attacks


def test_fork_bomb_is_contained(box: Sandbox) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r = box.run(code, limits=SHORT)
    assert r.status == "timeout", r
    assert time.monotonic() - t0 < SHORT.wall_s + 5
    assert processes_matching(r.exec_id) == [], "fork bomb children survived the call"
    assert subprocess.run(["true"], check=False).returncode == 0  # the caller can still fork


def test_process_count_is_capped(box: Sandbox) -> None:
    code = (
        "import os, time\nforked = 0\ntry:\n    for _ in range(1000):\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        forked += 1\nexcept OSError:\n    pass\n"
        "def forks():\n    return forked\n"
    )
    limit = SandboxLimits(wall_s=3.0, processes=6)
    r = box.run(code, "forks", [""], limits=limit)
    assert r.status == "ok", r
    assert 0 <= int(r.answers[0].text) < 6
    assert processes_matching(r.exec_id) == []


def test_memory_bomb_is_contained(box: Sandbox) -> None:
    r = box.run("x = bytearray(16 * 1024 ** 3)\n")
    assert r.status == "memory", r
    r = box.run("chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n")
    assert r.status == "memory", r
    assert "MemoryError" in r.detail


def test_infinite_loop_hits_the_wall_clock(box: Sandbox) -> None:
    t0 = time.monotonic()
    r = box.run("while True:\n    pass\n", limits=SHORT)
    assert r.status == "timeout" and "wall-clock" in r.detail, r
    assert SHORT.wall_s <= time.monotonic() - t0 < SHORT.wall_s + 5
    r = box.run("import time\ntime.sleep(1000)\n", limits=SHORT)
    assert r.status == "timeout", r


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock(box: Sandbox) -> None:
    r = box.run("while True:\n    pass\n", limits=SandboxLimits(wall_s=20.0, cpu_s=1.0))
    assert r.status == "timeout" and "CPU" in r.detail, r
    assert r.wall_s < 15


@pytest.mark.parametrize("then", ["return", "spin"])
def test_busy_children_are_gone_after_the_call(box: Sandbox, then: str) -> None:
    marker = f"keelrl-test-orphan-{secrets.token_hex(6)}"
    code = (
        "import os\n"
        "for detach in (False, True):\n"
        "    if os.fork() == 0:\n"
        "        if detach:\n"
        "            os.setsid()\n"
        "            if os.fork() != 0:\n"
        "                os._exit(0)\n"
        f"        os.execv('/bin/sh', ['sh', '-c', 'while :; do :; done', {marker!r}])\n"
        "import time\ntime.sleep(0.3)\n" + ("while True:\n    pass\n" if then == "spin" else "")
    )
    # "return" shares the cores with two spinners: the longer limit
    r = box.run(code, limits=SHORT if then == "spin" else LIMITS)
    assert r.status == ("ok" if then == "return" else "timeout"), r
    assert processes_matching(marker) == [], "busy children outlived the call"
    assert processes_matching(r.exec_id) == []


def test_huge_output_is_cut(box: Sandbox) -> None:
    t0 = time.monotonic()
    r = box.run("while True:\n    print('x' * 10000)\n")
    assert r.status == "output_limit", r
    assert len(r.stdout) <= LIMITS.excerpt_chars
    r = box.run("import sys\nwhile True:\n    sys.stderr.write('y' * 10000)\n")
    assert r.status == "output_limit", r
    assert time.monotonic() - t0 < 2 * LIMITS.wall_s


# --------------------------------------------------------------------------------- escaping attempts


@pytest.fixture
def run_dir():
    """A stand-in for a run directory (world-readable, like a real one) with a checkpoint in it."""
    path = Path(f"/var/tmp/keelrl-test-run-{secrets.token_hex(6)}")
    (path / "checkpoints").mkdir(parents=True)
    for p in (path, path / "checkpoints"):
        p.chmod(0o755)
    (path / "checkpoints" / "state.json").write_text('{"step": 3}')
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_cannot_write_run_dir_or_other_paths(box: Sandbox, run_dir: Path) -> None:
    tag = secrets.token_hex(6)
    import keelrl

    targets = [
        run_dir / "pwned",
        run_dir / "checkpoints" / "pwned",
        Path(keelrl.__file__).parent / f"pwned-{tag}",
    ]
    if box.level != "rlimit":  # world-writable directories are writable at the rlimit level (documented)
        targets += [Path(f"/tmp/keelrl-pwned-{tag}"), Path(f"/var/tmp/keelrl-pwned-{tag}")]
    state = run_dir / "checkpoints" / "state.json"
    code = (
        "import os, shutil\n"
        f"for p in {[str(t) for t in targets]!r}:\n"
        "    try:\n        open(p, 'w').write('pwned')\n        print('WROTE', p)\n"
        "    except OSError as e:\n        print('blocked', p, e)\n"
        f"for action in (lambda: open({str(state)!r}, 'w').write('{{}}'), lambda: os.remove({str(state)!r}),\n"
        f"               lambda: shutil.rmtree({str(run_dir)!r})):\n"
        "    try:\n        action()\n    except OSError as e:\n        print('blocked', e)\n"
    )
    r = box.run(code)
    try:
        assert r.status == "ok", r
        for t in targets:
            assert not t.exists(), f"sandboxed code wrote {t} under {box.level}"
        assert state.read_text() == '{"step": 3}', "checkpoint was modified"
        assert "WROTE" not in r.stdout
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_code_does_not_run_as_root(box: Sandbox) -> None:
    if not IS_ROOT:
        pytest.skip("the test process is not root")
    if box.uid is None:
        pytest.skip("no separate uid available (documented: rlimit level without a world-usable python)")
    r = box.run("import os\ndef uid():\n    return os.getuid()\n", "uid", [""])
    assert r.status == "ok" and r.answers[0].text == str(box.uid), r


def test_environment_secrets_are_not_visible(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"keelrl-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("KEELRL_TEST_SECRET", secret)
    helper = subprocess.Popen(["sleep", "30"], env={**os.environ, "KEELRL_TEST_SECRET": secret})
    try:
        paths = ["/proc/self/environ", "/proc/1/environ", "/proc/2/environ"]
        if not weak_uid(box):  # same user: /proc/PID/environ is readable by design at that level
            paths += [f"/proc/{helper.pid}/environ", f"/proc/{os.getpid()}/environ"]
        code = (
            "import os\nprint(dict(os.environ))\n"
            f"for p in {paths!r}:\n"
            "    try:\n        print(p, open(p, 'rb').read())\n    except OSError as e:\n        print(p, e)\n"
        )
        r = box.run(code, limits=SandboxLimits(wall_s=3.0, excerpt_chars=100_000))
        assert r.status == "ok", r
        assert "/proc/self/environ" in r.stdout  # the probe really ran
        assert secret not in r.stdout + r.stderr
        assert set(eval(r.stdout.splitlines()[0])) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD"}
    finally:
        helper.kill()
        helper.wait()


def test_no_connection_to_host_loopback(box: Sandbox) -> None:
    if box.level == "rlimit":
        pytest.skip("the rlimit level does not isolate the network (documented; detection warns)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'pwned')\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n    print('blocked', e)\n"
        )
        r = box.run(code)
        assert r.status == "ok", r
        assert "blocked" in r.stdout and "CONNECTED" not in r.stdout
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            listener.accept()


@pytest.fixture
def unix_servers():
    """Listening Unix sockets of a stand-in host daemon, world-writable: in a world-readable directory
    under /run (where host daemons keep theirs), directly in /tmp, and one in the abstract namespace (a name starting with NUL)."""
    tag = secrets.token_hex(6)
    home = Path(f"/run/keelrl-test-daemon-{tag}")
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    addresses = [str(home / "daemon.sock"), f"/tmp/keelrl-test-daemon-{tag}.sock", f"\0keelrl-test-{tag}"]
    servers = []
    for address in addresses:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)
        s.listen(8)
        s.settimeout(0.2)
        servers.append(s)
    yield dict(zip(addresses, servers))
    for s in servers:
        s.close()
    Path(addresses[1]).unlink(missing_ok=True)
    shutil.rmtree(home, ignore_errors=True)


def test_no_connection_to_host_unix_sockets(box: Sandbox, unix_servers: dict) -> None:
    if box.level == "rlimit":
        pytest.skip("the rlimit level has no namespaces: host Unix sockets are reachable (documented)")
    code = (
        "import socket\n"
        f"for address in {list(unix_servers)!r}:\n"
        "    try:\n"
        "        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "        s.settimeout(1)\n"
        "        s.connect(address)\n"
        "        s.sendall(b'pwned')\n"
        "        print('CONNECTED', repr(address))\n"
        "    except OSError as e:\n"
        "        print('blocked', repr(address), e)\n"
    )
    r = box.run(code)
    assert r.status == "ok", r
    assert r.stdout.count("blocked") == len(unix_servers) and "CONNECTED" not in r.stdout, r.stdout
    for server in unix_servers.values():
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the host's listener


def test_hidden_paths_are_covered_inside_the_root(box: Sandbox) -> None:
    """A secret where the sandbox's root would show it (an answer key installed under /usr, here /etc)."""
    if box.level == "rlimit":
        pytest.skip("the rlimit level cannot hide world-readable files (documented)")
    if not IS_ROOT:
        pytest.skip("needs root to place a file under /etc")
    secret = Path(f"/etc/keelrl-test-answers-{secrets.token_hex(6)}.jsonl")
    secret.write_text("the answer key\n")
    secret.chmod(0o644)
    try:
        with Sandbox(box.level, LIMITS, hide=[str(secret)]) as hiding:
            code = f"def peek():\n    return open({str(secret)!r}).read()\n"
            shown, hidden = box.run(code, "peek", [""]), hiding.run(code, "peek", [""])
        assert shown.answers[0].text == '"the answer key\\n"', shown  # the test can see it without `hide`
        assert "the answer key" not in str(hidden.answers), hidden
    finally:
        secret.unlink()


def test_killing_the_parent_does_not_reach_the_caller(box: Sandbox) -> None:
    if weak_uid(box):
        pytest.skip("without a separate uid the rlimit level cannot stop kill(-1) (documented)")
    helper = subprocess.Popen(["sleep", "30"])
    try:
        code = (
            "import os, signal\n"
            f"for pid in (os.getppid(), 1, {os.getpid()}, {helper.pid}, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('sent', pid)\n"
            "    except OSError as e:\n        print('blocked', pid, e)\n"
            "def alive():\n    return True\n"
        )
        r = box.run(code, "alive", [""])
        assert r.status == "ok" and r.answers[0].text == "true", r  # the harness survived and reported
        assert helper.poll() is None, "a process of the caller was killed"
        os.kill(os.getpid(), 0)  # and so did we (we would not be here otherwise)
    finally:
        helper.kill()
        helper.wait()


def test_ctypes_misuse_is_a_crash(box: Sandbox) -> None:
    r = box.run("import ctypes\nctypes.string_at(0)\n")
    assert r.status == "crash", r
    assert "SIGSEGV" in r.detail
    r = box.run("def f():\n    import ctypes\n    ctypes.memset(16, 0, 64)\n", "f", ["", ""])
    assert r.status == "crash", r
    assert r.answers == (None, None)


# ---------------------------------------------------------------------------------- forging results


SQUARES = [{"args": "2", "expected": 4}, {"args": "3", "expected": 9}]


def test_forged_results_do_not_count(box: Sandbox) -> None:
    """What the code does in its own process is at most its answer: the judge compares outside."""
    fake_lines = (
        "".join(f"{'0' * 32} answer {i} value {(i + 2) ** 2}\n" for i in range(2)) + "ok 2/2 passed\n"
    )
    attacks = {
        "print": f"import sys\nsys.stdout.write({fake_lines!r})\nsys.stderr.write({fake_lines!r})\ndef f(x):\n    return 0\n",
        "write_all_fds": (
            f"import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, {fake_lines.encode()!r})\n"
            "    except OSError:\n        pass\ndef f(x):\n    return 0\n"
        ),
        "exit_in_call": "import sys\ndef f(x):\n    sys.exit(0)\n",
        "os_exit_in_call": "import os\ndef f(x):\n    os._exit(0)\n",
        "os_exit_top": "import os\nos._exit(0)\n",
        "keyboard_interrupt": "def f(x):\n    raise KeyboardInterrupt\n",
        "always_equal": "class A:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return A()\n",
        "int_subclass": "class I(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return I(0)\n",
        "patch_builtins": (
            "import builtins, json\nbuiltins.isinstance = lambda *a: True\njson.loads = lambda s: 4\n"
            "def f(x):\n    return x\n"
        ),
        "close_fds": "import os\nos.closerange(3, 1024)\ndef f(x):\n    return x * x\n",
    }
    for name, code in attacks.items():
        r = box.run(code, "f", calls_of(SQUARES))
        verdict = judge(SQUARES, r, "f")
        assert not verdict.ok and verdict.passed < 2, (name, r, verdict)
        assert verdict.reason in ("wrong_answer", "crash"), (name, r)


def test_honest_results(box: Sandbox) -> None:
    ok = box.run("def f(x):\n    return x * x\n", "f", ["2", "3"])
    assert (ok.status, ok.total, ok.isolation) == ("ok", 2, box.level)
    assert [a.text for a in ok.answers] == ["4", "9"] and judge(SQUARES, ok, "f").ok
    assert ok.cpu_s is not None and ok.wall_s > 0
    half = judge(SQUARES, box.run("def f(x):\n    return x + 2\n", "f", ["2", "3"]), "f")
    assert (half.reason, half.passed) == ("wrong_answer", 1)
    assert half.detail == "case 1 `f(3)`: expected 9, returned 5"
    odd = box.run("def f(x):\n    if x:\n        return {1, 2}\n    raise KeyError(x)\n", "f", ["1", "0"])
    assert (
        odd.status == "ok" and odd.answers[0].kind == "invalid" and "set is not JSON" in odd.answers[0].text
    )
    assert odd.answers[1].raised == ("KeyError", "LookupError", "Exception", "BaseException")
    syntax = box.run("def f(x) return x", "f", ["1"])
    assert syntax.status == "syntax_error" and "SyntaxError" in syntax.detail
    boom = box.run("raise ValueError('at import')")
    assert boom.status == "runtime_error" and "at import" in boom.detail
    printed = box.run("print('hello')\nimport sys\nprint('oops', file=sys.stderr)\n")
    assert (printed.status, printed.stdout, printed.stderr) == ("ok", "hello\n", "oops\n")


def test_answers_are_bounded_and_arguments_can_be_shown(box: Sandbox) -> None:
    code = "def f(xs, n=1):\n    xs.append(n)\n    return 'x' * n\n"
    r = box.run(code, "f", [Call("[0]", show_args=True), "[], 10 ** 6"], SandboxLimits(answer_bytes=1000))
    assert r.status == "ok", r
    assert (r.answers[0].text, r.answers[0].args_after) == ('"x"', "[[0,1]]")
    assert r.answers[1].kind == "invalid" and "over 1000 bytes" in r.answers[1].text


# -------------------------------------------------------------------------------- pool and detection


def test_pool_runs_in_parallel_and_keeps_order() -> None:
    with SandboxPool(2, queue_size=2) as pool:
        jobs = [Job(f"print({i})\ndef f():\n    return {i}\n", "f", [""]) for i in range(6)]
        results = pool.run_many(jobs)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert [r.answers[0].text for r in results] == [str(i) for i in range(6)]
    assert all(r.status == "ok" and r.isolation == pool.level for r in results)


def test_pool_queue_is_bounded() -> None:
    with SandboxPool(1, queue_size=1) as pool:
        started, release = threading.Event(), threading.Event()
        run = pool._boxes[0].run

        def held(*args, **kwargs):  # type: ignore[no-untyped-def]
            started.set()
            assert release.wait(30)
            return run(*args, **kwargs)

        pool._boxes[0].run = held  # type: ignore[method-assign]
        slow = Job("pass\n")
        first = pool.submit(slow)
        assert started.wait(30)  # the worker has taken the first job and holds it
        second = pool.submit(slow)  # fills the queue
        third: list = []
        t = threading.Thread(target=lambda: third.append(pool.submit(Job("pass"))))
        t.start()
        t.join(0.3)
        assert t.is_alive(), "submit did not block on a full queue"
        release.set()
        t.join(10)
        assert [f.result().status for f in (first, second, third[0])] == ["ok", "ok", "ok"]


def test_explicit_unknown_or_unavailable_level_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SandboxError, match="unknown isolation"):
        Sandbox("docker")  # type: ignore[arg-type]
    monkeypatch.setitem(execute._probe_results, "bwrap", "`bwrap` is not installed")
    with pytest.raises(SandboxError, match="not available here: `bwrap` is not installed"):
        Sandbox("bwrap")


def test_auto_detection_degrades_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    if execute.probe("unshare") is not None and execute.probe("rlimit") is not None:
        pytest.skip("neither fallback level works here")
    monkeypatch.setitem(execute._probe_results, "bwrap", "`bwrap` is not installed (simulated)")
    monkeypatch.setattr(isolation, "_warned", set())
    with pytest.warns(result.SandboxWarning, match="simulated"):
        level = execute.detect_isolation()
    assert level in ("unshare", "rlimit")


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=8)
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)
    assert SandboxLimits(wall_s=2.5).cpu_seconds == 3


def test_signal_names_cover_crashes() -> None:
    assert result._SIGNAMES[int(signal.SIGSEGV)] == "SIGSEGV"


def test_harness_call_loop_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's call loop, called here (no sandbox): one answer record per call (JSON, the
    exception's built-in classes, or why the value is not JSON), then `done` and os._exit(0)."""

    class Exited(Exception):
        pass

    def fake_exit(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    lines: list[str] = []
    code = "class Eq:\n    def __eq__(self, other):\n        return True\n\ndef f(x):\n    return Eq() if x < 0 else (x, x + 1)\n"
    job = {
        "code": code,
        "entry_point": "f",
        "calls": [("1", False), ("-1", False), ("'a'", True)],
        "answer_bytes": 100,
    }
    with pytest.raises(Exited, match="0"):
        harness._run(job, lambda kind, text="": lines.append(f"{kind} {text}"), lines.append)
    assert [t[:90] for t in lines] == [
        "answer 0 value [1,2]",
        "answer 1 invalid TypeError: Eq is not JSON data",
        "answer 2 raised TypeError,Exception,BaseException TypeError: '<' not supported between ins",
        "done ",
    ]
