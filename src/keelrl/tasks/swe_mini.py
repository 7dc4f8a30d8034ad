"""swe_mini: fix one planted bug in a small generated Python repository, with tools, judged by hidden tests.

Problem: `{"id", "package", "family", "target", "files", "issue", "hidden", "fix"}`. `files` is the buggy
repository, path -> text: a package of 2-4 modules (`<package>/<module>.py`, 2-6 small functions each,
from FUNCTIONS, under seeded names and constants) and `tests/test_<module>.py` with plain
`def test_...(): assert ...` functions, at least one of which fails. `family` is the bug's family
(FAMILIES; it is `difficulty` and the bucket), `target` the bugged function (`pkg/mod.py::fn`), `issue`
the failing test and its message (what the model is told), `hidden` the judge cases (below) and `fix` the
one edit that undoes the bug (`{"path", "old", "new"}`, for `oracle_turns`; the model never sees it).
`id` names the repository: a hash of its correct modules. Train and test are split by that hash
(`in_test_split`), so no test repository, under any bug, is trained on. Generation is deterministic from
(seed, split, index), and the bug is checked to be real: the buggy code fails at least one visible test
and one hidden case (the expected values come from running the correct code here, once, at generation).

Episode: `reset` gives short instructions and the issue; each `step` runs the turn's tool calls
(keelrl.tasks.repo: list_files, read_file, replace_in_file, write_file, run_tests) on the episode's
`Workspace` (`state.scratch["workspace"]`) and returns their results; a turn without a tool call ends the
episode. `run_tests` runs the visible tests of the working copy in the sandbox: feedback only.

Score (`finish`): 1.0 and correct iff every hidden case passes, else 0.0. A hidden case calls one function
of the working copy's package (`{"args": "'pkg.mod', 'fn', ARGS", "expected": VALUE}`, repo.CALL_PROGRAM)
in the sandbox, and the judge compares the answer with the expected value in this process. The cases
cover every function of the package (deleting or stubbing code fails) on inputs that include ones the
visible tests do not show. No test file or runner of the working copy takes part, so rewriting or
deleting tests, exiting (`sys.exit`, `os._exit`, at import or in a function), patching builtins or a test
runner, `conftest.py` / `sitecustomize.py` and printing "OK" all leave the bug in place and score 0
(tests/unit/test_swe_mini.py). Not defended: memorising the hidden inputs, which the model never sees.
Not claimed: test repositories are new combinations, names, constants and inputs of the 31 functions of
one library (FUNCTIONS), not new functions; held-out repositories, not held-out code.
`info`: formatted (some tool call ran), reason (the judge's verdict or the sandbox status), passed,
total, detail (the first failing case), edits, family.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from string import Template
from typing import Any

from pydantic import Field

from keelrl.core.seeds import stable_hash
from keelrl.sandbox.config import SandboxConfig, sandbox_of
from keelrl.sandbox.judge import Case, calls_of, judge, same
from keelrl.sandbox.result import SandboxLimits
from keelrl.tasks.base import Score, Split, TaskParams, check_bucket, in_test_split
from keelrl.tasks.code import SandboxFailures, shared_pool
from keelrl.tasks.env import EpisodeState, Message, StepResult
from keelrl.tasks.repo import (
    CALL_ENTRY,
    CALL_PROGRAM,
    Workspace,
    call_case_args,
    minimal_edit,
    run_visible_tests,
    sandbox_job,
    tool_call_text,
    workspace_tools,
)
from keelrl.tasks.tools import run_tool_calls, used_tools

FAMILIES = tuple(
    "wrong_operator wrong_default wrong_init missing_edge_case off_by_one wrong_variable swapped_arguments".split()
)  # roughly easiest first: a guess, not measured
SYSTEM = (
    "You fix bugs in a small Python repository. Use the tools to read files, edit them and run the tests. "
    "Fix the package's code, not the tests. When you are done, answer without a tool call."
)
Inputs = Callable[[random.Random, dict[str, str]], list[str]]


@dataclass(frozen=True)
class Fn:
    """A function of the library: `source` with `$f` (its name), `$<dep>` (a dependency's name) and
    `$<param>`; `sites`: (family, correct text, buggy text), each occurring once in the source."""

    key: str
    names: tuple[str, ...]
    source: str
    sites: tuple[tuple[str, str, str], ...]
    inputs: Inputs
    deps: tuple[str, ...] = ()
    params: tuple[dict[str, str], ...] = ({},)


def _a(*args: Any, **kwargs: Any) -> str:
    return ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])


WORDS = tuple("apple river stone cloud lamp orange tiger music paper green bread ocean".split())
NAMES = ("ada", "alan", "grace", "linus", "barbara", "edsger", "donald", "margaret", "ken", "guido")
PALINDROMES = tuple(
    "Anna|racecar|never odd or even|Step on no pets|No lemon no melon|Top spot|taco cat|Madam".split("|")
)
NOT_PALINDROMES = ("hello", "Python", "open door", "Banana", "abca", "river stone", "Noon day")


def _ints(r: random.Random, n: int, lo: int = -9, hi: int = 20) -> list[int]:
    return [r.randint(lo, hi) for _ in range(n)]


def _phrase(r: random.Random, n: int) -> str:
    return " ".join(r.choice((str.lower, str.capitalize, str.upper))(w) for w in r.sample(WORDS, n))


def _clamp_in(r: random.Random, p: dict[str, str]) -> list[str]:
    lo = r.randint(-5, 5)
    hi = lo + r.randint(3, 9)
    return [_a(v, lo, hi) for v in (lo - r.randint(1, 5), lo + 1, hi - 1, hi + r.randint(1, 5), lo, hi)]


def _range_lists(r: random.Random, p: dict[str, str]) -> list[str]:
    out = []
    for i in range(6):
        lo = r.randint(-5, 5)
        hi = lo + r.randint(2, 6)
        values = [r.randint(lo - 3, hi + 3) for _ in range(r.randint(2, 5))] + ([hi] if i % 2 == 0 else [])
        out.append(_a(r.sample(values, len(values)), lo, hi))
    return out


def _leap_years(r: random.Random) -> list[int]:
    return [
        r.choice((1600, 2000, 2400)),
        r.choice((1700, 1800, 1900, 2100)),
        *r.sample((1996, 2004, 2012, 2024), 2),
        *r.sample((1999, 2019, 2023, 2025), 2),
    ]


def _texts_cut(r: random.Random, p: dict[str, str]) -> list[str]:
    out = []
    for extra in (0, 0, -1, -3, 3, -2):
        text = _phrase(r, r.randint(2, 3))
        out.append(_a(text, max(len(text) + extra, 5)))
    text = _phrase(r, 3)
    return [*out, _a(text, len(text) - 4, suffix="!")]


def _mark_lists(r: random.Random, p: dict[str, str]) -> list[str]:
    marks = [int(p["d"]), int(p["w"])]
    out = [_a([*r.sample(marks, 2), *_ints(r, r.randint(1, 3), 20, 95)]) for _ in range(4)]
    return [*out, _a(_ints(r, 3, 30, 90), pass_mark=r.choice((40, 70)))]


F = Fn
# fmt: off
FUNCTIONS: tuple[Fn, ...] = (
    F("clamp", ("clamp", "bound", "limit"),
      'def $f(value, low, high):\n    """value limited to the range low..high."""\n    if value < low:\n        return low\n'
      "    if value > high:\n        return high\n    return value\n",
      (("wrong_variable", "        return high\n", "        return low\n"), ("wrong_operator", "value > high", "value < high")),
      _clamp_in),
    F("clamp_all", ("clamp_all", "clamp_each", "bound_all"),
      'def $f(values, low, high):\n    """Every value limited to the range low..high, in order."""\n'
      "    return [$clamp(v, low, high) for v in values]\n",
      (("swapped_arguments", "$clamp(v, low, high)", "$clamp(v, high, low)"),), _range_lists, ("clamp",)),
    F("mean", ("mean", "average", "avg"),
      'def $f(values):\n    """The arithmetic mean of values; 0 for an empty list."""\n    if not values:\n        return 0\n'
      "    return sum(values) / len(values)\n",
      (("missing_edge_case", "    if not values:\n        return 0\n", ""), ("wrong_operator", "sum(values) / len(values)", "sum(values) // len(values)")),
      lambda r, p: [_a([]), *(_a(_ints(r, r.randint(2, 5))) for _ in range(4))]),
    F("power", ("power", "ipow", "raise_to"),
      'def $f(base, exp):\n    """base to the power exp (a whole number >= 0), by repeated multiplication."""\n    result = 1\n'
      "    for _ in range(exp):\n        result *= base\n    return result\n",
      (("wrong_init", "result = 1", "result = base"), ("off_by_one", "range(exp)", "range(1, exp)"), ("wrong_operator", "result *= base", "result += base")),
      lambda r, p: [_a(r.randint(2, 5), e) for e in (0, 1, 2, 3, r.randint(4, 6))]),
    F("powers", ("powers", "power_table", "power_list"),
      'def $f(base, count):\n    """[base ** 0, base ** 1, ..., base ** (count - 1)]."""\n    return [$power(base, k) for k in range(count)]\n',
      (("swapped_arguments", "$power(base, k)", "$power(k, base)"), ("off_by_one", "range(count)", "range(1, count)")),
      lambda r, p: [_a(r.randint(2, 4), c) for c in (0, 1, 3, 4, r.randint(5, 6))], ("power",)),
    F("count_between", ("count_between", "count_in_range", "how_many_between"),
      'def $f(values, low, high):\n    """How many values lie in low..high, both ends included."""\n    count = 0\n    for v in values:\n'
      "        if low <= v <= high:\n            count += 1\n    return count\n",
      (("off_by_one", "low <= v <= high", "low <= v < high"), ("wrong_init", "count = 0", "count = 1")), _range_lists),
    F("safe_divide", ("safe_divide", "safe_div", "divide_or"),
      'def $f(a, b, default=$d):\n    """a / b, or default when b is 0."""\n    if b == 0:\n        return default\n    return a / b\n',
      (("wrong_default", "default=$d", "default=$w"), ("missing_edge_case", "    if b == 0:\n        return default\n", "")),
      lambda r, p: [_a(r.randint(1, 20), 0), _a(r.randint(1, 20), r.randint(1, 5)), _a(r.randint(-9, 9), 0), _a(r.randint(1, 30), 4), _a(r.randint(1, 9), 0, default=99)],
      params=({"d": "0", "w": "None"}, {"d": "None", "w": "0"}, {"d": "-1", "w": "0"})),
    F("ratios", ("ratios", "relative_to", "divide_all"),
      'def $f(values, base):\n    """Each value divided by base (see $safe_divide)."""\n    return [$safe_divide(v, base) for v in values]\n',
      (("swapped_arguments", "$safe_divide(v, base)", "$safe_divide(base, v)"),),
      lambda r, p: [_a(_ints(r, r.randint(2, 4), 1, 12), b) for b in (1, 2, 3, 4, 8)], ("safe_divide",)),
    F("truncate", ("truncate", "shorten", "clip_text"),
      'def $f(text, limit, suffix="$d"):\n    """text cut to at most limit characters, ending in suffix when it was cut."""\n'
      "    if len(text) <= limit:\n        return text\n    return text[:limit - len(suffix)] + suffix\n",
      (("wrong_default", 'suffix="$d"', 'suffix="$w"'), ("off_by_one", "len(text) <= limit", "len(text) < limit"), ("wrong_operator", "limit - len(suffix)", "limit + len(suffix)")),
      _texts_cut, params=({"d": "...", "w": ".."}, {"d": "~", "w": "-"}, {"d": "..", "w": "..."})),
    F("count_vowels", ("count_vowels", "vowel_count", "num_vowels"),
      'def $f(text):\n    """Number of vowels (a, e, i, o, u, in either case) in text."""\n    return sum(1 for ch in text.lower() if ch in "aeiou")\n',
      (("missing_edge_case", "text.lower()", "text"),),
      lambda r, p: [_a(_phrase(r, r.randint(1, 3))) for _ in range(4)] + [_a("AEIOU"), _a("")]),
    F("join_words", ("join_words", "human_join", "and_join"),
      "def $f(words, sep=\"$d\"):\n    \"\"\"The words joined by sep, with ' and ' before the last; '' for no words.\"\"\"\n"
      '    if not words:\n        return ""\n    if len(words) == 1:\n        return words[0]\n'
      '    return sep.join(words[:-1]) + " and " + words[-1]\n',
      (("wrong_default", 'sep="$d"', 'sep="$w"'), ("missing_edge_case", "    if len(words) == 1:\n        return words[0]\n", ""), ("off_by_one", "words[:-1]", "words[:-2]")),
      lambda r, p: [_a(list(r.sample(WORDS, n))) for n in (0, 1, 2, 3, 4)] + [_a(list(r.sample(WORDS, 3)), sep=" / ")],
      params=({"d": ", ", "w": ","}, {"d": "; ", "w": ", "})),
    F("is_palindrome", ("is_palindrome", "reads_backwards", "palindromic"),
      'def $f(text):\n    """Whether text reads the same backwards, ignoring case and spaces."""\n'
      '    cleaned = text.replace(" ", "").lower()\n    return cleaned == cleaned[::-1]\n',
      (("missing_edge_case", '.replace(" ", "").lower()', ".lower()"), ("missing_edge_case", '.replace(" ", "").lower()', '.replace(" ", "")'),
       ("wrong_operator", "cleaned == cleaned[::-1]", "cleaned != cleaned[::-1]")),
      lambda r, p: [_a(t) for t in r.sample(PALINDROMES, 4) + r.sample(NOT_PALINDROMES, 2)]),
    F("word_counts", ("word_counts", "count_words", "word_frequencies"),
      'def $f(text):\n    """How many times each word occurs in text (words compared in lower case)."""\n    counts = {}\n'
      "    for word in text.lower().split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
      (("wrong_init", "counts.get(word, 0)", "counts.get(word, 1)"), ("missing_edge_case", "text.lower().split()", "text.split()")),
      lambda r, p: [_a(_phrase(r, 2) + " " + _phrase(r, 3)) for _ in range(4)] + [_a("")]),
    F("censor", ("censor", "mask_word", "redact"),
      'def $f(text, word, mask="$d"):\n    """text with every occurrence of word replaced by mask, repeated len(word) times."""\n'
      "    return text.replace(word, mask * len(word))\n",
      (("wrong_default", 'mask="$d"', 'mask="$w"'), ("swapped_arguments", "text.replace(word, mask * len(word))", "text.replace(mask * len(word), word)")),
      lambda r, p: [_a(f"the {w} and the {v}", r.choice((w, v))) for w, v in (r.sample(WORDS, 2) for _ in range(4))] + [_a("a red " + WORDS[0], WORDS[0], mask="-")],
      params=({"d": "*", "w": "#"}, {"d": "#", "w": "*"}, {"d": "x", "w": "_"})),
    F("initials", ("initials", "monogram", "short_name"),
      'def $f(name):\n    """The upper-case first letter of each word of name, each followed by a dot."""\n'
      '    return "".join(w[0].upper() + "." for w in name.split())\n',
      (("missing_edge_case", "w[0].upper()", "w[0]"),),
      lambda r, p: [_a(" ".join(r.choice((str.lower, str.capitalize))(n) for n in r.sample(NAMES, r.randint(1, 3)))) for _ in range(5)]),
    F("find_last", ("find_last", "last_index", "rindex_of"),
      'def $f(items, target):\n    """Index of the last occurrence of target in items, or -1 if it does not occur."""\n'
      "    for i in range(len(items) - 1, -1, -1):\n        if items[i] == target:\n            return i\n    return -1\n",
      (("off_by_one", "range(len(items) - 1, -1, -1)", "range(len(items) - 1, 0, -1)"), ("wrong_variable", "            return i\n", "            return items[i]\n")),
      lambda r, p: [_a([7, *_ints(r, 4, 0, 5)], 7), _a([9, 1, 9, 2], 9), _a(_ints(r, 5, 0, 5), 6), _a([3, 8, 3, 8, 1], 8), _a([0, 2, 4], 2)]),
    F("argmax", ("argmax", "index_of_max", "best_index"),
      'def $f(values):\n    """Index of the largest value (the first one on ties); -1 for an empty list."""\n    if not values:\n'
      "        return -1\n    best = 0\n    for i in range(1, len(values)):\n        if values[i] > values[best]:\n            best = i\n    return best\n",
      (("missing_edge_case", "    if not values:\n        return -1\n", ""), ("off_by_one", "values[i] > values[best]", "values[i] >= values[best]"),
       ("wrong_variable", "values[i] > values[best]", "values[i] > best")),
      lambda r, p: [_a([]), _a([4, 9, 2, 9, 1]), _a([-5, -2, -8]), _a(_ints(r, 5)), _a([3, 3, 1]), _a([1, 8, 10, 4])]),
    F("largest", ("largest", "maximum", "max_value"),
      'def $f(values):\n    """The largest value; None for an empty list."""\n    if not values:\n        return None\n    best = values[0]\n'
      "    for v in values[1:]:\n        if v > best:\n            best = v\n    return best\n",
      (("wrong_init", "best = values[0]", "best = 0"), ("missing_edge_case", "    if not values:\n        return None\n", ""), ("wrong_operator", "v > best", "v < best")),
      lambda r, p: [_a([]), _a(_ints(r, 4, -20, -1)), _a(_ints(r, 5)), _a([r.randint(-9, 9)]), _a(_ints(r, 3, -9, -1))]),
    F("pairs", ("pairs", "adjacent_pairs", "neighbours"),
      'def $f(items):\n    """Each item with the next one: [[a, b], [b, c], ...]."""\n    return [[items[i], items[i + 1]] for i in range(len(items) - 1)]\n',
      (("off_by_one", "range(len(items) - 1)", "range(len(items) - 2)"),),
      lambda r, p: [_a(_ints(r, n)) for n in (0, 1, 2, 3, 5)]),
    F("window_sums", ("window_sums", "moving_sums", "rolling_sums"),
      'def $f(values, size):\n    """The sums of every run of size consecutive values, in order."""\n'
      "    return [sum(values[i:i + size]) for i in range(len(values) - size + 1)]\n",
      (("off_by_one", "len(values) - size + 1", "len(values) - size"), ("off_by_one", "values[i:i + size]", "values[i:i + size - 1]")),
      lambda r, p: [_a(_ints(r, n), s) for n, s in ((4, 2), (5, 3), (3, 1), (6, 4), (3, 3))]),
    F("rotate", ("rotate", "rotate_left", "shift_left"),
      'def $f(items, k):\n    """items rotated left by k places (k may exceed the length)."""\n    if not items:\n        return []\n'
      "    k = k % len(items)\n    return items[k:] + items[:k]\n",
      (("missing_edge_case", "    if not items:\n        return []\n", ""), ("missing_edge_case", "    k = k % len(items)\n", "")),
      lambda r, p: [_a([], 2), _a(_ints(r, 4), 1), _a(_ints(r, 3), 5), _a(_ints(r, 5), 7), _a(_ints(r, 4), 0)]),
    F("split_parity", ("split_parity", "evens_and_odds", "split_even_odd"),
      'def $f(values):\n    """[evens, odds]: the even and the odd values, each in their original order."""\n'
      "    evens = [v for v in values if v % 2 == 0]\n    odds = [v for v in values if v % 2 == 1]\n    return [evens, odds]\n",
      (("wrong_variable", "return [evens, odds]", "return [odds, evens]"), ("wrong_operator", "v % 2 == 0]", "v % 2 == 1]")),
      lambda r, p: [_a(_ints(r, n)) for n in (3, 4, 5, 6)] + [_a([2, 4])]),
    F("is_leap_year", ("is_leap_year", "is_leap", "leap_year"),
      'def $f(year):\n    """Whether year is a leap year of the Gregorian calendar."""\n    if year % 400 == 0:\n        return True\n'
      "    if year % 100 == 0:\n        return False\n    return year % 4 == 0\n",
      (("missing_edge_case", "    if year % 400 == 0:\n        return True\n", ""), ("wrong_operator", "year % 4 == 0", "year % 4 != 0")),
      lambda r, p: [_a(y) for y in _leap_years(r)]),
    F("days_in_month", ("days_in_month", "month_length", "month_days"),
      'def $f(month, year):\n    """The number of days in month (1 to 12) of year."""\n    if month == 2:\n'
      "        return 29 if $is_leap_year(year) else 28\n    if month in (4, 6, 9, 11):\n        return 30\n    return 31\n",
      (("missing_edge_case", "(4, 6, 9, 11)", "(4, 6, 9)"), ("wrong_variable", "$is_leap_year(year)", "$is_leap_year(month)")),
      lambda r, p: [_a(m, y) for m, y in zip((2, 2, 11, r.choice((4, 6, 9)), r.choice((1, 5, 8, 12)), 2), _leap_years(r))], ("is_leap_year",)),
    F("days_in_year", ("days_in_year", "year_length", "year_days"),
      'def $f(year):\n    """The number of days in year, summed month by month."""\n    return sum($days_in_month(m, year) for m in range(1, 13))\n',
      (("swapped_arguments", "$days_in_month(m, year)", "$days_in_month(year, m)"), ("off_by_one", "range(1, 13)", "range(1, 12)")),
      lambda r, p: [_a(y) for y in _leap_years(r)[:5]], ("days_in_month",)),
    F("format_minutes", ("format_minutes", "clock_time", "as_hours"),
      'def $f(minutes):\n    """minutes as \'H:MM\', e.g. 75 -> \'1:15\'."""\n    hours, rest = divmod(minutes, 60)\n    return f"{hours}:{rest:02d}"\n',
      (("swapped_arguments", "divmod(minutes, 60)", "divmod(60, minutes)"), ("missing_edge_case", "{rest:02d}", "{rest}")),
      lambda r, p: [_a(m) for m in (r.randint(61, 69), r.randint(1, 9), 60, r.randint(130, 200), 0, r.randint(600, 900))]),
    F("apply_discount", ("apply_discount", "discounted", "reduce_price"),
      'def $f(price, percent):\n    """price reduced by percent per cent, rounded to 2 decimals."""\n    return round(price * (100 - percent) / 100, 2)\n',
      (("wrong_operator", "(100 - percent)", "(100 + percent)"),),
      lambda r, p: [_a(r.randint(10, 200), pc) for pc in r.sample((5, 10, 15, 20, 25, 50), 5)]),
    F("order_total", ("order_total", "basket_total", "cart_total"),
      'def $f(prices, percent):\n    """The sum of prices, less a discount of percent per cent."""\n    return $apply_discount(sum(prices), percent)\n',
      (("swapped_arguments", "$apply_discount(sum(prices), percent)", "$apply_discount(percent, sum(prices))"),),
      lambda r, p: [_a(_ints(r, r.randint(2, 4), 5, 90), pc) for pc in r.sample((5, 10, 20, 30, 40), 4)], ("apply_discount",)),
    F("split_bill", ("split_bill", "share_per_person", "per_head"),
      'def $f(total, people, tip=$d):\n    """Each person\'s share of total plus a tip of tip per cent, rounded to 2 decimals."""\n'
      "    return round(total * (100 + tip) / 100 / people, 2)\n",
      (("wrong_default", "tip=$d", "tip=$w"), ("wrong_operator", "(100 + tip)", "(100 - tip)")),
      lambda r, p: [_a(r.randint(20, 300), r.randint(1, 6)) for _ in range(3)] + [_a(r.randint(20, 300), 2, tip=r.choice((0, 5, 25)))],
      params=({"d": "10", "w": "15"}, {"d": "15", "w": "20"}, {"d": "20", "w": "10"})),
    F("letter_grade", ("letter_grade", "grade", "grade_of"),
      'def $f(score):\n    """\'A\' for 90 and above, \'B\' for 80 to 89, \'C\' for 70 to 79, \'F\' below 70."""\n'
      '    if score >= 90:\n        return "A"\n    if score >= 80:\n        return "B"\n    if score >= 70:\n        return "C"\n    return "F"\n',
      (("off_by_one", "score >= 80", "score > 80"), ("off_by_one", "score >= 90", "score > 90"), ("wrong_variable", 'return "C"', 'return "B"')),
      lambda r, p: [_a(s) for s in (90, 80, 70, r.randint(91, 100), r.randint(81, 89), r.randint(71, 79), r.randint(0, 69))]),
    F("pass_count", ("pass_count", "count_passed", "passes"),
      'def $f(scores, pass_mark=$d):\n    """How many scores reach pass_mark."""\n    return sum(1 for s in scores if s >= pass_mark)\n',
      (("wrong_default", "pass_mark=$d", "pass_mark=$w"), ("off_by_one", "s >= pass_mark", "s > pass_mark")),
      _mark_lists, params=({"d": "50", "w": "60"}, {"d": "60", "w": "50"}, {"d": "40", "w": "50"})),
)
BY_KEY = {f.key: f for f in FUNCTIONS}
# theme: (module names, docstring, function keys)
THEMES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "numeric": (("numeric", "mathutil", "arith", "calc"), "Numeric helpers.", ("clamp", "clamp_all", "mean", "power", "powers", "count_between", "safe_divide", "ratios")),
    "text": (("text", "strings", "textutil", "words"), "Text helpers.", ("truncate", "count_vowels", "join_words", "is_palindrome", "word_counts", "censor", "initials")),
    "lists": (("lists", "seqs", "listutil", "sequences"), "List helpers.", ("find_last", "argmax", "largest", "pairs", "window_sums", "rotate", "split_parity")),
    "dates": (("dates", "calendar_util", "timeutil", "clock"), "Calendar and clock helpers.", ("is_leap_year", "days_in_month", "days_in_year", "format_minutes")),
    "money": (("pricing", "money", "billing", "shop"), "Prices and bills.", ("apply_discount", "order_total", "split_bill", "safe_divide")),
    "grades": (("grades", "scoring", "marks"), "Marks and grades.", ("letter_grade", "pass_count", "mean", "largest", "count_between")),
}
# fmt: on
PACKAGES = tuple("toolbox helpers minilib basics handy utilkit corekit smallutils everyday workbench".split())


