"""The judge page's local HTTP server: the page, and a small JSON API over a session's store.

Endpoints (JSON in and out; a bad request gets 400 with `{"error": message}`):
- `GET /`: the page, `page.html` beside this file: one self-contained document (inline CSS and JS, nothing
  fetched but this JSON API). Model text is only ever put in it as text nodes (`textContent`), never as HTML,
  so a completion that contains markup shows as markup; `<think>` and `<answer>` blocks are drawn as distinct
  boxes, and role-tagged turns (`<|im_start|>role ... <|im_end|>`, as rollout/episodes.py writes a multi-turn
  episode) as a transcript. Keyboard first: ArrowLeft / ArrowRight (that side is better), ArrowDown or t
  (tie), s (skip), u or Backspace (undo), v (the verifier's verdict); keys pressed while a request is in
  flight are ignored, so one press is at most one vote. The model names and results appear only once the
  session is finished; until then the page says whom it waits for and asks again every few seconds.
  `document.body.dataset` exposes its state (pair, done, busy, results: waiting or shown) for tests.
- `GET /api/state?judge=NAME`: progress (done, total: the pairs with two different texts) and the judge's next
  pair: id, prompt, left and right texts. Never the model names, nor which side is A: the page cannot leak
  what it never receives. Pairs with identical texts are never served (each is a tie, `judge_store`).
- `POST /api/vote {judge, pair_id, choice: left|right|tie|skip}`: mapped to outcome a/b through the pair's
  sides and committed to SQLite before the answer is sent (a killed server loses no acknowledged vote);
  answers with the new state.
- `POST /api/undo {judge}`: deletes the judge's newest vote; answers with the new state.
- `GET /api/verdict?pair=ID&judge=NAME`: the verifier's verdict on the left and right completions (hidden until
  asked); the judge's vote on that pair is then stored as cast with the verdict seen.
- `GET /api/results`: once the session is finished (every judge who voted has judged every pair,
  `judge_store.finished`), `judge.results` (names revealed); before, only `{"finished": false, "progress":
  {judge: done}, "total", "identical_pairs"}`: nothing that ties a model to a side or a name.
The server is stateless beyond the store, so stopping it and starting another on the same session resumes
every judge exactly where their votes say.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from keelrl.judge.store import JudgeStore, Pair, finished

CHOICES = ("left", "right", "tie", "skip")
MAX_BODY = 64 * 1024
MAX_NAME = 80


class BadRequest(ValueError):
    """The request is malformed or names something the session does not have (-> 400)."""


def judge_name(value: Any) -> str:
    """A judge's name, stripped; a BadRequest if missing, not text, or too long."""
    if not isinstance(value, str) or not value.strip():
        raise BadRequest("a judge name is required (the page asks for it once)")
    name = value.strip()
    if len(name) > MAX_NAME:
        raise BadRequest(f"a judge name is at most {MAX_NAME} characters, got {len(name)}")
    return name


