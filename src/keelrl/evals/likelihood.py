"""Perplexity: `perplexity(model, tokenizer, texts)` and `reference_perplexity(...)` (the task's reference
solutions as completions of its prompts), with a bootstrap interval over texts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from keelrl.config import ConfigError
from keelrl.evals.report import SCHEMA
from keelrl.evals.run import problem_count
from keelrl.evals.stats import BOOTSTRAP_RESAMPLES, bootstrap_means, percentile_interval

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from keelrl.tasks import Task, Template


@dataclass
class PerplexityResult:
    """Perplexity exp(total NLL / total scored tokens) with a bootstrap interval over texts."""

    nll: np.ndarray  # [N] summed negative log-likelihood (nats) of each text's scored tokens
    tokens: np.ndarray  # [N] scored tokens per text
    source: str = ""
    skipped: int = 0  # texts (or problems without a checkable reference) left out

    def to_json(
        self, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
    ) -> dict[str, Any]:
        num, den = self.nll.astype(np.float64), self.tokens.astype(np.float64)
        draws = bootstrap_means(np.stack([num, den]), resamples, seed)  # [R, 2]
        ratio = draws[:, 0] / np.maximum(draws[:, 1], 1e-12)  # [R] nll per token
        lo, hi = percentile_interval(ratio, level)
        nll_tok = float(num.sum() / max(den.sum(), 1.0))
        lo, hi = min(float(lo), nll_tok), max(float(hi), nll_tok)
        return {
            "schema": SCHEMA,
            "mode": "perplexity",
            "source": self.source,
            "texts": len(self.nll),
            "tokens": int(den.sum()),
            "skipped": self.skipped,
            "metrics": {
                "perplexity": {"value": math.exp(nll_tok), "ci95": [math.exp(lo), math.exp(hi)]},
                "nll/token": {"value": nll_tok, "ci95": [lo, hi]},
            },
        }


def sequence_nll(
    model: PreTrainedModel,
    items: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int = 0,
    batch_size: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """For (context ids, target ids) pairs: the summed -log p(target | context) in nats and the number of
    target tokens. Context must be non-empty (the first token has nothing to be predicted from)."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    device = next(model.parameters()).device
    nll = np.zeros(len(items))
    counts = np.array([len(t) for _, t in items], dtype=np.int64)
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]) + len(items[i][1]))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        seqs = [torch.tensor([*items[i][0], *items[i][1]], dtype=torch.long) for i in idx]
        if any(not items[i][0] for i in idx):
            raise ValueError("sequence_nll needs a non-empty context for every item")
        ids = pad_sequence(seqs, batch_first=True, padding_value=pad_id)  # [B, T]
        attn = pad_sequence([torch.ones(len(s), dtype=torch.long) for s in seqs], batch_first=True)  # [B, T]
        with torch.no_grad():  # logits [B, T, V]
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float()
        for r, i in enumerate(idx):
            c, t = len(items[i][0]), len(items[i][1])
            # logits at position j predict token j + 1: the target tokens c..c+t-1 come from c-1..c+t-2
            logp = torch.log_softmax(logits[r, c - 1 : c - 1 + t], dim=-1)  # [t, V]
            target = torch.tensor(items[i][1], dtype=torch.long, device=device)  # [t]
            nll[i] = -float(logp.gather(-1, target[:, None]).double().sum())
    return nll, counts


def perplexity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    batch_size: int = 8,
    max_tokens: int | None = None,
    source: str = "texts",
) -> PerplexityResult:
    """Perplexity of `model` on `texts`, each scored after BOS (without one: from its second token), cut at
    `max_tokens` (default: max_position_embeddings); empty texts are skipped."""
    limit = max_tokens or int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    bos = tokenizer.bos_token_id
    rows = (tokenizer(text, add_special_tokens=False)["input_ids"][:limit] for text in texts)
    pieces = [([bos], ids[: limit - 1]) if bos is not None else (ids[:1], ids[1:]) for ids in rows]
    items = [(ctx, tgt) for ctx, tgt in pieces if tgt]  # (context, scored tokens); too short: skipped
    skipped = len(pieces) - len(items)
    if not items:
        raise ConfigError(
            f"no text with at least {1 if bos is not None else 2} tokens to measure perplexity on"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    nll, counts = sequence_nll(model, items, int(pad), batch_size)
    return PerplexityResult(nll, counts, source, skipped)


def reference_completion(task: Task, problem: Mapping[str, Any], assistant_prefix: str) -> str | None:
    """The completion (text after the prompt's assistant prefix) that states the reference answer in the
    task's format, checked by the task's own scorer: the first of `ANSWER</answer>` (after a prefix ending
    in `<answer>`), `</think>\\n<answer>ANSWER</answer>`, `<answer>ANSWER</answer>`, a ```python fenced
    block, and ANSWER verbatim that scores as correct. The reference answer is the problem's "reference",
    else the task's optional `reference_answer(problem)`. None when there is none or none scores."""
    own = getattr(task, "reference_answer", None)
    answer = str(problem["reference"]) if "reference" in problem else own(dict(problem)) if own else None
    if answer is None:
        return None
    candidates = []
    if assistant_prefix.rstrip().endswith("<answer>"):
        candidates.append(f"{answer}</answer>")
    candidates += [
        f"</think>\n<answer>{answer}</answer>",
        f"<answer>{answer}</answer>",
        f"```python\n{answer.strip()}\n```",
        answer,
    ]
    for completion in candidates:
        if task.score(dict(problem), assistant_prefix + completion).correct:
            return completion
    return None


def reference_perplexity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    template: Template,
    num_problems: int,
    split: str = "test",
    batch_size: int = 8,
) -> PerplexityResult:
    """Perplexity of `reference_completion` + EOS given each problem's prompt (completion tokens only), over
    the first `num_problems` (at most the split's size, as `evaluate`). Problems without a checkable reference
    are skipped (counted); none at all is a ConfigError."""
    from keelrl.rollout import render_prompt

    num_problems = problem_count(task, split, num_problems)  # a data set's split may hold fewer
    items: list[tuple[list[int], list[int]]] = []
    eos = tokenizer.eos_token_id
    eos_ids = [eos] if eos is not None else []
    for i in range(num_problems):
        problem = task.problem(split, i)  # type: ignore[arg-type]
        prompt = task.prompt(problem, template)
        completion = reference_completion(task, problem, prompt.assistant_prefix)
        if completion is not None:
            target = tokenizer(completion, add_special_tokens=False)["input_ids"] + eos_ids
            items.append((render_prompt(tokenizer, prompt, template), target))
    if not items:
        raise ConfigError(
            f"task {task.name!r} has no reference solutions keelrl can check for its first {num_problems} {split} "
            "problems; measure perplexity on a text file instead (--perplexity FILE)"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    nll, counts = sequence_nll(model, items, int(pad), batch_size)
    return PerplexityResult(nll, counts, f"{task.name} references", num_problems - len(items))