class SweMiniParams(TaskParams):
    ranges = ("modules",)
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of repositories in the test split.")
    min_modules: int = Field(2, ge=2, le=4, description="Fewest modules in a repository's package.")
    max_modules: int = Field(3, ge=2, le=4, description="Most modules in a repository's package.")
    readonly_tests: bool = Field(False, description="Refuse edits under tests/ (hidden tests decide anyway).")
    timeout_s: float = Field(5.0, gt=0.0, le=600.0, description="Wall-clock and CPU limit per run (s).")
    memory_mb: int = Field(256, ge=64, le=1 << 20, description="Address-space limit per process (MB).")
    max_processes: int = Field(8, ge=1, le=4096, description="Processes and threads a run may have.")
    workers: int = Field(0, ge=0, description="Sandboxes run at once (shared pool); 0 means one per CPU.")


# ------------------------------------------------------------------------------------------ generation


Module = tuple[str, str, list[tuple[Fn, str, dict[str, str]]]]  # (name, docstring, [(fn, its name, params)])


@dataclass
class _Plan:
    package: str
    modules: list[Module]
    target: tuple[int, int]  # (module index, function index)
    site: tuple[str, str, str]

    def render(self, buggy: bool) -> dict[str, str]:
        """module path -> source (the package only, no tests)."""
        names = {fn.key: name for _, _, fns in self.modules for fn, name, _ in fns}
        out = {f"{self.package}/__init__.py": f'"""{self.package}: small helper functions."""\n'}
        for m, (module, doc, fns) in enumerate(self.modules):
            parts = []
            for i, (fn, name, params) in enumerate(fns):
                src = Template(fn.source).substitute(names, f=name, **params)
                if buggy and (m, i) == self.target:
                    _, old, new = (Template(s).substitute(names, f=name, **params) for s in self.site)
                    assert src.count(old) == 1, (fn.key, old)
                    src = src.replace(old, new)
                parts.append(src)
            out[f"{self.package}/{module}.py"] = f'"""{doc}"""\n\n\n' + "\n\n".join(parts)
        return out


