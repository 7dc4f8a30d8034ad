"""The policy behind an OpenAI-style client: environments that drive the model themselves, and a second seat.

**Driven environments.** Some environments own their loop and call the model when they want a turn, as the
`verifiers` library's `env.rollout(client, ...)` does: `rollout(client, problem, seed)` (sync or `async def`)
calls `client.chat.completions.create(messages=[...])` (awaited when `rollout` is async, as with
`AsyncOpenAI`) and returns the episode's reward (a number, counted correct when >= 1, or a `Score`).
`Driven` plays such an environment through keelrl's own episode machinery (rollout/multiturn.py): its
`rollout` runs in the background (on keelrl's event loop, or on a thread of its own when it is a plain
function), and every `create` is one assistant turn of one keelrl episode. So the episode is the usual single
append-only token sequence: the first call's messages are the opening; the model's turn is sampled on the
sequence so far (batched with the other episodes' turns), kept as sampled and trained; its decoded text is the
call's answer; the next call's new messages are appended as context (tokenized on their own, never trained).
The model's tokens are never decoded and re-tokenized.

That only holds if each call's messages extend what the model has already read and written: a call whose
history is not a prefix of what was sampled (an earlier message edited, dropped or reordered, the model's
reply altered) raises `HistoryRewritten` into the environment's `create` and ends the episode as an agent
error ("env_error") naming the message that changed: it is never trained on.

The run's sampling settings apply (`rollout.temperature`, ...; the call's own `temperature`, `max_tokens`,
`stop` are ignored: the trained log-probs must be those of the run's settings), one completion per call.
When a call passes `tools=`, `<tool_call>` blocks in the turn come back parsed in `message.tool_calls`
(against the environment's `tools`, which the chat template shows the model). When keelrl's budget ends an
episode (`episode.max_turns`, `episode.max_context_tokens`, a turn cut at `rollout.max_new_tokens`), a cut
turn is answered with `finish_reason="length"` and any later call raises `EpisodeOver`; a `rollout` that lets
it propagate scores 0 (the model ran out of budget), one that catches it scores what was done.

**Second seat.** `policy_client` is the same client shape over the policy itself, for an opponent in a
two-player game (`EpisodeState.policy`): each call renders its messages with keelrl's chat format and
samples one completion (calls take turns on the sampler; call k of an episode samples with seed
`stable_hash("seat", episode seed, k)`, so it does not depend on the batch). Those tokens are not trained.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import inspect
import itertools
import json
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from keelrl.core.seeds import stable_hash
from keelrl.rollout.types import Sampler, SamplingSettings
from keelrl.tasks.base import Score
from keelrl.tasks.env import EpisodeState, Message, ResetResult, StepResult, event_loop
from keelrl.tasks.tools import OPEN_TAG, ToolCall, parse_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

    from keelrl.rollout.chat import ChatFormat


class Reply(dict):  # type: ignore[type-arg]
    """A JSON object read as the OpenAI SDK's response types are (`reply.choices[0].message.content`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return json.loads(json.dumps(self))


def completion(message: Message, finish: str, model: str, usage: dict[str, int] | None = None) -> Reply:
    """A `chat.completions.create` response: one choice, `message`, its finish reason."""
    choice = {
        "index": 0,
        "message": {"tool_calls": None, **message},
        "finish_reason": finish,
        "logprobs": None,
    }
    out = {"id": f"keelrl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
           "model": model, "choices": [choice], "usage": usage}  # fmt: skip
    return json.loads(json.dumps(out), object_hook=Reply)


class HistoryRewritten(ValueError):
    """A driven environment's call whose messages do not extend what the model has read and written."""


class EpisodeOver(RuntimeError):
    """A model call after keelrl ended the episode (a budget ran out)."""


LOCAL = "http://keelrl.local/v1"  # the in-process SDK client's base URL (never resolved: no network)
OVER = "keelrl ended this episode: a budget ran out (episode.max_turns, rollout.max_new_tokens or the context length)"


def _refusal(err: Exception) -> dict[str, Any]:
    return {"error": {"message": str(err), "type": "invalid_request_error"}}


