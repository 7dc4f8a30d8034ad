"""Tools: Python callables with a JSON schema, the calls a model writes, and their results as messages.

A call is written `<tool_call>...</tool_call>` inside an assistant turn, in either of two bodies:
- JSON, as Qwen's and SmolLM2's chat templates teach (`apply_chat_template(tools=...)`):
  `<tool_call>{"name": "calc", "arguments": {"expression": "3*4"}}</tool_call>` ("arguments" may also be a
  JSON string, as some models write it), or a JSON list of such calls in one tag (SmolLM2's);
- plain text, for tiny models without a template: `<tool_call>calc: 3*4</tool_call>`; the text after the
  colon is the tool's one required argument, or a JSON object of its arguments.
Every call of a turn runs, in order. A malformed call (bad JSON, an unknown tool, wrong arguments, an
unclosed tag) or a tool that raises becomes an error text in the tool's reply to the model, never an
exception in the trainer; `run_tool_calls` counts both calls and errors (`tool_calls`, `tool_errors`).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_origin, get_type_hints

from keelrl.tasks.env import Message, StepResult

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
MAX_RESULT_CHARS = 4000  # a tool's reply is cut to this many characters (the context budget is tokens)
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolCallError(ValueError):
    """A call the model wrote that cannot be run as written; its text is the reply the model sees."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    # a JSON schema of an object: {"type": "object", "properties": ..., "required": ...}
    parameters: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates take (`tools=[tool.schema(), ...]`)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def signature(self) -> str:
        """`name(arg: type, ...)`, for the plain format's system text."""
        props = self.parameters.get("properties", {})
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        return f"{self.name}({args})"


def tool(fn: Callable[..., Any], name: str | None = None, description: str | None = None) -> Tool:
    """A Tool from a function: its name, its docstring's first paragraph, and a schema from its annotated
    parameters (str, int, float, bool, list, dict; a parameter without a default is required)."""
    hints = get_type_hints(fn)
    params = inspect.signature(fn).parameters.values()
    # list[str] is a list
    types = {p.name: get_origin(hints.get(p.name)) or hints.get(p.name) for p in params}
    props = {k: {"type": _JSON_TYPES.get(t, "string")} for k, t in types.items()}
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    doc = description if description is not None else (inspect.getdoc(fn) or "").split("\n\n")[0]
    return Tool(name or fn.__name__, fn, doc, {"type": "object", "properties": props, "required": required})


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolReplies:
    """The tool messages answering one assistant turn, and the counts."""

    messages: list[Message] = field(default_factory=list)
    calls: int = 0
    errors: int = 0

    def step_result(self) -> StepResult:
        """A tool-using environment's step (tasks/env.py): these replies; a turn without a tool call ends the episode."""
        return StepResult(
            self.messages, 0.0, self.calls == 0, {"tool_calls": self.calls, "tool_errors": self.errors}
        )