def _plan(rng: random.Random, family: str, p: SweMiniParams) -> _Plan:
    target = rng.choice([f for f in FUNCTIONS if any(s[0] == family for s in f.sites)])
    first = rng.choice([t for t, (_, _, keys) in THEMES.items() if target.key in keys])
    n = rng.randint(p.min_modules, p.max_modules)
    themes = [first, *rng.sample([t for t in THEMES if t != first], n - 1)]
    used: set[str] = set()
    modules = []
    for j, theme in enumerate(themes):
        module_names, doc, keys = THEMES[theme]
        free = [k for k in keys if k not in used and k != target.key]
        chosen: list[str] = []
        want = rng.randint(2, 3)  # functions drawn, each with its dependencies, in this module
        for key in ([target.key] if j == 0 else []) + rng.sample(free, len(free)):
            chain = [key]
            while BY_KEY[chain[-1]].deps:
                chain.append(BY_KEY[chain[-1]].deps[0])
            if want == 0 or any(k in used and k not in chosen for k in chain):
                continue  # enough, or a dependency already lives in another module
            want -= 1
            chosen += [k for k in chain if k not in chosen]
            used.update(chain)
        rng.shuffle(chosen)
        fns = [(BY_KEY[k], rng.choice(BY_KEY[k].names), dict(rng.choice(BY_KEY[k].params))) for k in chosen]
        modules.append((module_names[rng.randrange(len(module_names))], doc, fns))
    t = next(i for i, (fn, _, _) in enumerate(modules[0][2]) if fn.key == target.key)
    site = rng.choice([s for s in target.sites if s[0] == family])
    return _Plan(rng.choice(PACKAGES), modules, (0, t), site)


