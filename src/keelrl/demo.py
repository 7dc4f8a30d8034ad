"""`keelrl demo`: the whole post-training lifecycle in miniature, on a laptop CPU.

1. Pretrain a tiny base model (character tokenizer, a few hundred thousand to a few million parameters)
   with plain next-token loss on a procedurally generated corpus (`corpus_text`).
2. Evaluate it (greedy) on held-out Countdown problems whose number sets never occur in training.
3. RL with the ordinary trainer (`keelrl.trainer.train`): every metric, checkpoint and event of a normal run.
4. Evaluate the final policy on the same problems; print a before/after table with 95% intervals.

The corpus. Each line is a Countdown prompt in the compact template followed by an answer, e.g.

    7 3 12 -> 33
    <answer>12*3-7=29</answer><eos>

The numbers are those of a *training* problem (so held-out number sets never appear). The answer is a
random expression that uses every number once (drawn by the same generator that makes problems:
random order, random pairing, random operation with positive integer intermediate values) followed by its
true value. The target on the prompt line is the value of a second, independent draw of that generator
on the same numbers. The corpus therefore teaches the answer format, the rule "each number exactly
once", and arithmetic (the stated value is always right), but not goal-directed solving: the target tells
nothing about which expression follows. A policy that ignores the target hits it with probability
sum_v p(v)^2 over the generator's value distribution p for those numbers; `chance_accuracy` computes this
exactly by enumerating the generator's choices, and that is the chance level the demo reports.

The reward cannot be gamed by stating the target: the Countdown checker requires a stated value to equal
the expression's true value (see tasks/countdown.py), and correctness is judged on the expression.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl.tasks.base import stable_hash
from keelrl.tasks.countdown import Countdown, random_expression


def corpus_text(task: Countdown, index: int, seed: int) -> str:
    """One pretraining example (prompt + completion, compact template) for train problem `index`."""
    problem = task.problem("train", index)
    rng = random.Random(stable_hash("corpus", seed, index))
    numbers = list(problem["numbers"])
    rng.shuffle(numbers)
    while True:
        target = random_expression(numbers, rng)
        answer = random_expression(numbers, rng)
        if (
            target is not None
            and answer is not None
            and task.params.min_target <= target[1] <= task.params.max_target
        ):
            break
    prompt = task.prompt({"numbers": numbers, "target": target[1]}, "compact")
    return f"{prompt.user}\n{prompt.assistant_prefix}{answer[0]}</answer>"


def value_distribution(numbers: list[int]) -> dict[int, float]:
    """Exact distribution of the value of `random_expression(numbers, rng)` (None draws excluded and
    renormalised), by enumerating its choices: an ordered pair of pool items, then one allowed operation."""

    def rec(pool: tuple[int, ...]) -> Counter[int]:
        if len(pool) == 1:
            return Counter({pool[0]: Fraction(1)}) if pool[0] > 0 else Counter()
        out: Counter = Counter()
        pairs = [(i, j) for i in range(len(pool)) for j in range(len(pool)) if i != j]
        for i, j in pairs:
            a, b = pool[i], pool[j]
            ops = [a + b, a * b]
            if a > b:
                ops.append(a - b)
            if b > 0 and a % b == 0 and b != 1:
                ops.append(a // b)
            rest = tuple(p for k, p in enumerate(pool) if k not in (i, j))
            for value in ops:
                for v, p in rec((*rest, value)).items():
                    out[v] += p * Fraction(1, len(pairs) * len(ops))
        return out

    dist = rec(tuple(numbers))
    total = sum(dist.values())
    return {v: float(p / total) for v, p in dist.items()} if total else {}


def chance_accuracy(problems: list[dict[str, Any]]) -> float:
    """Mean over problems of P(a target-blind draw of the corpus generator hits the target)."""
    if not problems:
        return 0.0
    return sum(value_distribution(p["numbers"]).get(p["target"], 0.0) for p in problems) / len(problems)


@dataclass
class PretrainResult:
    steps: int
    tokens: int
    final_loss: float
    seconds: float


def pretrain(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    make_text: Callable[[int], str],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> PretrainResult:
    """Plain next-token training (every token, EOS included) on texts make_text(0), make_text(1), ...
    AdamW with linear warm-up and cosine decay. Padding is masked by length."""
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))),
    )
    eos = tokenizer.eos_token_id
    t0 = time.perf_counter()
    tokens = 0
    loss_value = float("nan")
    for step in range(steps):
        seqs = [
            tokenizer(make_text(step * batch_size + i), add_special_tokens=False)["input_ids"] + [eos]
            for i in range(batch_size)
        ]
        T = max(len(s) for s in seqs)
        ids = torch.full((batch_size, T), eos, dtype=torch.long)
        labels = torch.full((batch_size, T), -100, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, : len(s)] = torch.tensor(s)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        tokens += sum(len(s) for s in seqs)
        loss_value = loss.item()
        if on_step is not None:
            on_step(step + 1, loss_value)
    model.eval()
    return PretrainResult(steps, tokens, loss_value, time.perf_counter() - t0)
