"""Countdown (TinyZero): combine the given numbers with + - * / to reach the target.

Problem: `{"numbers": [int, ...], "target": int}`, generated from the task seed: the numbers are combined by
a random expression tree with positive integer intermediate values, whose value is the target (always
solvable). Train and test are split by the sorted number multiset, so no test number set is trained on.
Reward (TinyZero's rule): 1.0 correct, 0.1 a well-formed answer that is wrong or invalid, 0.0 no answer.

Where this deliberately differs from TinyZero's `countdown.py` reward, and why:
- TinyZero evaluated the answer with Python `eval` behind a character whitelist, so `99**99**99` could
  stall the trainer. Here a small grammar (integers, binary + - * /, parentheses) is evaluated exactly with
  rationals; `**`, `//`, unary minus, decimals, names, calls and answers over 200 characters are invalid,
  and every input costs microseconds.
- TinyZero read `2.5` as the numbers 2 and 5 (it extracted digit runs); here a decimal point is invalid.
- TinyZero searched only the last line of the output; here the last complete `<answer>...</answer>` block
  anywhere counts (`last_answer`: linear time on any output).
- Only ASCII digits are numbers: TinyZero's digit-run regex and `int` read `٠26` (an Arabic-Indic zero) as 26
  in its numbers check (its `eval` then fails); here any other digit is an invalid character.
- Correctness is exact (a rational equal to the target), not |value - target| < 1e-5.
- An answer may state its value (`<answer>(1+2)*3 = 9</answer>`); it must then equal the expression's true
  value, so writing the target after a wrong expression earns nothing.
"""

from __future__ import annotations

import itertools
import operator
import random
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from pydantic import Field

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import (
    ANSWER_PREFIX,
    SYSTEM_BASE,
    SYSTEM_CHAT,
    SYSTEM_QWEN_INSTRUCT,
    THINK_PREFIX,
    Prompt,
    Score,
    Split,
    TaskParams,
    Template,
    check_bucket,
    in_test_split,
    last_answer,
)

MAX_ANSWER_CHARS = 200
MAX_LITERAL_DIGITS = 6
MAX_NESTING = 32

USER_TEXT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. "
    "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
USER_TEXT_ANSWER_ONLY = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number exactly once. Write only the equation in <answer> </answer> tags, "
    "like <answer> a + b </answer>."
)  # a concrete worked example gets copied verbatim by small models (measured with SmolLM2-135M)


class CountdownParams(TaskParams):
    ranges = ("numbers", "number", "target")
    min_numbers: int = Field(3, ge=2, le=6, description="Fewest numbers in a problem.")
    max_numbers: int = Field(4, ge=2, le=6, description="Most numbers in a problem.")
    min_number: int = Field(1, ge=1, description="Smallest number drawn.")
    max_number: int = Field(99, ge=1, le=10_000, description="Largest number drawn.")
    min_target: int = Field(1, ge=1, description="Smallest target accepted.")
    max_target: int = Field(999, ge=1, description="Largest target accepted.")
    test_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of number multisets reserved for the test split."
    )
    think: bool = Field(
        True,
        description=(
            "base/chat templates: ask for reasoning in <think> tags before the answer (TinyZero). False asks "
            "for the equation only and starts the assistant turn at '<answer>', for small models that cannot "
            "yet reason in text; the answer may then also end at the end of its line instead of '</answer>' "
            "(checked the same way, stated value included)."
        ),
    )


