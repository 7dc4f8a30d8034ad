"""keelrl judge driven by a real browser: headless Chromium, real key presses over the Chrome DevTools
Protocol (`Input.dispatchKeyEvent`), against `keelrl judge --session DIR` running as its own process. The
judge types their name, votes with the arrows, t, ArrowDown and s, undoes once, asks for the verifier's
verdict; the server is killed (SIGKILL) and started again on the same port, the page reloaded, and judging
continues to the end (the results view). A pair whose two texts are identical is never shown (a tie nobody
is asked about, counted in the results); mid-session the results API names no model, and the results view
waits for a second judge to finish before it reveals the names. The votes in the SQLite store must be exactly the key presses,
model text must render as text (an injected <img onerror> never runs), <think>/<answer> and multi-turn
transcripts must render as such, and the console must stay clean. Screenshots: test-artifacts/judge.png
(copied by hand to docs/judge.png for the README), test-artifacts/judge_results.png.

Needs Debian's `chromium` (apt-get install -y chromium); skipped without it. The DevTools client is
cdp_browser.py's."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cdp_browser import CHROMIUM, DevTools, open_browser

from keelrl.judge.store import JudgeStore, Pair

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"

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
    with open_browser(tmp_path) as connect:
        yield connect


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
        shown = [0, 1, 2, 3, 5, 6, 7]  # pair 4's two texts are identical: a tie nobody is asked about
        for k, (key, _) in enumerate(presses):
            assert cdp.js("document.body.dataset.pair") == str(shown[k])
            if k == 1:  # pair 1: model text with markup shows as text and runs nothing
                assert "<img src=x" in cdp.js("document.querySelector('.sides').textContent")
                assert cdp.js("document.querySelectorAll('.sides img, .sides b').length") == 0
            if k == 2:  # pair 2: a multi-turn transcript, turn by turn
                roles = cdp.js("[...document.querySelectorAll('#left .turn > .tag')].map(x => x.textContent)")
                assert roles == ["assistant", "tool", "assistant"]
            vote(cdp, key, k + 1)
        assert cdp.js("document.getElementById('count').textContent") == "5 / 7"
        # mid-session the results API names no model and says nothing of the outcomes
        mid = cdp.js("fetch('/api/results').then(r => r.text())")
        assert json.loads(mid) == {
            "finished": False,
            "progress": {"ann": 5},
            "total": 7,
            "identical_pairs": 1,
        }
        vote(cdp, "ArrowLeft", 6)  # pair 6 ...
        vote(cdp, "u", 5)  # ... undone
        assert cdp.js("document.body.dataset.pair") == "6"

        server.send_signal(signal.SIGKILL)  # no goodbye: every acknowledged vote must already be stored
        server.wait(timeout=30)
        server = start_server(session, port, log)
        cdp.call("Page.reload")
        cdp.wait("document.body.dataset.pair === '6' && document.body.dataset.done === '5'")
        store = JudgeStore(session / "session.sqlite")
        store.vote(0, "bob", "tie")  # a second judge has begun: the session is not over when ann is done
        after = [("ArrowRight", "right"), ("ArrowLeft", "left")]
        for k, (key, _) in enumerate(after):
            vote(cdp, key, 6 + k)
        cdp.wait("document.body.dataset.pair === 'none' && document.body.dataset.results === 'waiting'")
        waiting = cdp.js("document.getElementById('results').innerText")
        assert "waiting for bob 1/7" in waiting and "runs/" not in waiting and "base" not in waiting
        for pid in shown[1:]:  # bob finishes; the page, asking again every 5 s, shows the results
            store.vote(pid, "bob", "tie")
        cdp.wait("document.body.dataset.results === 'shown'", timeout=30)
        assert cdp.js("document.querySelectorAll('#results table').length") == 2
        text = cdp.js("document.getElementById('results').innerText")
        assert "runs/countdown_grpo/final" in text and "base" in text  # names revealed once finished
        assert "recorded as ties without asking: 1." in text
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
    want = [(i, expected_outcome(i, c)) for i, c in zip(shown, choices, strict=True)]
    assert [(v.pair_id, v.outcome) for v in JudgeStore(session / "session.sqlite").votes("ann")] == want
    # only pair 0's vote was cast after pressing v (the page passes the judge with its verdict request)
    assert [v.verdict_seen for v in JudgeStore(session / "session.sqlite").votes("ann")] == [True] + [
        False
    ] * 6
    assert {v.judge for v in JudgeStore(session / "session.sqlite").votes()} == {"ann", "bob"}