class ModelClient:
    """`chat.completions.create(messages=..., tools=..., model=...)` -> Reply, awaitable when made for an
    async caller; `openai()` is the same client behind the OpenAI SDK, `serve()` behind a local HTTP server.
    `submit` answers a request with a future."""

    def __init__(self, submit: Callable[..., Future[Reply]], is_async: bool) -> None:
        self.submit, self.is_async, self.servers = submit, is_async, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request: Any) -> Any:
        reply = self.submit(**request)
        return asyncio.wrap_future(reply) if self.is_async else reply.result()

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """An HTTP request's (status, JSON body): keelrl's refusals (EpisodeOver, HistoryRewritten) are 400s."""
        try:
            return 200, self.submit(**request).result()
        except (EpisodeOver, ValueError) as err:  # the SDK raises BadRequestError with this text
            return 400, _refusal(err)

    def openai(self) -> Any:
        """An `openai.AsyncOpenAI` (for an async caller) or `openai.OpenAI` whose HTTP requests this client answers
        in process (an httpx transport: no server, no network). Needs `pip install openai`."""
        import httpx
        import openai

        async def respond_async(request: httpx.Request) -> httpx.Response:
            try:  # awaits keelrl's turn without holding a thread
                return httpx.Response(
                    200, json=await asyncio.wrap_future(self.submit(**json.loads(request.content)))
                )
            except (EpisodeOver, ValueError) as err:
                return httpx.Response(400, json=_refusal(err))

        if self.is_async:  # httpx's in-process transport: a function answers each request
            web = httpx.AsyncClient(transport=httpx.MockTransport(respond_async))
            return openai.AsyncOpenAI(base_url=LOCAL, api_key="keelrl", max_retries=0, http_client=web)

        def respond(request: httpx.Request) -> httpx.Response:
            status, body = self.answer(json.loads(request.content))
            return httpx.Response(status, json=body)

        web = httpx.Client(transport=httpx.MockTransport(respond))
        return openai.OpenAI(base_url=LOCAL, api_key="keelrl", max_retries=0, http_client=web)

    def serve(self) -> str:
        """Serve this client over HTTP on 127.0.0.1 (a free port) until the episode ends, for a program of its own
        (another process, an agent's CLI): any POST is a chat completion. Returns the base URL (`.../v1`)."""
        answer = self.answer

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                status, body = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet
                return

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, name="keelrl-client-http", daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/v1"

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def policy_client(
    sampler: Sampler, tokenizer: Tokenizer, fmt: ChatFormat, settings: SamplingSettings, seed: int,
    lock: threading.Lock,
) -> ModelClient:  # fmt: skip
    """A client over the policy, for a second seat (module docstring); its k-th call samples with seed
    `stable_hash("seat", seed, k)`."""
    calls = itertools.count(1)

    def submit(*, messages: list[Any], model: str = "policy", **_: Any) -> Future[Reply]:
        prompt, reply = fmt.opening([_plain(m) for m in messages]), Future()
        with lock:  # the sampler serves one caller at a time
            (gen,) = sampler.generate([prompt], settings, [stable_hash("seat", seed, next(calls))])
        text = tokenizer.decode(gen.completion_ids, skip_special_tokens=True)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(gen.completion_ids)}
        finish = "length" if gen.finish_reason == "length" else "stop"
        reply.set_result(completion({"role": "assistant", "content": text}, finish, model, usage))
        return reply

    return ModelClient(submit, is_async=False)


def _plain(m: Any) -> Message:
    return dict(m) if isinstance(m, dict) else m.model_dump(exclude_none=True)


def _key(m: Message) -> tuple[Any, ...]:
    """What must not change in a message the model has read: role, text, tool calls."""
    content = m.get("content") or ""
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    calls = [_plain(c) for c in m.get("tool_calls") or []]
    return m.get("role"), content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


_END = object()  # the driver's `rollout` returned (or raised)