class InvalidExpression(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


_TOKEN_RE = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise InvalidExpression("bad_char", f"unexpected character {text[pos]!r} at {pos}")
        number, op = m.groups()
        if number is not None:
            if len(number) > MAX_LITERAL_DIGITS or (len(number) > 1 and number[0] == "0"):
                raise InvalidExpression("bad_number", f"number literal {number!r} not allowed")
            if text[m.end() : m.end() + 1] == ".":
                raise InvalidExpression("bad_char", "decimal numbers are not allowed")
            tokens.append(number)
        else:
            tokens.append(op)
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := atom (('*'|'/') atom)* ; atom := INT | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0
        self.numbers: list[int] = []

    def parse(self) -> Any:
        if not self.tokens:
            raise InvalidExpression("parse_error", "empty expression")
        tree = self._expr(0)
        if self.i != len(self.tokens):
            raise InvalidExpression("parse_error", f"unexpected {self.tokens[self.i]!r}")
        return tree

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _expr(self, depth: int) -> Any:
        return self._chain(("+", "-"), lambda: self._term(depth))

    def _term(self, depth: int) -> Any:
        return self._chain(("*", "/"), lambda: self._atom(depth))

    def _chain(self, ops: tuple[str, str], operand: Callable[[], Any]) -> Any:
        """operand (op operand)*, with any of `ops`, grouped from the left."""
        node = operand()
        while self._peek() in ops:
            op = self.tokens[self.i]
            self.i += 1
            node = (op, node, operand())
        return node

    def _atom(self, depth: int) -> Any:
        tok = self._peek()
        if tok is None:
            raise InvalidExpression("parse_error", "expression ends early")
        if tok == "(":
            if depth >= MAX_NESTING:
                raise InvalidExpression("parse_error", "parentheses nested too deeply")
            self.i += 1
            node = self._expr(depth + 1)
            if self._peek() != ")":
                raise InvalidExpression("parse_error", "missing ')'")
            self.i += 1
            return node
        if tok.isdigit():
            self.i += 1
            self.numbers.append(int(tok))
            return int(tok)
        raise InvalidExpression("parse_error", f"unexpected {tok!r} (unary operators are not allowed)")


OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _evaluate(node: Any) -> Fraction:
    if isinstance(node, int):
        return Fraction(node)
    op, left, right = node
    a, b = _evaluate(left), _evaluate(right)
    if op == "/" and b == 0:
        raise InvalidExpression("div_zero", "division by zero")
    return OPERATIONS[op](a, b)


def check_expression(expression: str, numbers: list[int]) -> Fraction:
    """Exact value of `expression` if it uses exactly the multiset `numbers` with + - * / and parentheses,
    else InvalidExpression (bad_char, bad_number, parse_error, wrong_numbers, div_zero, too_long)."""
    if len(expression) > MAX_ANSWER_CHARS:
        raise InvalidExpression("too_long", f"answer longer than {MAX_ANSWER_CHARS} characters")
    parser = _Parser(_tokenize(expression))
    tree = parser.parse()
    if sorted(parser.numbers) != sorted(numbers):
        raise InvalidExpression(
            "wrong_numbers", f"used {sorted(parser.numbers)}, must use each of {sorted(numbers)} once"
        )
    return _evaluate(tree)


def evaluate_expression(expression: str) -> Fraction:
    """Exact value of an arithmetic expression (integers, + - * /, parentheses; any numbers), else
    InvalidExpression: the countdown_tools environment's calculator."""
    if len(expression) > MAX_ANSWER_CHARS:
        raise InvalidExpression("too_long", f"expression longer than {MAX_ANSWER_CHARS} characters")
    return _evaluate(_Parser(_tokenize(expression)).parse())


_STATED_VALUE_RE = re.compile(r"^(.*?)=\s*(-?[0-9]{1,12})\s*$", re.DOTALL)


def score_countdown(numbers: list[int], target: int, completion: str, line_answer: bool = False) -> Score:
    """TinyZero's reward on `completion` (the assistant turn, including any prefix the prompt put there).
    `line_answer`: an answer opened by the prompt's '<answer>' prefix may also end at the end of its line
    (small models state the equation and stop without the closing tag); it is checked the same way."""
    answer = last_answer(completion, line_answer)
    if answer is None:
        return Score(0.0, False, {"formatted": False, "reason": "no_answer"})
    expression, stated = answer.strip(), None
    m = _STATED_VALUE_RE.match(expression)
    if m is not None:
        expression, stated = m.group(1).strip(), int(m.group(2))
    try:
        value = check_expression(expression, numbers)
    except InvalidExpression as err:
        return Score(0.1, False, {"formatted": True, "reason": err.reason, "answer": answer[:80]})
    if stated is not None and Fraction(stated) != value:
        return Score(0.1, False, {"formatted": True, "reason": "wrong_stated_value", "answer": answer[:80]})
    if value != target:
        info = {"formatted": True, "reason": "wrong_value", "value": str(value), "answer": answer[:80]}
        return Score(0.1, False, info)
    return Score(1.0, True, {"formatted": True, "reason": "correct", "answer": answer[:80]})


def random_expression(numbers: list[int], rng: random.Random) -> tuple[str, int] | None:
    """Combine all `numbers` (in a random order and tree shape) with random operations whose intermediate
    values are positive integers. Returns (expression, value), or None when a draw finds no valid step."""
    pool: list[tuple[str, int, bool]] = [(str(n), n, True) for n in numbers]  # (text, value, is_atom)
    rng.shuffle(pool)
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (ta, a, atom_a), (tb, b, atom_b) = pool[i], pool[j]
        ops = ["+", "*"]
        if a > b:
            ops.append("-")
        if b > 0 and a % b == 0 and b != 1:
            ops.append("/")
        op = rng.choice(ops)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        left = ta if atom_a else f"({ta})"
        right = tb if atom_b else f"({tb})"
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(f"{left}{op}{right}", value, False)]
    text, value, _ = pool[0]
    return (text, value) if value > 0 else None