def _call_args(args: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments as written in a call (literals: no builtins) -> (positional, keyword) values."""
    return eval(f"_pack({args})", {"__builtins__": {}, "_pack": lambda *a, **k: (a, k)})


def _outcome(ns: dict[str, Any], name: str, args: str) -> tuple[str, Any]:
    """What our own generated code gives on args, run here: ('value', JSON data) or ('raised', 'Name: msg')."""
    try:
        a, kw = _call_args(args)
        value = ns[name](*a, **kw)
        return "value", json.loads(json.dumps(value, allow_nan=False))
    except Exception as err:  # what a buggy variant raises is part of its outcome
        return "raised", f"{type(err).__name__}: {err}"


def _caught(expected: Any, got: tuple[str, Any]) -> bool:
    """Whether a test expecting `expected` fails on `got` (what the buggy code gives)."""
    return got[0] != "value" or not same(expected, got[1])


def _test_fn(name: str, k: int, args: str, expected: Any) -> str:
    msg = f"{name}({args})".replace("%", "%%") + " returned %r, expected " + repr(expected).replace("%", "%%")
    op = "is" if expected is None or isinstance(expected, bool) else "=="
    return f"def test_{name}_{k}():\n    got = {name}({args})\n    assert got {op} {expected!r}, {msg!r} % (got,)\n"


def _build(plan: _Plan, rng: random.Random, family: str) -> dict[str, Any] | None:
    """The problem for this plan, or None when the bug is not observable on the drawn inputs."""
    correct, buggy = plan.render(False), plan.render(True)
    files = dict(buggy)
    hidden: list[Case] = []
    for m, (module, _, fns) in enumerate(plan.modules):
        path = f"{plan.package}/{module}.py"
        ns_ok, ns_bug = dict[str, Any](), dict[str, Any]()
        exec(compile(correct[path], path, "exec"), ns_ok)
        exec(compile(buggy[path], path, "exec"), ns_bug)
        tests: list[str] = []
        for i, (fn, name, params) in enumerate(fns):
            rows = []
            for args in dict.fromkeys(fn.inputs(rng, params)):  # distinct, in order
                good = _outcome(ns_ok, name, args)
                if good[0] == "value":
                    rows.append((args, good[1], _outcome(ns_bug, name, args)))
            rng.shuffle(rows)
            bad = [r for r in rows if _caught(r[1], r[2])]
            shown = [r for r in rows if r not in bad][: rng.randint(1, 2)]
            if (m, i) == plan.target:  # always reached: it sets issue, target and fix
                if not bad:
                    return None
                shown = [bad[0], *shown[:1]]
                args, expected, (kind, why) = bad[0]
                if kind == "value":  # a wrong value, as the test's assert reports it
                    why = f"AssertionError: {name}({args}) returned {why!r}, expected {expected!r}"
                issue = f"tests/test_{module}.py::test_{name}_1 fails:\n    {why}"
                target, fix = f"{path}::{name}", minimal_edit(path, buggy[path], correct[path])
            tests += [_test_fn(name, k, a, e) for k, (a, e, _) in enumerate(shown, 1)]
            hidden += [
                {"args": call_case_args(f"{plan.package}.{module}", name, a), "expected": e}
                for a, e, _ in rows
            ]
        imports = ", ".join(name for _, name, _ in fns)
        files[f"tests/test_{module}.py"] = (
            f"from {plan.package}.{module} import {imports}\n\n\n" + "\n\n".join(tests)
        )
    return {
        "id": repository_id(plan.package, correct),
        "package": plan.package,
        "family": family,
        "target": target,
        "files": files,
        "issue": issue,
        "hidden": hidden,
        "fix": fix,
    }


def repository_id(package: str, modules: dict[str, str]) -> str:
    """The repository's identity: a hash of its correct modules (the split key)."""
    return f"{package}-{stable_hash('swe_mini_repo', sorted(modules.items())) % 16**10:010x}"


def generate(
    seed: int, split: Split, index: int, params: SweMiniParams, family: str | None = None
) -> dict[str, Any]:
    """The `index`-th problem of `split` (of `family`, or of a drawn family: each family its own stream)."""
    for attempt in range(10_000):
        rng = random.Random(stable_hash("swe_mini", seed, split, family, index, attempt))
        fam = family or rng.choice(FAMILIES)
        plan = _plan(rng, fam, params)
        held_out = in_test_split(repository_id(plan.package, plan.render(False)), seed, params.test_fraction)
        if held_out == (split == "test") and (problem := _build(plan, rng, fam)) is not None:
            return problem
    raise RuntimeError(f"swe_mini: no {split} problem for index {index}")  # not reached with sane params


def oracle_turns(problem: dict[str, Any]) -> list[str]:
    """A policy that knows the fix: read the file, undo the bug, run the tests, then say it is done."""
    fix = problem["fix"]
    return [
        "Let me look at the code.\n" + tool_call_text("read_file", path=fix["path"]),
        "Here is the bug.\n"
        + tool_call_text("replace_in_file", path=fix["path"], old=fix["old"], new=fix["new"]),
        tool_call_text("run_tests"),
        "The bug is fixed and the tests pass.",
    ]


# ------------------------------------------------------------------------------------------ environment


class SweMini:
    """Generated repositories with one planted bug; tools to fix it; hidden tests to judge the fix."""

    name = "swe_mini"

    def __init__(self, seed: int = 0, sandbox: SandboxConfig | None = None, **params: Any) -> None:
        self.seed, self.sandbox = seed, sandbox_of(sandbox)  # [sandbox] isolation
        self.params = p = SweMiniParams(**params)
        self.limits = SandboxLimits(
            wall_s=p.timeout_s, memory_mb=p.memory_mb, processes=p.max_processes, tmp_mb=16
        )
        self.tools = workspace_tools(None, None)
        self._failures = SandboxFailures("swe_mini")

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return generate(self.seed, split, index, self.params)

    def buckets(self) -> list[str]:
        return list(FAMILIES)

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        check_bucket(self, bucket)
        return generate(self.seed, split, index, self.params, bucket)

    def difficulty(self, problem: dict[str, Any]) -> str:
        return str(problem["family"])

    def reset(self, problem: dict[str, Any], seed: int) -> list[Message]:
        files = ", ".join(sorted(problem["files"]))
        user = f"Repository `{problem['package']}` (files: {files}).\nBug report: {problem['issue']}"
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    def workspace(self, state: EpisodeState) -> Workspace:
        """The episode's working copy, made from the problem on first use."""
        ws = state.scratch.get("workspace")
        if ws is None:
            readonly = ("tests",) if self.params.readonly_tests else ()
            ws = state.scratch["workspace"] = Workspace(state.problem["files"], readonly=readonly)
        return ws

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        ws = self.workspace(state)
        tools = workspace_tools(ws, lambda: run_visible_tests(ws.files, self._pool(), self.limits))
        return run_tool_calls(assistant_turn, tools).step_result()

    def finish(self, state: EpisodeState) -> Score:
        ws = self.workspace(state)
        cases = state.problem["hidden"]
        job = sandbox_job(ws.files, CALL_PROGRAM, CALL_ENTRY, calls_of(cases), self.limits)
        result = self._pool().submit(job).result()
        verdict = judge(cases, result, CALL_ENTRY)
        info = verdict.info(used_tools(state.infos), edits=ws.edits, family=state.problem["family"])
        self._failures.observe(result)
        return Score(1.0 if verdict.ok else 0.0, verdict.ok, info)

    def close(self, state: EpisodeState) -> None:
        state.scratch.pop("workspace", None)

    def _pool(self) -> Any:
        return shared_pool(self.sandbox.isolation, self.params.workers)
