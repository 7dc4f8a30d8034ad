"""Multiplication (TinyZero's variant): compute a x b, with `digits_a` and `digits_b` digits.
Reward: 1.0 when the last `<answer>` block holds exactly the product as an integer (`,` or `_` thousands
separators allowed), 0.1 for a wrong integer, 0.0 without an answer block or integer. Train and test are
split by the unordered pair {a, b}, so a test pair never appears in training. `worked_product` writes the long
multiplication a person would (SFT data for models that cannot yet multiply in text).
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field, model_validator

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import (
    Prompt,
    Score,
    Split,
    TaskParams,
    Template,
    check_bucket,
    in_test_split,
    instruct_prompt,
    last_answer,
)

USER_TEXT = (
    "Give me the answer of the following equation: {a} * {b} = ?. Show your work in <think> </think> tags. "
    "And return the final answer in <answer> </answer> tags, for example <answer> 1234 </answer>."
)
USER_TEXT_ANSWER_ONLY = "What is {a} * {b}? Write only the number in <answer> </answer> tags."

# ASCII digits only; a sign as Python's int() (TinyZero's check) reads one
_INTEGER_RE = re.compile(r"^\s*([+-]?[0-9]{1,3}(?:[,_][0-9]{3})+|[+-]?[0-9]{1,40})\s*$")


class MultiplyParams(TaskParams):
    digits_a: int = Field(3, ge=1, le=12, description="Digits of the first factor.")
    digits_b: int = Field(3, ge=1, le=12, description="Digits of the second factor.")
    test_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of factor pairs reserved for the test split."
    )
    min_digits: int = Field(
        1,
        ge=1,
        le=12,
        description="First rung of the difficulty ladder an adaptive curriculum climbs: buckets go from "
        "min_digits x min_digits up to digits_a x digits_b, one digit more per rung, the first factor first "
        "(problem() always draws digits_a x digits_b).",
    )
    think: bool = Field(
        True,
        description=(
            "base/chat templates: ask for the work in <think> tags before the answer (TinyZero). False asks for "
            "the product only and starts the assistant turn at '<answer>', for small models that cannot yet work "
            "in text; the answer may then also end at the end of its line instead of '</answer>'."
        ),
    )

    @model_validator(mode="after")
    def _ladder(self) -> MultiplyParams:
        if self.min_digits > max(self.digits_a, self.digits_b):
            raise ValueError(
                f"min_digits={self.min_digits} is above both digits_a={self.digits_a} and digits_b={self.digits_b}"
            )
        return self


def place_parts(n: int) -> list[int]:
    """The nonzero place values of a natural number, highest first: 407 -> [400, 7]."""
    digits = str(n)
    return [int(d) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits) if d != "0"] or [0]


def worked_product(a: int, b: int) -> str:
    """The long multiplication of a * b as a person writes it, ending in the answer block: split b into its place
    values, multiply a by each through a's place values, add up. Every step is a one-digit fact times powers of ten
    or a sum, so a small model can learn it from examples. 47 * 8 and 47 * 23:

        47 * 8 = 40 * 8 + 7 * 8 = 320 + 56 = 376            47 * 23 = 47 * 20 + 47 * 3
        <answer>376</answer>                                47 * 20 = 40 * 20 + 7 * 20 = 800 + 140 = 940
                                                            47 * 3 = 40 * 3 + 7 * 3 = 120 + 21 = 141
                                                            940 + 141 = 1081
                                                            <answer>1081</answer>
    """
    parts_a, parts_b = place_parts(a), place_parts(b)
    lines = [f"{a} * {b} = " + " + ".join(f"{a} * {q}" for q in parts_b)] if len(parts_b) > 1 else []
    for q in parts_b:
        if len(parts_a) > 1:
            terms = " + ".join(f"{p} * {q}" for p in parts_a)
            lines.append(f"{a} * {q} = {terms} = " + " + ".join(str(p * q) for p in parts_a) + f" = {a * q}")
        else:
            lines.append(f"{a} * {q} = {a * q}")
    if len(parts_b) > 1:
        lines.append(" + ".join(str(a * q) for q in parts_b) + f" = {a * b}")
    return "\n".join([*lines, f"<answer>{a * b}</answer>"])


def parse_integer(text: str) -> int | None:
    m = _INTEGER_RE.match(text)
    return int(m.group(1).replace(",", "").replace("_", "")) if m else None


class Multiply:
    name = "multiply"

    def __init__(self, seed: int = 0, **params: Any) -> None:
        self.seed, self.params = seed, MultiplyParams(**params)

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return self._generate(split, index, self.params.digits_a, self.params.digits_b)

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        a, b = problem["a"], problem["b"]
        if template == "compact":
            return Prompt("", f"{a}*{b}", "")
        text = USER_TEXT if self.params.think else USER_TEXT_ANSWER_ONLY
        return instruct_prompt(template, text.format(a=a, b=b), self.params.think)

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        answer = last_answer(completion, line_answer=not self.params.think)
        if answer is None:
            return Score(0.0, False, {"formatted": False, "reason": "no_answer"})
        value = parse_integer(answer)
        if value is None:
            return Score(0.0, False, {"formatted": False, "reason": "not_an_integer", "answer": answer[:80]})
        if value != problem["a"] * problem["b"]:
            return Score(0.1, False, {"formatted": True, "reason": "wrong_value", "answer": answer[:80]})
        return Score(1.0, True, {"formatted": True, "reason": "correct", "answer": answer[:80]})

    def difficulty(self, problem: dict[str, Any]) -> str:
        return f"{len(str(problem['a']))}x{len(str(problem['b']))}"

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        return str(int(problem["a"]) * int(problem["b"]))

    def buckets(self) -> list[str]:
        """The difficulty ladder, easiest first: from min_digits x min_digits to digits_a x digits_b, one digit
        more per rung, the first factor first (3x3: 1x1, 2x1, 2x2, 3x2, 3x3)."""
        p = self.params
        a, b = min(p.min_digits, p.digits_a), min(p.min_digits, p.digits_b)
        rungs = [(a, b)]
        while (a, b) != (p.digits_a, p.digits_b):
            if a < p.digits_a and (a <= b or b == p.digits_b):
                a += 1
            else:
                b += 1
            rungs.append((a, b))
        return [f"{x}x{y}" for x, y in rungs]

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        """The `index`-th problem of `split` in bucket "AxB" (A and B digits; split by pair like `problem`)."""
        check_bucket(self, bucket)
        da, db = (int(x) for x in bucket.split("x"))
        return self._generate(split, index, da, db, bucket)

    def _generate(self, split: Split, i: int, da: int, db: int, bucket: str | None = None) -> dict[str, Any]:
        """Seeded draws of a `da` x `db`-digit pair until one is in `split` (a bucket has its own stream)."""
        key = (split, i) if bucket is None else (split, bucket, i)
        for attempt in range(10_000):
            rng = random.Random(stable_hash("multiply", self.seed, *key, attempt))
            a = rng.randint(10 ** (da - 1), 10**da - 1)
            b = rng.randint(10 ** (db - 1), 10**db - 1)
            test = in_test_split(tuple(sorted((a, b))), self.seed, self.params.test_fraction)
            if test == (split == "test"):
                return {"a": a, "b": b}
        where = "" if bucket is None else f" in bucket {bucket}"
        raise RuntimeError(f"multiply: no {split} problem{where} for index {i}")