class Session:
    """One driven episode: its `rollout` in the background, its model calls as a queue of turns."""

    def __init__(self, driver: Any, problem: dict[str, Any], seed: int, tools: list[Any]) -> None:
        self.events: queue.Queue[Any] = queue.Queue()
        self.sent: list[Message] = []  # what the model has read and written so far
        self.reply: Future[Reply] | None = None  # the call waiting for the model's turn
        self.model, self.tools, self.parse_tools, self.over, self.answered = "keelrl", tools, False, False, 0
        is_async = inspect.iscoroutinefunction(driver.rollout)
        self.client = ModelClient(self.submit, is_async)
        if is_async:
            self.done: Future[Any] = asyncio.run_coroutine_threadsafe(
                driver.rollout(self.client, problem, seed), event_loop()
            )
        else:
            self.done = Future()
            threading.Thread(target=self._run, args=(driver.rollout, problem, seed), daemon=True).start()
        self.done.add_done_callback(lambda _: self.events.put(_END))

    def _run(self, fn: Any, *args: Any) -> None:
        try:
            self.done.set_result(fn(self.client, *args))
        except Exception as err:  # the driver's own error: raised where keelrl reads its result
            self.done.set_exception(err)

    def submit(
        self, *, messages: list[Any], model: str = "keelrl", tools: Any = None, n: int = 1, stream: bool = False,
        **_: Any,
    ) -> Future[Reply]:  # fmt: skip
        """A model call from the driver: queued for keelrl's loop, answered by `answer` (or refused)."""
        reply: Future[Reply] = Future()
        if n != 1 or stream:
            reply.set_exception(
                ValueError(f"keelrl's client gives 1 completion per call, unstreamed: n={n}, stream={stream}")
            )
        elif self.over:
            reply.set_exception(EpisodeOver(OVER))
        else:
            self.events.put(([_plain(m) for m in messages], model, bool(tools), reply))
        return reply

    def next(self, env_name: str) -> list[Message] | None:
        """Wait for the driver's next model call: the messages it adds to what the model has seen (None: `rollout`
        returned). A call that rewrites the history raises HistoryRewritten (there and here)."""
        event = self.events.get()
        if event is _END:
            self.events.put(_END)  # sticky: every later wait returns at once
            return None
        messages, self.model, self.parse_tools, self.reply = event
        n = len(self.sent)
        changed = next(
            (i for i in range(n) if i >= len(messages) or _key(messages[i]) != _key(self.sent[i])), None
        )
        if changed is not None:
            now = repr(messages[changed]) if changed < len(messages) else "missing"
            err = HistoryRewritten(
                f"environment {env_name} rewrote the conversation: message {changed} was {self.sent[changed]!r:.100} "
                f"when the model read it and is {now:.100} now. keelrl trains on the tokens the model sampled, in "
                "the context it sampled them in, so each call's messages must extend the previous call's messages "
                "and the model's reply unchanged (append only)"
            )
            self.reply.set_exception(err)
            self.reply = None
            raise err
        self.sent = messages
        return messages[n:]

    def answer(self, text: str, finish: str) -> None:
        """The pending call gets the model's turn (`<tool_call>` blocks parsed when the call passed tools)."""
        calls = parse_calls(text, self.tools) if self.parse_tools else []
        message: Message = {"role": "assistant", "content": text}
        if calls and all(isinstance(c, ToolCall) for c in calls):
            message["content"] = text[: text.find(OPEN_TAG)].strip() or None
            message["tool_calls"] = [
                {"id": f"call_{len(self.sent)}_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(calls) if isinstance(c, ToolCall)
            ]  # fmt: skip
            finish = "tool_calls" if finish == "stop" else finish
        self.sent, self.answered = [*self.sent, message], self.answered + 1
        assert self.reply is not None
        self.reply.set_result(completion(message, finish, self.model))
        self.reply = None

    def end(self) -> Any:
        """Serve no more turns (the pending and every later call raise EpisodeOver); the driver's result."""
        self.over = True
        while True:
            if self.reply is not None:
                self.reply.set_exception(EpisodeOver(OVER))
                self.reply = None
            event = self.events.get()
            if event is _END:
                self.events.put(_END)
                self.client.close()
                return self.done.result()
            self.reply = event[-1]


class Driven:
    """A driven environment (`rollout(client, problem, seed)`) as keelrl's Environment: `reset` starts its
    `rollout` and returns its first call's messages, `step` answers the pending call and returns the next call's
    new messages (done when `rollout` returns), `finish` is the reward `rollout` returned."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def __getattr__(self, name: str) -> Any:  # name, problem, difficulty, tools, ...: the driver's
        return getattr(self.driver, name)

    def reset(self, problem: dict[str, Any], seed: int) -> ResetResult:
        session = Session(self.driver, problem, seed, list(getattr(self.driver, "tools", ())))
        first = session.next(self.name)
        if first is None:
            session.done.result()  # its own error, if it raised
            raise ValueError(f"environment {self.name}: rollout() returned without calling the model")
        return ResetResult(first, session)

    def step(self, state: EpisodeState, turn: str) -> StepResult:
        session: Session = state.scratch
        session.answer(turn, "stop")
        new = session.next(self.name)
        if new is None:
            session.done.result()  # rollout raised: this episode's agent error
            return StepResult([], done=True)
        return StepResult(new)

    def finish(self, state: EpisodeState) -> Score:
        session: Session = state.scratch
        if session.reply is not None and session.answered < state.turn:
            # the turn a budget cut, as an API returns it
            session.answer(state.messages[-1]["content"], "length")
        try:
            out = session.end()
        except EpisodeOver:
            return Score(0.0, False, {"formatted": False, "reason": "budget"})
        return out if isinstance(out, Score) else Score(float(out), float(out) >= 1.0, {})

    def close(self, state: EpisodeState) -> None:
        if isinstance(state.scratch, Session) and not state.scratch.done.done():
            # the episode is over and scored already: only its thread must end
            with contextlib.suppress(Exception):
                state.scratch.end()


def as_environment(task: Any) -> Any:
    """`task` as a reset/step Environment: a driven one (only `rollout`) wrapped in `Driven`."""
    return task if callable(getattr(task, "step", None)) else Driven(task)
