"""Supervised fine-tuning data: records from files -> token ids with a mask of the tokens to train on.

Record formats (one per JSONL line, Parquet/Arrow row, or datasets row):
- `{"messages": [{"role", "content"}, ...]}`: a conversation. Every assistant message is trained on (its
  content and the stop token that ends its turn); everything else (system, user, tool messages, the
  template's headers) is context. Several assistant turns, with tool or user messages between them, are
  allowed (multi-turn tool use).
- `{"prompt": ..., "completion": ...}`: strings (raw text: the completion and a stop token are trained) or
  message lists (a conversation split in two; the completion's assistant messages are trained).
- `{"problem": {...}, "completion": "..."}`: a task problem (task.name), prompted exactly as RL prompts it;
  what `keelrl rft` writes and what a run directory's correct rollouts give.

Conversations are tokenized the way RL tokenizes multi-turn episodes (`rollout/chat.py`): the opening
(messages up to the first assistant header), then each assistant turn's tokens, then the tokens of the
messages after it up to the next assistant header, each piece tokenized on its own. So a model fine-tuned here
sees, at training time, exactly the token sequences it will be prompted with and sample during RL.
The stop token trained after each answer is the tokenizer's EOS, the token keelrl's samplers stop on.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keelrl.core.seeds import stable_hash
from keelrl.rollout.chat import ChatFormat, encode_text

if TYPE_CHECKING:  # `keelrl train` reads preference pairs (read_pairs) before it imports transformers
    from transformers import PreTrainedTokenizerBase

Record = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    """SFT data that cannot be read or used; the message names the file, the record and what to fix."""


@dataclass(frozen=True)
class Example:
    """One tokenized record: `ids` [L], and `labels` [L] with 1 where ids[t] is a token to train on."""

    ids: list[int]
    labels: list[int]

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss covers: labelled ones after the first (nothing predicts the first token)."""
        return sum(self.labels[1:])


def _jsonl(path: Path) -> Iterator[Record]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"{path}:{n} is not JSON ({err.msg}); each line must be one JSON object"
                ) from None


def _datasets_rows(path: Path) -> list[Record]:
    from keelrl.tasks.dataset import load_splits

    splits = load_splits(str(path))
    if "train" not in splits:
        raise DataError(f"{path} holds splits {sorted(splits)}; point data.path at one split's directory")
    return [dict(row) for row in splits["train"]]