class Countdown:
    """TinyZero's Countdown task with an exact, bounded-time checker."""

    name = "countdown"

    def __init__(self, seed: int = 0, **params: Any) -> None:
        self.seed, self.params = seed, CountdownParams(**params)

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return self._generate(split, index)

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        numbers, target = problem["numbers"], problem["target"]
        if template == "compact":  # for tiny character models: the numbers largest first, no instructions
            return Prompt("", f"{' '.join(map(str, sorted(numbers, reverse=True)))} -> {target}", "")
        system = {"chat": SYSTEM_CHAT, "qwen_instruct": SYSTEM_QWEN_INSTRUCT}.get(template, SYSTEM_BASE)
        think = self.params.think
        user = (USER_TEXT if think else USER_TEXT_ANSWER_ONLY).format(numbers=list(numbers), target=target)
        if think and template == "qwen_instruct":  # TinyZero's text has a space at the start of the user turn
            user = " " + user
        return Prompt(system, user, THINK_PREFIX if think else ANSWER_PREFIX)

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        return score_countdown(
            problem["numbers"], problem["target"], completion, line_answer=not self.params.think
        )

    def difficulty(self, problem: dict[str, Any]) -> str:
        return f"n{len(problem['numbers'])}"

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        """An expression that reaches the target (`solve`, brute force), or None when none is found."""
        return solve(list(problem["numbers"]), int(problem["target"]))

    def buckets(self) -> list[str]:
        """Difficulty buckets, easiest first: one per count of numbers, n{min_numbers} .. n{max_numbers}."""
        return [f"n{k}" for k in range(self.params.min_numbers, self.params.max_numbers + 1)]

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        """The `index`-th problem of `split` with the bucket's count of numbers (its own seeded stream)."""
        check_bucket(self, bucket)
        return self._generate(split, index, bucket)

    def _generate(self, split: Split, index: int, bucket: str | None = None) -> dict[str, Any]:
        """Seeded draws until a problem of `split` fits the ranges; the count of numbers is drawn too unless
        `bucket` fixes it (then the bucket is part of the seed, so each bucket has its own stream)."""
        p, key = self.params, (split, index) if bucket is None else (split, bucket, index)
        for attempt in range(10_000):
            rng = random.Random(stable_hash("countdown", self.seed, *key, attempt))
            n = rng.randint(p.min_numbers, p.max_numbers) if bucket is None else int(bucket[1:])
            numbers = [rng.randint(p.min_number, p.max_number) for _ in range(n)]
            if in_test_split(tuple(sorted(numbers)), self.seed, p.test_fraction) != (split == "test"):
                continue
            made = random_expression(numbers, rng)
            if made is not None and p.min_target <= made[1] <= p.max_target:
                return {"numbers": numbers, "target": made[1]}
        where = "" if bucket is None else f" in bucket {bucket}"
        raise RuntimeError(
            f"countdown: no {split} problem{where} for index {index} with {p}; widen the ranges"
        )


def solve(numbers: list[int], target: int) -> str | None:
    """Brute-force solver (exact rationals) for small problems; used by tests and as a reference answer."""
    items = [(str(n), Fraction(n)) for n in numbers]

    def rec(pool: list[tuple[str, Fraction]]) -> str | None:
        if len(pool) == 1:
            return pool[0][0] if pool[0][1] == target else None
        for i, j in itertools.permutations(range(len(pool)), 2):
            (ta, a), (tb, b) = pool[i], pool[j]
            rest = [p for k, p in enumerate(pool) if k not in (i, j)]
            for op in "+-*/":
                if op == "/" and b == 0:
                    continue
                found = rec([*rest, (f"({ta}{op}{tb})", OPERATIONS[op](a, b))])
                if found:
                    return found
        return None

    return rec(items)
