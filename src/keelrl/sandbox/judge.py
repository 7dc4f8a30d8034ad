"""The judge: compares a solution's answers with the expected outputs, in the trainer's process.

Contest judges do not ask the contestant's program whether it passed: the program gets inputs and
prints outputs, and the judge compares those with the answer key somewhere the program cannot reach.
Here too. A case is `{"args": "<Python source of the arguments>", "expected": <JSON value>}` (or
`"raises": "ValueError"` instead of `expected`); only `args` goes into the sandbox, which reports
each call's return value as JSON text (result.Answer). So nothing the model's code does in its own
process can change a verdict: shadowing names, patching builtins, introspecting the harness (`gc`,
frames), forging records or returning objects whose `__eq__` lies all leave only "what the call gave",
and that is compared here as plain data parsed by `json.loads`.

Comparison (`same`): JSON equality, with `bool` never equal to a number (`is True` tests stay strict)
and ints equal to floats of the same value (as `==` was); a tuple answers a list. Optional case fields:
- `raises`: the call must raise an instance of that built-in exception class (`ValueError` accepts
  `UnicodeDecodeError`);
- `view`: a name in VIEWS applied to the answer before comparing (`"len"`: a million primes compared by
  count, as the test it replaces did), here, on plain data;
- `args_after`: the arguments after the call must equal this list (functions that must not, or must,
  change their input).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from keelrl.sandbox.result import Answer, Call, ExecResult

Case = dict[str, Any]
VIEWS: dict[str, Callable[[Any], Any]] = {"len": len}
CASE_FIELDS: dict[str, type] = {
    "args": str,
    "expected": object,
    "raises": str,
    "view": str,
    "args_after": list,
}


@dataclass(frozen=True)
class Verdict:
    """`reason` is the execution's status, or `wrong_answer` when it ran but some case failed; `detail`
    names the first failing case."""

    passed: int
    total: int
    reason: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason == "ok"

    def info(self, formatted: bool, **extra: Any) -> dict[str, Any]:
        """A Score's info: formatted, reason, passed, total, then `extra`, then the first failure's detail."""
        info = dict(formatted=formatted, reason=self.reason, passed=self.passed, total=self.total, **extra)
        return info | ({"detail": self.detail[:300]} if self.detail else {})


def calls_of(cases: Sequence[Case]) -> list[Call]:
    """What goes into the sandbox for these cases: the arguments only."""
    return [Call(c["args"], "args_after" in c) for c in cases]


def same(expected: Any, got: Any) -> bool:
    """Equality of JSON data, with booleans distinct from numbers."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(same, expected, got))
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(same(v, got[k]) for k, v in expected.items())
        )
    if isinstance(expected, int | float):
        return isinstance(got, int | float) and got == expected
    return type(got) is type(expected) and got == expected


def _parse(text: str | None) -> tuple[bool, Any]:
    if text is None:
        return False, None
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):  # not JSON (a forged record), or nested past the parser's depth
        return False, None


def passes(case: Case, answer: Answer | None) -> bool:
    """Does this answer meet this case?"""
    if answer is None:
        return False
    if "raises" in case:
        return answer.kind == "raised" and case["raises"] in answer.raised
    if answer.kind != "value":
        return False
    ok, got = _parse(answer.text)
    if not ok:
        return False
    if "view" in case:
        try:
            got = VIEWS[case["view"]](got)
        except TypeError:  # len() of a number
            return False
    if "args_after" in case:
        ok, after = _parse(answer.args_after)
        if not (ok and same(case["args_after"], after)):
            return False
    return same(case["expected"], got)


SHOWN = {"value": "returned ", "raised": "raised ", "invalid": "invalid: "}  # an answer's kind in a verdict


def _shown(answer: Answer | None) -> str:
    return "no answer" if answer is None else SHOWN[answer.kind] + answer.text[:120]


def judge(cases: Sequence[Case], result: ExecResult, entry_point: str) -> Verdict:
    """The verdict on one execution of `calls_of(cases)`."""
    answers = [result.answers[i] if i < len(result.answers) else None for i in range(len(cases))]
    flags = [passes(c, a) for c, a in zip(cases, answers)]
    passed = sum(flags)
    if result.status != "ok":
        return Verdict(passed, len(cases), result.status, result.detail)
    if passed == len(cases):
        return Verdict(passed, len(cases), "ok")
    i = flags.index(False)
    case = cases[i]
    want = (
        f"raises {case['raises']}" if "raises" in case else f"expected {json.dumps(case['expected'])[:120]}"
    )
    detail = f"case {i} `{entry_point}({case['args'][:100]})`: {want}, {_shown(answers[i])}"
    return Verdict(passed, len(cases), "wrong_answer", detail)
