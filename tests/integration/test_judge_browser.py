"""keelrl judge driven by a real browser: headless Chromium, real key presses over the Chrome DevTools
Protocol (`Input.dispatchKeyEvent`), against `keelrl judge --session DIR` running as its own process. The
judge types their name, votes with the arrows, t, ArrowDown and s, undoes once, asks for the verifier's
verdict; the server is killed (SIGKILL) and started again on the same port, the page reloaded, and judging
continues to the end (the results view). The votes in the SQLite store must be exactly the key presses,
model text must render as text (an injected <img onerror> never runs), <think>/<answer> and multi-turn
transcripts must render as such, and the console must stay clean. Screenshots: test-artifacts/judge.png
(copied by hand to docs/judge.png for the README), test-artifacts/judge_results.png.

Needs Debian's `chromium` (apt-get install -y chromium); skipped without it. The DevTools websocket is spoken
by the small RFC 6455 client below (no extra package)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from keelrl.monitor.judge_store import JudgeStore, Pair

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)

PROMPT = "Using the numbers {nums}, write an equation that equals {target}. Use each number once."
# (numbers, target, text A, text B, A correct, B correct, A on the left)
ROWS = [
    (
        [3, 7, 25],
        46,
        "<think>25 + 7 = 32, 32 + 3 = 35: too small. 25 + 3 * 7 = 25 + 21 = 46.</think>\n<answer>25 + 3 * 7</answer>",
        "<think>7 * 3 = 21, 21 + 25 = 46</think>\n<answer>7 * 3 + 24</answer>",
        True,
        False,
        True,
    ),
    (
        [2, 9, 40],
        58,
        'done: <b>bold</b><img src=x onerror="window.__pwned = 1">',
        "<answer>40 + 9 * 2</answer>",
        False,
        True,
        False,
    ),
    (
        [4, 6, 11],
        35,
        "<|im_start|>assistant\n<think>try 6 * 4</think>calc(6 * 4 + 11)<|im_end|>\n<|im_start|>tool\n35<|im_end|>\n"
        "<|im_start|>assistant\n<answer>6 * 4 + 11</answer><|im_end|>",
        "<answer>11 * 4 - 6</answer>",
        True,
        False,
        True,
    ),
    ([5, 5, 10], 20, "<answer>5 + 5 + 10</answer>", "<answer>10 * 5 / 5 + 10</answer>", True, False, False),
    ([1, 8, 12], 21, "<answer>12 + 8 + 1</answer>", "<answer>12 + 8 + 1</answer>", True, True, True),
    ([3, 4, 30], 42, "<answer>30 + 3 * 4</answer>", "<answer>30 + 4 * 3 + 1</answer>", True, False, False),
    ([6, 7, 2], 44, "<answer>6 * 7 + 2</answer>", "<answer>7 * 6 + 2</answer>", True, True, True),
    ([9, 9, 1], 82, "<answer>9 * 9</answer>", "<answer>9 * 9 + 1</answer>", False, True, False),
]
MODELS = {"A": "runs/countdown_grpo/checkpoints/step_000200", "B": "runs/countdown_grpo/final", "C": "base"}
PAIRS_OF = [("A", "B"), ("B", "C"), ("A", "C"), ("A", "B"), ("B", "C"), ("A", "C"), ("A", "B"), ("B", "C")]
KEYS = {  # key -> (key, code, windows virtual key code, text)
    "ArrowLeft": ("ArrowLeft", "ArrowLeft", 37, ""),
    "ArrowRight": ("ArrowRight", "ArrowRight", 39, ""),
    "ArrowDown": ("ArrowDown", "ArrowDown", 40, ""),
    "Enter": ("Enter", "Enter", 13, "\r"),
    "t": ("t", "KeyT", 84, "t"),
    "s": ("s", "KeyS", 83, "s"),
    "u": ("u", "KeyU", 85, "u"),
    "v": ("v", "KeyV", 86, "v"),
}


class DevTools:
    """A minimal Chrome DevTools Protocol client over a websocket (RFC 6455: client frames masked, text
    frames, continuation frames, pings answered); events are kept in `events`."""

    def __init__(self, ws_url: str) -> None:
        url = urlparse(ws_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {url.path} HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        accept = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        )
        assert head.startswith(b"HTTP/1.1 101") and accept in head, head
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        size = (
            bytes([0x80 | n])
            if n < 126
            else bytes([0x80 | 126]) + struct.pack(">H", n)
            if n < 65536
            else bytes([0x80 | 127]) + struct.pack(">Q", n)
        )
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes([0x80 | opcode]) + size + mask + masked)

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            assert chunk, "DevTools closed the connection"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _message(self) -> dict[str, Any]:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)  # the server's frames are not masked
            opcode = b0 & 0x0F
            if opcode == 0x9:
                self._frame(0xA, payload)
                continue
            assert opcode in (0x0, 0x1, 0x2), f"DevTools sent websocket opcode {opcode}"
            parts.append(payload)
            if b0 & 0x80:
                return json.loads(b"".join(parts))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self._frame(0x1, json.dumps({"id": self.next_id, "method": method, "params": params}).encode())
        while True:
            msg = self._message()
            if msg.get("id") == self.next_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in res, res
        return res["result"].get("value")

    def press(self, name: str) -> None:
        key, code, vk, text = (
            KEYS[name] if name in KEYS else (name, f"Key{name.upper()}", ord(name.upper()), name)
        )
        down = {
            "type": "keyDown" if text else "rawKeyDown",
            "key": key,
            "code": code,
            "windowsVirtualKeyCode": vk,
        }
        self.call("Input.dispatchKeyEvent", **down, **({"text": text} if text else {}))
        self.call("Input.dispatchKeyEvent", type="keyUp", key=key, code=code, windowsVirtualKeyCode=vk)

    def wait(self, expression: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(f"(() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }})()")
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(
            f"timed out waiting for {expression}; page state: {self.js('JSON.stringify(document.body.dataset)')}"
        )

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and browser log errors seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in (
                "error",
                "warning",
                "assert",
            ):
                out.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif e.get("method") == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif e.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") in (
                "error",
                "warning",
            ):
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out


def make_session(path: Path) -> Path:
    store = JudgeStore(path / "session.sqlite")
    store.add_pairs(
        [
            Pair(
                i,
                i,
                {"numbers": nums, "target": t},
                PROMPT.format(nums=nums, target=t),
                *PAIRS_OF[i],
                a,
                b,
                ca,
                cb,
                left,
            )
            for i, (nums, t, a, b, ca, cb, left) in enumerate(ROWS)
        ]
    )
    store.set_meta(models=MODELS, settings={"task": "countdown", "problems": len(ROWS)}, created=time.time())
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(session: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`keelrl judge --session DIR --port P` as a process of its own; returns once it answers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "keelrl", "judge", "--session", str(session), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the judge server exited: {log.read_text()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
                return proc
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the judge server did not answer within 60 s: {log.read_text()}")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Callable[[], DevTools]]:
    """Headless Chromium with a DevTools port; yields a function connecting to its page."""
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", "--window-size=1400,900",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"]  # fmt: skip
    proc = subprocess.Popen(
        [CHROMIUM, *flags], stdout=subprocess.DEVNULL, stderr=(tmp_path / "chromium.log").open("wb")
    )
    active = profile / "DevToolsActivePort"

    def connect() -> DevTools:
        deadline = time.monotonic() + 60
        while not (active.is_file() and len(active.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "chromium.log"
            ).read_text()
            time.sleep(0.1)
        port = int(active.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as res:
            targets = json.loads(res.read())
        page = next(t for t in targets if t["type"] == "page")
        return DevTools(page["webSocketDebuggerUrl"])

    try:
        yield connect
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def expected_outcome(row: int, choice: str) -> str:
    if choice in ("tie", "skip"):
        return choice
    return "a" if (choice == "left") == ROWS[row][6] else "b"


def vote(cdp: DevTools, key: str, done_after: int) -> None:
    """Press `key` on the shown pair and wait until the page shows the stored result."""
    cdp.press(key)
    cdp.wait(f"document.body.dataset.busy === '0' && document.body.dataset.done === '{done_after}'")


def test_judge_page_in_chromium(browser: Callable[[], DevTools], tmp_path: Path) -> None:
    session = make_session(tmp_path / "session")
    port, log = free_port(), tmp_path / "server.log"
    server = start_server(session, port, log)
    try:
        cdp = browser()
        for domain in ("Runtime", "Page", "Log"):
            cdp.call(f"{domain}.enable")
        cdp.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
        cdp.wait("document.activeElement && document.activeElement.id === 'name'")
        for ch in "ann":
            cdp.press(ch)
        cdp.press("Enter")
        cdp.wait("document.body.dataset.pair === '0' && document.body.dataset.busy === '0'")
        assert cdp.js("localStorage.getItem('keelrl-judge-name')") == "ann"
        # pair 0: think and answer blocks drawn apart; the verifier's verdict only when asked
        assert cdp.js("document.querySelectorAll('#left .think').length") == 1
        assert cdp.js("document.querySelector('#left .answer').textContent") == "answer25 + 3 * 7"
        assert cdp.js("document.getElementById('v-left').textContent") == ""
        cdp.press("v")
        cdp.wait("document.getElementById('v-left').textContent === 'verifier: accepted'")
        assert cdp.js("document.getElementById('v-right').textContent") == "verifier: rejected"
        assert "runs/" not in cdp.js("document.body.innerText")  # no model name while judging
        ARTIFACTS.mkdir(exist_ok=True)
        shot = base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"])
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
        (ARTIFACTS / "judge.png").write_bytes(shot)

        presses = [
            ("ArrowLeft", "left"),
            ("ArrowRight", "right"),
            ("t", "tie"),
            ("s", "skip"),
            ("ArrowDown", "tie"),
        ]
        for k, (key, _) in enumerate(presses):
            if k == 1:  # pair 1: model text with markup shows as text and runs nothing
                assert "<img src=x" in cdp.js("document.querySelector('.sides').textContent")
                assert cdp.js("document.querySelectorAll('.sides img, .sides b').length") == 0
            if k == 2:  # pair 2: a multi-turn transcript, turn by turn
                roles = cdp.js("[...document.querySelectorAll('#left .turn > .tag')].map(x => x.textContent)")
                assert roles == ["assistant", "tool", "assistant"]
            vote(cdp, key, k + 1)
        vote(cdp, "ArrowLeft", 6)  # pair 5 ...
        vote(cdp, "u", 5)  # ... undone
        assert cdp.js("document.body.dataset.pair") == "5"

        server.send_signal(signal.SIGKILL)  # no goodbye: every acknowledged vote must already be stored
        server.wait(timeout=30)
        server = start_server(session, port, log)
        cdp.call("Page.reload")
        cdp.wait("document.body.dataset.pair === '5' && document.body.dataset.done === '5'")
        after = [("ArrowRight", "right"), ("ArrowLeft", "left"), ("s", "skip")]
        for k, (key, _) in enumerate(after):
            vote(cdp, key, 6 + k)
        cdp.wait("document.body.dataset.pair === 'none'")
        cdp.wait("document.querySelectorAll('#results table').length === 2")
        text = cdp.js("document.getElementById('results').innerText")
        assert "runs/countdown_grpo/final" in text and "base" in text  # names revealed in results only
        (ARTIFACTS / "judge_results.png").write_bytes(
            base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"])
        )

        assert cdp.js("window.__pwned === undefined")
        assert cdp.problems() == []
        cdp.js("console.error('control')")  # the console check is not vacuous
        cdp.call("Runtime.evaluate", expression="1")  # let the event arrive
        assert any("control" in p for p in cdp.problems())
    finally:
        server.terminate()
        server.wait(timeout=30)

    choices = [c for _, c in presses] + [c for _, c in after]
    want = [(i, expected_outcome(i, c)) for i, c in enumerate(choices)]
    assert [(v.pair_id, v.outcome) for v in JudgeStore(session / "session.sqlite").votes("ann")] == want
    # only pair 0's vote was cast after pressing v (the page passes the judge with its verdict request)
    assert [v.verdict_seen for v in JudgeStore(session / "session.sqlite").votes("ann")] == [True] + [
        False
    ] * 7
    assert {v.judge for v in JudgeStore(session / "session.sqlite").votes()} == {"ann"}