def correct_rollouts(run_dir: Path) -> list[Record]:
    """A run directory's logged rollouts that were scored correct, as {problem, completion} records (one per
    distinct completion of a problem): the run's own successes, for rejection-sampling fine-tuning."""
    seen: set[str] = set()
    out = []
    for r in _jsonl(run_dir / "rollouts.jsonl.gz"):
        if r.get("correct") and isinstance(r.get("problem"), dict) and isinstance(r.get("text"), str):
            key = json.dumps([r["problem"], r["text"]], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(
                    {"problem": r["problem"], "completion": r["text"], "source": f"{run_dir}:{r['step']}"}
                )
    return out


def read_records(path: str | Path) -> list[Record]:
    """All records of a data file or directory (formats: the module docstring)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file {p} does not exist")
    if p.is_dir() and (p / "rollouts.jsonl.gz").exists():
        return correct_rollouts(p)
    if p.is_dir() or p.suffix in (".parquet", ".arrow", ".csv"):
        return _datasets_rows(p)
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return list(_jsonl(p))  # JSON Lines under a .json name
        if not isinstance(data, list):
            raise DataError(
                f"{p} holds one JSON {type(data).__name__}; expected a list of records or JSON Lines"
            )
        return data
    if p.name.endswith((".jsonl", ".jsonl.gz")):
        return list(_jsonl(p))
    raise DataError(
        f"{p}: unknown data format; use .jsonl, .json, .parquet, .arrow, .csv, a folder of them or a save_to_disk one"
    )


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: expected a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(
                f"{where}[{i}]: a message is {{'role': one of {list(ROLES)}, 'content': str}}, got {str(m)[:120]}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def conversation_pieces(
    messages: Sequence[dict[str, str]], chat: ChatFormat, encode: Callable[[str], list[int]], stop: int
) -> list[tuple[list[int], bool]]:
    """A conversation as (token ids, trained) pieces in order: the opening up to the first assistant header,
    each assistant turn (content + `stop`, trained), and after each turn the template's tokens up to the
    next assistant header (or none after the last turn). Messages after the last assistant turn are dropped."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise DataError("a conversation with no assistant message has nothing to train on")
    opening = list(messages[: turns[0]])
    pieces: list[tuple[list[int], bool]] = [(chat.opening(opening), False)]
    for i, j in zip(turns, [*turns[1:], None]):  # each assistant turn, and the next one's index
        pieces.append(([*encode(messages[i]["content"]), stop], True))
        if j is not None:
            pieces.append((chat.reply(opening, messages[i + 1 : j], stop), False))
    return pieces


def encode_record(
    record: Record,
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatFormat,
    render_problem: Callable[[dict[str, Any]], list[int]] | None,
    where: str = "record",
) -> Example:
    """One record (formats: the module docstring) -> Example. Raises DataError naming `where`."""
    stop = tokenizer.eos_token_id
    if stop is None:
        raise DataError("the tokenizer has no EOS token to end answers with")

    encode = functools.partial(encode_text, tokenizer)
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record is a JSON object, got {type(record).__name__}")
    if "messages" in record:
        pieces = conversation_pieces(_messages(record["messages"], f"{where}.messages"), chat, encode, stop)
    elif "completion" in record and ("prompt" in record or "problem" in record):
        completion = record["completion"]
        if "problem" in record:
            if render_problem is None or not isinstance(record["problem"], dict):
                raise DataError(
                    f"{where}: a 'problem' record needs a task problem (a JSON object) and task.name"
                )
            if not isinstance(completion, str):
                raise DataError(f"{where}: 'completion' of a problem record must be a string")
            pieces = [(render_problem(record["problem"]), False), ([*encode(completion), stop], True)]
        elif isinstance(record["prompt"], str) and isinstance(completion, str):
            bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
            pieces = [([*bos, *encode(record["prompt"])], False), ([*encode(completion), stop], True)]
        else:
            prompt = _messages(record["prompt"], f"{where}.prompt")
            answer = _messages(completion, f"{where}.completion")
            pieces = conversation_pieces([*prompt, *answer], chat, encode, stop)
    else:
        raise DataError(
            f"{where}: expected 'messages', or 'prompt'/'problem' with 'completion'; got keys {sorted(record)[:8]}"
        )
    ids = [t for piece, _ in pieces for t in piece]
    labels = [int(trained) for piece, trained in pieces for _ in piece]
    return Example(ids, labels)


def is_held_out(index: int, seed: int, fraction: float) -> bool:
    """Whether example `index` of data.path is in the held-out share (stable across runs and resumes)."""
    return fraction > 0 and stable_hash("sft-eval", seed, index) % 1_000_000 < fraction * 1_000_000


def split_records(
    path: str, eval_path: str, eval_fraction: float, seed: int
) -> tuple[list[Record], list[Record]]:
    """(training records, held-out records): eval_path's records are held out when given, else the
    `eval_fraction` of path's chosen by `is_held_out` (SFT examples and preference pairs alike)."""
    records = read_records(path)
    if eval_path:
        return records, read_records(eval_path)
    held = [is_held_out(i, seed, eval_fraction) for i in range(len(records))]
    return [r for r, h in zip(records, held) if not h], [r for r, h in zip(records, held) if h]


# Fewer held-out pairs judge nothing: 16 of 20 right is a 95% interval of 0.58-0.92 (Wilson), 1 of 1 is 0.21-1
MIN_HELD_OUT_PAIRS = 20


def read_pairs(d: Any, seed: int) -> tuple[list[Record], list[Record], int]:
    """[data]'s preference records (a reward model's) as (training, held-out, how many were left out for having
    the same text chosen and rejected); a DataError when too few remain to train a reward model and judge it."""
    sides = split_records(d.path, d.eval_path, d.eval_fraction, seed)
    train, held_out = ([r for r in side if r.get("chosen") != r.get("rejected")] for side in sides)
    identical = sum(map(len, sides)) - len(train) - len(held_out)
    held_out = held_out[: d.eval_examples]
    if len(held_out) < MIN_HELD_OUT_PAIRS or not train:
        same = f" ({identical} with the same text chosen and rejected: no preference)" if identical else ""
        raise DataError(
            f"{d.path}: {sum(map(len, sides))} preference pairs{same} leave {len(train)} to train on and "
            f"{len(held_out)} held out; a reward model's held-out pair accuracy needs at least {MIN_HELD_OUT_PAIRS} "
            "held-out pairs to mean anything. Collect more pairs (keelrl judge --export), raise "
            "data.eval_fraction, or give data.eval_path."
        )
    return train, held_out, identical


def encode_all(
    records: Sequence[Record],
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatFormat,
    render_problem: Callable[[dict[str, Any]], list[int]] | None,
    max_length: int,
    too_long: str,
    source: str,
) -> tuple[list[Example], int, int]:
    """Encode `records`, applying data.too_long; returns (examples, dropped, truncated). Examples whose
    trained tokens were all cut off are dropped too."""
    out, truncated = [], 0
    for n, record in enumerate(records):
        where = f"{source} record {n}"
        ex = encode_record(record, tokenizer, chat, render_problem, where)
        if len(ex.ids) > max_length:
            if too_long == "error":
                raise DataError(
                    f"{where} is {len(ex.ids)} tokens, over data.max_length={max_length}; raise max_length or "
                    "set data.too_long = 'drop' or 'truncate'"
                )
            if too_long == "drop":
                continue
            ex, truncated = Example(ex.ids[:max_length], ex.labels[:max_length]), truncated + 1
        if ex.trained_tokens:  # else nothing is left to train on
            out.append(ex)
    return out, len(records) - len(out), truncated  # every record not kept was dropped
