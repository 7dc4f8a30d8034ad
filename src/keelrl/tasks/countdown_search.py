"""Countdown as a written search (Stream of Search, Gandhi et al. 2024): traces, their parser, and the task.

A tiny character model cannot solve three-number Countdown in one shot (recipes/demo.py's docstring), but it can
learn to *search* in text: try an operation on two numbers, check what is left, back up on a dead end. This
module writes such searches as compact text for pretraining, reads them back out of model output for
behaviour statistics, and wraps keelrl's Countdown (same problems, splits and checker) as the task
"countdown_search".

The trace format (one character is one token, so every character is paid for when sampling). After the
compact prompt (`"13 7 3 -> 46"`, numbers largest first) and a newline:

    13+7=20:20+3=23 20-3=17 20*3=60
    13*3=39:39+7=46!
    <answer>(13*3)+7</answer>

- A line starts with one tried operation on two of the current numbers, larger first (`13+7=20`). When it
  leaves two numbers, a `:` follows and then the final-level checks: each operation on those two, always
  in the order + - * / (so a `!` can only come from reading the target, not from a position), separated by
  spaces; `!` marks the one that reaches the target and ends the search. When it leaves three or more
  (4-number problems), `|` and the numbers left follow (largest first), and the children come on the next
  lines, indented by one space per level. A two-number problem is its checks alone (`8+6=14 8-6=2!`).
  With `echo`, each line starts with the target and `>` (`46>13+7=20:...`): the comparison is then made a
  few characters from a copy of the target.
- A line that ends without `!` is a dead end; the next line at the same or a shallower indentation is a
  backtrack. A search that exhausts its node budget writes `?` on its own line and stops with no answer.
- The answer is the path to the `!`, as an expression over the original numbers.

Strategies (`STRATEGIES`) order the operations tried at each level: "dfs" (fixed order), "dfs_random",
"best_first" (the state whose closest number is nearest the target first). `CORPUS_MIX` mixes them with node
budgets, so the corpus holds wandering searches and failures (`?`), not only short optimal ones.

Departures from Stream of Search, stated: its traces name every state and node ("Exploring Operation: ...,
Resulting Numbers: [...]"); here the state is implied by the line's head except in 4-number problems, which
keeps a trace at 30-250 characters. Its best-first search (BFS-like frontier over all depths) is replaced by
a depth-first search whose children are tried in heuristic order ("best_first"): a line-per-node text can
then be read without node ids. Only positive integer intermediate results are tried (TinyZero's generator
makes the same ones), and an intermediate result above twice the target is not expanded; the checker still
accepts any valid expression.

`behaviour(problem, completion)` is a pure parser of such text that never raises on arbitrary output; its
numbers (found, nodes, backtracks, verified, arithmetic errors, false marks, ...) become `eval/search/<name>`
metrics.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from keelrl.core.seeds import stable_hash
from keelrl.tasks.countdown import OPERATIONS, Countdown, score_countdown

GIVE_UP = "?"

# A candidate step: (index i, index j, op, result) on the current numbers; numbers[i] >= numbers[j].
Step = tuple[int, int, str, int]
# A strategy orders the candidate steps of one state: (numbers, steps, target, rng) -> steps in trial order.
Strategy = Callable[[list[int], list[Step], int, random.Random], list[Step]]


def candidate_steps(numbers: list[int]) -> list[Step]:
    """Every operation on two of `numbers` (larger first) with a positive integer result."""
    out: list[Step] = []
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            a, b = (i, j) if numbers[i] >= numbers[j] else (j, i)
            x, y = numbers[a], numbers[b]
            out.append((a, b, "+", x + y))
            if x > y:
                out.append((a, b, "-", x - y))
            out.append((a, b, "*", x * y))
            if y > 0 and x % y == 0:
                out.append((a, b, "/", x // y))
    return out


def _remaining(numbers: list[int], step: Step) -> list[int]:
    i, j, _, result = step
    return sorted([n for k, n in enumerate(numbers) if k not in (i, j)] + [result], reverse=True)


def dfs(numbers: list[int], steps: list[Step], target: int, rng: random.Random) -> list[Step]:
    """Depth-first in a fixed order: pairs left to right (largest numbers first), operations + - * /."""
    return list(steps)


def dfs_random(numbers: list[int], steps: list[Step], target: int, rng: random.Random) -> list[Step]:
    """Depth-first in a random order: no idea where the target is."""
    steps = list(steps)
    rng.shuffle(steps)
    return steps


def heuristic(numbers: list[int], target: int) -> int:
    """Distance of a state to the target: how far its closest number is (0: a number equals it)."""
    return min(abs(target - n) for n in numbers)


def best_first(numbers: list[int], steps: list[Step], target: int, rng: random.Random) -> list[Step]:
    """Children in order of `heuristic` on the state they leave (ties in random order)."""
    keyed = [(heuristic(_remaining(numbers, s), target), rng.random(), s) for s in steps]
    return [s for _, _, s in sorted(keyed)]


STRATEGIES: dict[str, Strategy] = {"dfs": dfs, "dfs_random": dfs_random, "best_first": best_first}


def search_trace(
    numbers: list[int],
    target: int,
    strategy: str = "best_first",
    budget: int = 64,
    rng: random.Random | None = None,
    cap: float = 2.0,
    echo: bool = False,
) -> str:
    """The text of one search (module docstring) for `numbers` -> `target`: depth-first, children ordered by
    `STRATEGIES[strategy]`, at most `budget` stated operations; ends with the answer or with `?`. Steps
    that leave more than two numbers are not tried when their result exceeds `cap` x target (pruning
    that keeps the arithmetic small; the final-level checks are all written). `echo`: start each line with
    the target and `>` (`46>13+7=20:...`), so the comparison with the target is made near it."""
    order = STRATEGIES[strategy]
    rng = rng or random.Random(0)
    lines: list[str] = []
    count = 0
    lead = f"{target}>" if echo else ""

    def check(pair: list[tuple[int, str]], line: str) -> str | None:
        """The final-level checks of two numbers, in one fixed order (+ - * /), on one line after `line`."""
        nonlocal count
        checks: list[str] = []
        (x, ex), (y, ey) = pair
        found = None
        for a, b, o, r in candidate_steps([x, y]):
            if count >= budget:
                break
            count += 1
            checks.append(f"{[x, y][a]}{o}{[x, y][b]}={r}{'!' if r == target else ''}")
            if r == target:
                found = f"{_wrap([ex, ey][a])}{o}{_wrap([ex, ey][b])}"
                break
        lines.append(line + " ".join(checks))
        return found

    def rec(state: list[tuple[int, str]], depth: int) -> str | None:
        """state: (value, expression) pairs, largest first. Returns the answer expression, or None."""
        nonlocal count
        values = [v for v, _ in state]
        steps = [s for s in candidate_steps(values) if len(values) == 2 or s[3] <= cap * target]
        for step in order(values, steps, target, rng):
            if count >= budget:
                return None
            i, j, op, result = step
            count += 1
            head = f"{values[i]}{op}{values[j]}={result}"
            expr = f"{_wrap(state[i][1])}{op}{_wrap(state[j][1])}"
            rest = sorted(
                [s for k, s in enumerate(state) if k not in (i, j)] + [(result, expr)], reverse=True
            )
            if len(rest) == 2:
                found = check(rest, " " * depth + lead + head + ":")
            else:
                lines.append(" " * depth + lead + head + "|" + " ".join(str(v) for v, _ in rest))
                found = rec(rest, depth + 1)
            if found is not None:
                return found
        return None

    start = sorted(((n, str(n)) for n in numbers), reverse=True)
    answer = check(start, lead) if len(start) == 2 else rec(start, 0)  # two numbers: the checks alone
    lines.append(GIVE_UP if answer is None else f"<answer>{answer}</answer>")
    return "\n".join(lines)


def _wrap(expr: str) -> str:
    return expr if expr.isdigit() else f"({expr})"


# The corpus's mixture of (strategy, node budget, weight): searches that are not all optimal, some failing.
CORPUS_MIX: tuple[tuple[str, int, float], ...] = (
    ("best_first", 32, 0.35),
    ("dfs", 32, 0.35),
    ("dfs_random", 32, 0.15),
    ("dfs_random", 10, 0.15),
)


def trace_corpus_text(
    task: Any, index: int, seed: int, mix: tuple[tuple[str, int, float], ...] = CORPUS_MIX, echo: bool = False
) -> str:
    """One pretraining example: train problem `index`'s compact prompt, a newline, and a search trace by a
    strategy and budget drawn from `mix`. Only the "train" split is read, so no held-out problem leaks."""
    problem = task.problem("train", index)
    rng = random.Random(stable_hash("search_corpus", seed, index))
    strategy, budget, _ = rng.choices(mix, weights=[w for _, _, w in mix])[0]
    numbers = sorted(problem["numbers"], reverse=True)
    prompt = f"{' '.join(map(str, numbers))} -> {problem['target']}"
    return f"{prompt}\n{search_trace(numbers, problem['target'], strategy, budget, rng, echo=echo)}"


def packed_corpus_text(
    task: Any,
    index: int,
    seed: int,
    length: int = 256,
    mix: tuple[tuple[str, int, float], ...] = CORPUS_MIX,
    echo: bool = False,
) -> str:
    """Whole examples (`trace_corpus_text`) joined by "<eos>" up to `length` characters: packed sequences
    waste no compute on padding (traces run from 30 to 250 characters). Pack `index` holds examples
    index * 64, index * 64 + 1, ...; an example longer than `length` is left out."""
    parts: list[str] = []
    total = 0
    for k in range(64):
        text = trace_corpus_text(task, index * 64 + k, seed, mix, echo)
        if len(text) > length:
            continue
        if total + len(text) + 5 > length and parts:
            break
        parts.append(text)
        total += len(text) + 5
    return "<eos>".join(parts)


_OP_RE = re.compile(r"([0-9]{1,7})([-+*/])([0-9]{1,7})=([0-9]{1,9})(!?)")
MAX_PARSE_CHARS = 20_000  # bounded work on any output; traces of the recipe are under 400


def behaviour(problem: dict[str, Any], completion: str) -> dict[str, float]:
    """Search statistics of one completion (pure; any text gives numbers, never an exception):
    correct (the Countdown checker's verdict), found (a final-level step reaches the target with true
    arithmetic), answered (an <answer> block), verified (answered, and the last operation written before the
    first <answer> states the target), gave_up (a `?` line), nodes (operations stated before the answer),
    backtracks (search lines followed by a line at the same or a shallower level), arith_errors (stated
    results that are wrong), arith_error_rate (arith_errors / nodes, 0 without nodes), any_arith_error, false_marks
    (operations marked `!`, "reaches the target", whose stated result is not the target: "4*1=4!" for 6)."""
    target = problem.get("target")
    numbers = list(problem.get("numbers", []))
    text = completion[:MAX_PARSE_CHARS] if isinstance(completion, str) else ""
    cut = text.find("<answer>")
    search = text if cut < 0 else text[:cut]
    nodes = errors = backtracks = false_marks = 0
    found = gave_up = False
    last_result: int | None = None
    prev_depth: int | None = None
    for line in search.split("\n"):
        if line.strip() == GIVE_UP:
            gave_up = True
            continue
        ops = list(_OP_RE.finditer(line))
        if not ops:
            continue
        depth = len(line) - len(line.lstrip(" "))
        if prev_depth is not None and depth <= prev_depth:
            backtracks += 1
        prev_depth = depth
        colon = line.find(":")
        for m in ops:
            a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            nodes += 1
            ok = not (op == "/" and b == 0) and OPERATIONS[op](Fraction(a), b) == c
            errors += not ok
            false_marks += m.group(5) == "!" and c != target
            last_result = c
            if ok and c == target and (0 <= colon < m.start() or (colon < 0 and "|" not in line)):
                found = True
    try:
        correct = (
            bool(score_countdown(numbers, int(target), completion).correct) if target is not None else False
        )
    except (TypeError, ValueError):
        correct = False
    answered = cut >= 0 and "</answer>" in text[cut:]
    return {
        "correct": float(correct),
        "found": float(found),
        "answered": float(answered),
        "verified": float(answered and last_result is not None and last_result == target),
        "gave_up": float(gave_up),
        "nodes": float(nodes),
        "backtracks": float(backtracks),
        "arith_errors": float(errors),
        "arith_error_rate": errors / nodes if nodes else 0.0,
        "any_arith_error": float(errors > 0),
        "false_marks": float(false_marks),
    }


class CountdownSearch(Countdown):
    """Countdown answered by a written search: keelrl's Countdown (problems, splits, checker, buckets, its
    compact prompt for tiny models) inherited, and `behaviour` for eval statistics. Params are Countdown's."""

    name = "countdown_search"

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        """A best-first search trace that ends in a correct answer (or Countdown's expression if the search
        finds none within its budget): what the model should write."""
        trace = search_trace(
            sorted(problem["numbers"], reverse=True), problem["target"], "best_first", 10_000
        )
        return trace if not trace.endswith(GIVE_UP) else super().reference_answer(problem)

    def behaviour(self, problem: dict[str, Any], completion: str) -> dict[str, float]:
        return behaviour(problem, completion)
