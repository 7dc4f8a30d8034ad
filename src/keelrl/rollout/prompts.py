"""Prompt rendering: a task's `Prompt` -> token ids, under the chat, base, compact or qwen_instruct template."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from keelrl.tasks.base import Prompt, Template


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, template: Template) -> list[int]:
    """Prompt -> token ids. 'chat': the tokenizer's chat template, then the assistant prefix; 'base':
    TinyZero's plain conversation; 'compact': `user + newline + assistant_prefix` (tiny character models).
    `prompt.history` comes before the user turn: chat messages, 'Role: text' lines, or lines of text."""
    turns = [*prompt.history, {"role": "user", "content": prompt.user}]
    if template == "chat":
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "task.template='chat' but the tokenizer has no chat template; use 'base' or 'auto'"
            )
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + turns
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    elif template == "qwen_instruct":  # TinyZero's, whatever the tokenizer's own chat template says
        said = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
        text = f"<|im_start|>system\n{prompt.system}<|im_end|>\n{said}<|im_start|>assistant\n"
    elif template == "base":
        said = "".join(f"\n{m['role'].capitalize()}: {m['content']}" for m in turns)
        text = f"{prompt.system}{said}\nAssistant: "
    else:
        text = "".join(f"{m['content']}\n" for m in turns)
    ids = tokenizer(text + prompt.assistant_prefix, add_special_tokens=False)["input_ids"]
    if template == "base" and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    return ids


def resolve_template(requested: str, tokenizer: PreTrainedTokenizerBase) -> Template:
    from keelrl.models.load import is_char_tokenizer

    if requested != "auto":
        return requested  # type: ignore[return-value]
    if is_char_tokenizer(tokenizer):
        return "compact"
    return "chat" if getattr(tokenizer, "chat_template", None) else "base"