def outcome_of(pair: Pair, choice: str) -> str:
    """The page's choice (which side was better) as the stored outcome (a, b, tie, skip)."""
    if choice not in CHOICES:
        raise BadRequest(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice in ("tie", "skip"):
        return choice
    return "a" if (choice == "left") == pair.a_on_left else "b"


class JudgeApp:
    """The API's logic over one session's store (pairs cached: they never change after creation)."""

    def __init__(self, session_dir: str | Path) -> None:
        from keelrl.judge.session import open_session

        self.session_dir = Path(session_dir)
        self.store: JudgeStore = open_session(session_dir)
        self.pairs = {p.id: p for p in self.store.pairs()}

    def pair(self, value: Any) -> Pair:
        try:
            pid = int(value)
        except (TypeError, ValueError):
            raise BadRequest(f"pair id must be an integer, got {value!r}") from None
        if pid not in self.pairs:
            raise BadRequest(f"no pair {pid} in this session")
        return self.pairs[pid]

    def state(self, judge: str) -> dict[str, Any]:
        voted = {v.pair_id for v in self.store.votes(judge)}
        todo = [p for p in self.pairs.values() if not p.identical]
        p = next((p for p in todo if p.id not in voted), None)
        shown = None
        if p is not None:
            left, right = (p.text_a, p.text_b) if p.a_on_left else (p.text_b, p.text_a)
            shown = {"id": p.id, "problem": p.problem_index, "prompt": p.prompt, "left": left, "right": right}
        return {"judge": judge, "done": sum(p.id in voted for p in todo), "total": len(todo), "pair": shown}

    def vote(self, body: dict[str, Any]) -> dict[str, Any]:
        judge = judge_name(body.get("judge"))
        pair = self.pair(body.get("pair_id"))
        outcome = outcome_of(pair, str(body.get("choice")))
        if pair.identical:
            raise BadRequest(f"pair {pair.id} has identical texts: it is recorded as a tie, not judged")
        self.store.vote(pair.id, judge, outcome)  # committed here
        return self.state(judge)

    def undo(self, body: dict[str, Any]) -> dict[str, Any]:
        judge = judge_name(body.get("judge"))
        undone = self.store.undo(judge)
        return {**self.state(judge), "undone": undone}

    def verdict(self, pair_value: Any, judge: str) -> dict[str, Any]:
        p = self.pair(pair_value)
        self.store.mark_verdict_shown(p.id, judge)
        left, right = (p.correct_a, p.correct_b) if p.a_on_left else (p.correct_b, p.correct_a)
        return {"id": p.id, "left": left, "right": right}

    def results(self) -> dict[str, Any]:
        from keelrl.judge.session import results

        votes = self.store.votes()
        if finished(list(self.pairs.values()), votes):
            return results(self.session_dir, resamples=200)
        todo = {p.id for p in self.pairs.values() if not p.identical}
        progress = {v.judge: 0 for v in votes}
        for v in votes:
            progress[v.judge] += v.pair_id in todo
        identical = len(self.pairs) - len(todo)
        return {"finished": False, "progress": progress, "total": len(todo), "identical_pairs": identical}


def _handler(app: JudgeApp) -> type[BaseHTTPRequestHandler]:
    page = (Path(__file__).parent / "page.html").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        server_version = "keelrl-judge"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the terminal shows the URL, not a line per request

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: dict[str, Any]) -> None:
            self._send(status, json.dumps(data).encode(), "application/json")

        def _body(self) -> dict[str, Any]:
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                raise BadRequest(f"request body over {MAX_BODY} bytes")
            try:
                data = json.loads(self.rfile.read(size) or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise BadRequest(f"request body is not JSON ({err})") from None
            if not isinstance(data, dict):
                raise BadRequest("request body must be a JSON object")
            return data

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if method == "GET" and url.path in ("/", "/index.html"):
                    self._send(200, page, "text/html; charset=utf-8")
                elif method == "GET" and url.path == "/api/state":
                    self._json(200, app.state(judge_name(query.get("judge"))))
                elif method == "GET" and url.path == "/api/verdict":
                    self._json(200, app.verdict(query.get("pair"), judge_name(query.get("judge"))))
                elif method == "GET" and url.path == "/api/results":
                    self._json(200, app.results())
                elif method == "POST" and url.path == "/api/vote":
                    self._json(200, app.vote(self._body()))
                elif method == "POST" and url.path == "/api/undo":
                    self._json(200, app.undo(self._body()))
                else:
                    self._json(404, {"error": f"no {method} {url.path} here"})
            except BadRequest as err:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
            except sqlite3.Error as err:  # the page says the vote was not stored; the server keeps serving
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"the session store failed: {err}"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


class JudgeServer:
    """A judge server on (host, port) (port 0: any free one) running on a background thread."""

    def __init__(self, session_dir: str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = JudgeApp(session_dir)
        try:
            self.httpd = ThreadingHTTPServer((host, port), _handler(self.app))
        except OSError as err:
            from keelrl.judge.session import JudgeError

            raise JudgeError(
                f"cannot serve on {host}:{port} ({err}); pick another --port (0 = any free one)"
            ) from None
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> JudgeServer:
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.05,), name="keelrl-judge", daemon=True
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.thread is not None:
            self.thread.join(timeout=10)

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(session_dir: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the session's page until Ctrl-C (every vote is already stored when it is acknowledged)."""
    server = JudgeServer(session_dir, host, port)
    done = len(server.app.store.votes())
    print(
        f"judge page: {server.url}  ({len(server.app.pairs)} pairs, {done} votes so far; Ctrl-C stops)",
        flush=True,
    )
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a session is stopped, not an error
    finally:
        server.httpd.server_close()