def _json(text: str, error: str) -> Any:
    """`text` parsed as JSON, else a ToolCallError: `error` with {msg} and {pos} filled in from the parser's."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolCallError(error.format(msg=err.msg, pos=err.pos)) from None


def parse_call(body: str, tools: dict[str, Tool]) -> ToolCall:
    """One call's body (between the tags) -> ToolCall; raises ToolCallError saying what is wrong."""
    text = body.strip()
    if text.startswith("{"):
        obj = _json(text, "the call is not valid JSON ({msg} at character {pos})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ToolCallError('a JSON call needs "name" (a string) and "arguments" (an object)')
        name, args = obj["name"], obj.get("arguments", {})
        if isinstance(args, str):
            args = _json(args, '"arguments" is a string that is not a JSON object')
        if not isinstance(args, dict):
            raise ToolCallError('"arguments" must be a JSON object')
    else:
        name, sep, rest = text.partition(":")
        name, rest = name.strip(), rest.strip()
        if not sep:
            raise ToolCallError('write a call as {"name": ..., "arguments": {...}} or as "name: argument"')
        args = _plain_arguments(tools.get(name), rest)
    if name not in tools:
        raise ToolCallError(f"no tool named {name!r}; tools: {', '.join(tools) or 'none'}")
    return ToolCall(name, args)


def _plain_arguments(t: Tool | None, rest: str) -> dict[str, Any]:
    required = t.parameters.get("required", []) if t is not None else []
    if rest.startswith("{"):
        try:
            args = json.loads(rest)
        except json.JSONDecodeError as err:
            if len(required) != 1:  # else the text is the one argument (code such as `{1, 2}`)
                raise ToolCallError(f"the arguments are not valid JSON ({err.msg})") from None
        else:
            if isinstance(args, dict):
                return args
    if t is not None and len(required) != 1:
        raise ToolCallError(f"{t.name} takes {len(required)} arguments: pass a JSON object of them")
    return {required[0]: rest} if required else {}


def parse_calls(text: str, tools: Sequence[Tool]) -> list[ToolCall | ToolCallError]:
    """Every call in an assistant turn, in order (a malformed one as its ToolCallError); [] when none."""
    by_name = {t.name: t for t in tools}
    out: list[ToolCall | ToolCallError] = []
    end = 0
    for m in CALL_RE.finditer(text):
        body, end = m[1], m.end()
        try:
            bodies = _listed_calls(body) if body.strip().startswith("[") else [body]
        except ToolCallError as err:
            out.append(err)
            continue
        for one in bodies:
            try:
                out.append(parse_call(one, by_name))
            except ToolCallError as err:
                out.append(err)
    if OPEN_TAG in text[end:]:  # after the last complete call (a stray closing tag earlier does not hide it)
        out.append(ToolCallError(f"a {OPEN_TAG} without its {CLOSE_TAG}"))
    return out


def _listed_calls(body: str) -> list[str]:
    """The calls of a body that is a JSON list of them (SmolLM2's template: `<tool_call>[{...}, ...]</tool_call>`,
    `[]` for none), each as JSON text."""
    calls = _json(body.strip(), "the list of calls is not valid JSON ({msg} at character {pos})")
    return [json.dumps(call) for call in calls]  # a text starting with [ parses as a list


def run_tool_calls(text: str, tools: Sequence[Tool]) -> ToolReplies:
    """Run every call in `text`; each yields one tool message (its result, or "error: ...")."""
    by_name = {t.name: t for t in tools}
    replies = ToolReplies()
    for call in parse_calls(text, tools):
        replies.calls += 1
        name = call.name if isinstance(call, ToolCall) else "error"
        try:
            if isinstance(call, ToolCallError):
                raise call
            fn = by_name[call.name].fn
            try:
                inspect.signature(fn).bind(**call.arguments)
            except TypeError as err:  # wrong or missing arguments
                raise ToolCallError(f"bad arguments for {name}: {err}") from None
            result = fn(**call.arguments)
            content = result if isinstance(result, str) else json.dumps(result, default=str)
        except Exception as err:  # the tool raised, or the call was malformed: the model sees why
            replies.errors += 1
            content = (
                f"error: {err}" if isinstance(err, ToolCallError) else f"error: {type(err).__name__}: {err}"
            )
        if len(content) > MAX_RESULT_CHARS:
            content = content[:MAX_RESULT_CHARS] + f"\n[... {len(content) - MAX_RESULT_CHARS} characters cut]"
        replies.messages.append({"role": "tool", "name": name, "content": content})
    return replies


def used_tools(infos: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some tool call of the episode ran without an error, from its steps' infos (`run_tool_calls`'s
    counts); the tool-using environments' `formatted`."""
    return any(int(i.get("tool_calls", 0)) > int(i.get("tool_errors", 0)) for i in infos)


def describe_tools(tools: Sequence[Tool]) -> str:
    """The plain format's tool list, appended to the system text when there is no chat template."""
    lines = [f"- {t.signature()}: {t.description}" for t in tools]
    return (
        "Tools:\n" + "\n".join(lines) + f"\nCall a tool with {OPEN_TAG}name: argument{CLOSE_TAG} or "
        f'{OPEN_TAG}{{"name": ..., "arguments": {{...}}}}{CLOSE_TAG}; its result comes back in the next turn.'
    )


def call_action(tools: Sequence[Tool]) -> Callable[[str], ToolCall]:
    """An environment's `action` (tasks/env.py): the turn's one tool call, parsed; a ToolCallError (the model's
    error message) for no call, several, or one that does not parse."""
    return functools.partial(_one_call, tools)  # a partial, not a function: a class attribute stays unbound


def _one_call(tools: Sequence[Tool], text: str) -> ToolCall:
    calls = parse_calls(text, tools)
    if len(calls) != 1:
        raise ToolCallError(f"write one {OPEN_TAG}...{CLOSE_TAG} call per turn (found {len(calls)})")
    if isinstance(calls[0], ToolCallError):
        raise calls[0]
    return calls[0]
