"""Headless Chromium for the browser tests (the report, the judge page): `open_browser` starts Debian's
`chromium` with a DevTools port, and `DevTools` speaks the Chrome DevTools Protocol over its websocket (the
small RFC 6455 client below: no extra package), to press real keys, move the mouse and evaluate JavaScript."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

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

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to (x, y) CSS pixels of the viewport."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, x: float, y: float) -> None:
        """A left click at (x, y)."""
        self.hover(x, y)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def drag(self, start: tuple[float, float], end: tuple[float, float], moves: int = 8) -> None:
        """Press the left button at `start`, move to `end` in `moves` steps, release."""
        self.hover(*start)
        self.call(
            "Input.dispatchMouseEvent",
            type="mousePressed",
            x=start[0],
            y=start[1],
            button="left",
            clickCount=1,
        )
        for i in range(1, moves + 1):
            x, y = (a + (b - a) * i / moves for a, b in zip(start, end))
            self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y, button="left", buttons=1)
        self.call(
            "Input.dispatchMouseEvent", type="mouseReleased", x=end[0], y=end[1], button="left", clickCount=1
        )


@contextmanager
def open_browser(tmp_path: Path, size: str = "1400,900") -> Iterator[Callable[[], DevTools]]:
    """Headless Chromium with a DevTools port; yields a function connecting to its page."""
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", f"--window-size={size}",
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
