"""Messages -> tokens for multi-turn episodes, without ever re-tokenizing what the model wrote.

An episode is one token sequence: the opening (`opening`), then, turn by turn, the model's sampled tokens
(kept as sampled) and the tokens of the environment's reply (`reply`): whatever closes the assistant turn,
the reply's messages and the next assistant header, tokenized on their own and appended. The model's text
is never part of a string that gets tokenized, so the sequence can differ from `tokenize(full text)` (a
reply that would merge with the model's last token stays a separate token): the trained tokens are the
sampled ones, and the model is trained on exactly the context it was sampled under.

Formats (`CHAT_FORMATS`):
- "chat": the tokenizer's chat template (with `tools=` when the environment has tools; a template that
  ignores `tools=`, as SmolLM2's GGUF one does, gets the plain format's tool list appended to the system
  text instead, so the model always sees its tools). The reply is what
  the template writes after an assistant turn: the template is rendered with a placeholder assistant
  turn followed by the reply's messages, and the text after the placeholder is taken. If the model's turn
  ended with its stop token and the template's text starts with that token (ChatML's `<|im_end|>`), it is
  not written twice; a turn that ended with another stop token gets the template's end-of-turn text too.
- "plain": `User:` / `Tool:` / `Assistant:` lines, for base and tiny models; tools are listed after the
  system text (`describe_tools`), when the environment opens with a system message (a brief opening for a
  tiny model may leave it out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from keelrl.tasks.env import Message
from keelrl.tasks.tools import Tool, describe_tools

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

PLACEHOLDER = "KEELRL_ASSISTANT_TURN_7f3a"
_PLAIN_ROLES = {"user": "User", "tool": "Tool", "assistant": "Assistant"}


class ChatFormat(Protocol):
    def opening(self, messages: Sequence[Message]) -> list[int]:
        """The episode's first tokens, ending with the first assistant header."""
        ...

    def reply(
        self, messages: Sequence[Message], after: Sequence[Message], last_token: int | None
    ) -> list[int]:
        """The tokens after an assistant turn whose last sampled token is `last_token` (None: the turn was
        empty): the turn's end, `after` (the environment's messages), the next assistant header.
        `messages`: the episode's opening messages (templates may render them into the reply's context)."""
        ...


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """`text`'s token ids on their own (no special tokens added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class TemplateFormat:
    def __init__(self, tokenizer: Tokenizer, tools: Sequence[Tool] = ()) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the chat format needs a tokenizer with a chat template; use task.template = 'base'"
            )
        self.tokenizer = tokenizer
        self.tools: list[dict[str, Any]] | None = None
        self.tool_text = ""  # the tool list in the system text, for a template that ignores `tools=`
        if tools:
            probe = [{"role": "user", "content": "x"}]
            plain = self._render(probe, True)
            self.tools = [t.schema() for t in tools]
            if self._render(probe, True) == plain:
                self.tools, self.tool_text = None, describe_tools(tools)

    def _with_tools(self, messages: Sequence[Message]) -> list[Message]:
        if not self.tool_text:
            return list(messages)
        if messages and messages[0]["role"] == "system":
            first = {**messages[0], "content": f"{messages[0]['content']}\n\n{self.tool_text}"}
            return [first, *messages[1:]]
        return [{"role": "system", "content": self.tool_text}, *messages]

    def _render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    list(messages), tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
                )
            )
        except Exception as err:  # jinja raises its own errors for roles a template does not know
            roles = sorted({m.get("role", "?") for m in messages})
            raise ValueError(
                f"the tokenizer's chat template cannot render roles {roles} ({type(err).__name__}: {err}); "
                "use task.template = 'base' for the plain format"
            ) from None

    def opening(self, messages: Sequence[Message]) -> list[int]:
        return encode_text(self.tokenizer, self._render(self._with_tools(messages), True))

    def reply(
        self, messages: Sequence[Message], after: Sequence[Message], last_token: int | None
    ) -> list[int]:
        turn = {"role": "assistant", "content": PLACEHOLDER}
        text = self._render([*self._with_tools(messages), turn, *after], True)
        delta = text[text.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]
        if last_token is not None:
            ended = self.tokenizer.decode([last_token])
            if ended and delta.startswith(ended):
                delta = delta[len(ended) :]  # the model wrote the end-of-turn token itself
        return encode_text(self.tokenizer, delta)


class PlainFormat:
    def __init__(self, tokenizer: Tokenizer, tools: Sequence[Tool] = ()) -> None:
        self.tokenizer, self.tools = tokenizer, list(tools)

    def _lines(self, messages: Sequence[Message]) -> str:
        out = []
        for m in messages:
            if m["role"] == "system":
                out.append(m["content"] + (f"\n{describe_tools(self.tools)}" if self.tools else ""))
            else:
                out.append(f"{_PLAIN_ROLES.get(m['role'], m['role'].title())}: {m['content']}")
        return "\n".join(out) + "\nAssistant:"

    def opening(self, messages: Sequence[Message]) -> list[int]:
        ids = encode_text(self.tokenizer, self._lines(messages))
        bos = self.tokenizer.bos_token_id
        return [bos, *ids] if bos is not None else ids

    def reply(
        self, messages: Sequence[Message], after: Sequence[Message], last_token: int | None
    ) -> list[int]:
        return encode_text(self.tokenizer, "\n" + self._lines(after))


CHAT_FORMATS: dict[str, Callable[..., ChatFormat]] = {"chat": TemplateFormat, "plain": PlainFormat}


def chat_format(template: str, tokenizer: Tokenizer, tools: Sequence[Tool] = ()) -> ChatFormat:
    """The format for a resolved task template: "chat" -> the chat template, "base" / "compact" -> plain."""
    return CHAT_FORMATS["chat" if template == "chat" else "plain"](tokenizer, tools)
