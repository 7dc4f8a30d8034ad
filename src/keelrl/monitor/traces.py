"""Sampled text: the statistics shared by the trainer's metrics, the guards and the doctor, and the doctor's
analysis of and rules over the stored rollouts (rollouts.jsonl.gz): gibberish, format-only answers rising,
self-verification phrases, and quoted samples attached to every finding."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from keelrl.guards.base import Finding, num, step_of
from keelrl.rollout.types import is_truncated

T = TypeVar("T")

REPETITION_N = 4
REPETITION_THRESHOLD = 0.5

# Trace findings (doctor only). Measured on this machine (docs/doctor.md): completions of the random-init
# smoke model are 100% gibberish by the test below; a tiny model trained to write only digits, 0%.
# Half the completions is far from both ends.
GIBBERISH_FRAC = 0.5
# A completion is gibberish when less than this share of its characters belongs to plain tokens.
PLAIN_MIN = 0.5
# Format-only answers (right tags, wrong content) rising by this much between the first and last quarter
# of the logged steps is reported. REFERENCE: format-only rewards alone gave +16 points on MATH-500 for
# Qwen2.5-Math-7B, so a policy can gain a lot of reward from tags alone; 0.2 is a heuristic step.
FORMAT_ONLY_RISE = 0.2

# Self-verification phrases, as TinyZero reported them appearing: counted, not claimed.
VERIFY_PHRASES: dict[str, re.Pattern[str]] = {
    "wait": re.compile(r"\bwait\b", re.I),
    "let me check": re.compile(r"\blet me (?:check|double[- ]check|re-?check)\b", re.I),
    "let me verify": re.compile(r"\blet me (?:verify|confirm)\b", re.I),
    "verify": re.compile(r"\bverif(?:y|ies|ied|ication)\b", re.I),
    "double-check": re.compile(r"\bdouble[- ]check", re.I),
    "recheck": re.compile(r"\bre-?check", re.I),
    "actually": re.compile(r"\bactually\b", re.I),
    "hmm": re.compile(r"\bhmm+\b", re.I),
}

_TAG = re.compile(r"</?[A-Za-z_]+>")
_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*")
_MATH = re.compile(r"[-+*/=×÷^%().\d\s,]+")
_VOWEL = re.compile(r"[aeiouyAEIOUY]")
_STRIP = "()[]{}<>.,;:!?\"'`*"


def repetition_rate(tokens: Sequence[int], n: int = REPETITION_N) -> float:
    """Share of n-grams that repeat an earlier one; fewer than 2n tokens count as 0 (too short to tell)."""
    if len(tokens) < 2 * n:
        return 0.0
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def is_repetitive(
    tokens: Sequence[int], n: int = REPETITION_N, threshold: float = REPETITION_THRESHOLD
) -> bool:
    """More than `threshold` of the n-grams are repeats: e.g. a 4-token loop repeated 3 times or more."""
    return repetition_rate(tokens, n) > threshold


def is_gibberish(text: str) -> bool:
    """Fewer than half of the non-space characters belong to plain tokens: words (letters, with a vowel
    unless short, not randomly mixed case), numbers or arithmetic. Answer tags are ignored."""
    plain = total = 0
    for raw in _TAG.sub(" ", text).split():
        tok = raw.strip(_STRIP)
        total += len(raw)
        if not tok:
            plain += len(raw)  # pure punctuation: a bracket, a full stop
        elif _MATH.fullmatch(tok) or (
            _WORD.fullmatch(tok)
            and len(tok) <= 24
            and (len(tok) <= 3 or _VOWEL.search(tok))
            and (tok.islower() or tok.isupper() or tok[1:].islower())
        ):
            plain += len(raw)
    return total > 0 and plain / total < PLAIN_MIN


def text_repetition(text: str) -> float:
    """repetition_rate over words when there are enough, else over characters with 2n-grams ('2222...')."""
    words = text.split()
    if len(words) >= 2 * REPETITION_N:
        units, n = words, REPETITION_N
    else:
        units, n = list(text), 2 * REPETITION_N
    ids: dict[str, int] = {}
    return repetition_rate([ids.setdefault(u, len(ids)) for u in units], n)


def verify_phrases(text: str) -> list[str]:
    return [name for name, pattern in VERIFY_PHRASES.items() if pattern.search(text)]


def _text(r: dict[str, Any]) -> str:
    return str(r.get("text", ""))


def _format_only(r: dict[str, Any]) -> bool:
    info = r.get("info") if isinstance(r.get("info"), dict) else {}
    return bool(info.get("formatted")) and not r.get("correct")


def _reason(r: dict[str, Any]) -> str:
    info = r.get("info") if isinstance(r.get("info"), dict) else {}
    return str(info.get("reason", "unknown"))


# The statistics of the traces table, each a mean over rollouts: name -> value of one rollout `r` with text `t`
STATS: dict[str, Callable[[dict[str, Any], str], float]] = {
    "reward": lambda r, t: num(r.get("reward")),
    "correct": lambda r, t: bool(r.get("correct")),
    "tokens": lambda r, t: num(r.get("completion_tokens"), len(t)),
    "truncated": lambda r, t: is_truncated(str(r.get("finish_reason"))),
    "repetitive": lambda r, t: text_repetition(t) > REPETITION_THRESHOLD,
    "gibberish": lambda r, t: is_gibberish(t),
    "format_only": lambda r, t: _format_only(r),
    "verify": lambda r, t: bool(verify_phrases(t)),
}


def _step_rows(rollouts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rollouts:
        by_step.setdefault(step_of(r, -1), []).append(r)
    rows = []
    for step in sorted(by_step):
        rs = by_step[step]
        texts = [_text(r) for r in rs]
        means = {k: sum(stat(r, t) for r, t in zip(rs, texts)) / len(rs) for k, stat in STATS.items()}
        rows.append({"step": step, "n": len(rs), **means})
    return rows


def analyze_traces(rollouts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-step statistics of the stored rollouts, first vs last quarter of the logged steps, the reasons
    the scorer gave, self-verification phrase counts and representative early and late samples."""
    if not rollouts:
        return {"rollouts": 0}
    rows = _step_rows(rollouts)
    q = max(1, len(rows) // 4)
    early_rows, late_rows = rows[:q], rows[-q:]
    phrase_counts: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for r in sorted(rollouts, key=lambda r: num(r.get("step"))):
        for name in verify_phrases(_text(r)):
            phrase_counts[name] += 1
            first_seen.setdefault(name, step_of(r, 0))
    early, late = _of_steps(rollouts, early_rows), _of_steps(rollouts, late_rows)
    return {
        "rollouts": len(rollouts),
        "steps_logged": len(rows),
        "first_step": rows[0]["step"],
        "last_step": rows[-1]["step"],
        "by_step": thin_evenly(rows, 200),
        "early": _pooled(early_rows),
        "late": _pooled(late_rows),
        "reasons_early": dict(Counter(_reason(r) for r in early).most_common()),
        "reasons_late": dict(Counter(_reason(r) for r in late).most_common()),
        "verify_phrases": {
            "rollouts_with_phrase": sum(bool(verify_phrases(_text(r))) for r in rollouts),
            "counts": dict(phrase_counts.most_common()),
            "first_step": first_seen,
        },
        "samples_early": [_sample(r) for r in _representative(early)],
        "samples_late": [_sample(r) for r in _representative(late)],
    }


def _pooled(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rows' first and last step and each statistic over all their rollouts."""
    n = sum(r["n"] for r in rows)
    pooled = {k: sum(r[k] * r["n"] for r in rows) / n for k in STATS}
    return {"steps": [rows[0]["step"], rows[-1]["step"]], **pooled}


def _of_steps(rollouts: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    steps = {r["step"] for r in rows}
    return [r for r in rollouts if step_of(r, -1) in steps]


def thin_evenly(rows: list[T], n: int) -> list[T]:
    """At most n rows, evenly spaced, always keeping the first and the last."""
    if len(rows) <= n:
        return rows
    idx = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in idx]


def _representative(rs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best-rewarded and a median-rewarded rollout (distinct when possible)."""
    if len(rs) < 2:
        return list(rs)
    ranked = sorted(rs, key=lambda r: (-num(r.get("reward")), num(r.get("step"))))
    return [ranked[0], ranked[len(ranked) // 2]]


def _sample(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": step_of(r, -1),
        "reward": num(r.get("reward")),
        "correct": bool(r.get("correct")),
        "reason": _reason(r),
        "finish_reason": str(r.get("finish_reason", "")),
        "text": _text(r),
    }


def quote(r: dict[str, Any], width: int = 160) -> str:
    """One rollout as a short quoted line: step, reward, outcome, text (newlines shown as ⏎)."""
    text = _text(r).replace("\n", "⏎")
    text = text if len(text) <= width else text[: width - 1] + "…"
    finish = " truncated" if is_truncated(str(r.get("finish_reason"))) else ""
    reason = r["reason"] if isinstance(r.get("reason"), str) else _reason(r)
    return f'step {step_of(r, -1)}, reward {num(r.get("reward")):.2f} ({reason}{finish}): "{text}"'


def trace_findings(traces: dict[str, Any], rollouts: Sequence[dict[str, Any]]) -> list[Finding]:
    """Findings only the stored texts can give: gibberish, and format-only answers rising."""
    if not traces.get("rollouts") or traces.get("steps_logged", 0) < 2:
        return []
    out: list[Finding] = []
    early, late = traces["early"], traces["late"]
    steps = (late["steps"][0], late["steps"][1])
    recent = [r for r in rollouts if step_of(r, -1) >= steps[0]]
    if late["gibberish"] >= GIBBERISH_FRAC:
        picks = [r for r in recent if is_gibberish(_text(r))]
        out.append(
            Finding(
                name="gibberish",
                severity="warning",
                steps=steps,
                evidence={
                    "gibberish_frac": round(late["gibberish"], 4),
                    "start_gibberish_frac": round(early["gibberish"], 4),
                },
                message=(
                    f"{late['gibberish']:.0%} of the completions logged in steps {steps[0]}-{steps[1]} are not words, "
                    f"numbers or arithmetic ({early['gibberish']:.0%} in the first logged steps)."
                ),
                suggestion=(
                    "A random-init or mismatched model writes noise: check model.path, the tokenizer and task.template; "
                    "if it began mid-run, lower algo.lr and see entropy_explosion."
                ),
                samples=tuple(quote(r) for r in picks[-2:]),
                ongoing=True,
            )
        )
    rise = late["format_only"] - early["format_only"]
    if rise >= FORMAT_ONLY_RISE:
        no_gain = late["correct"] <= early["correct"] + 0.05
        picks = [r for r in recent if _format_only(r)]
        out.append(
            Finding(
                name="format_only",
                severity="warning" if no_gain else "info",
                steps=(early["steps"][0], steps[1]),
                evidence={
                    "format_only_frac": round(late["format_only"], 4),
                    "start_format_only_frac": round(early["format_only"], 4),
                    "correct_frac": round(late["correct"], 4),
                    "start_correct_frac": round(early["correct"], 4),
                },
                message=(
                    f"Answers with the right tags but wrong content rose from {early['format_only']:.0%} to "
                    f"{late['format_only']:.0%} of logged completions"
                    + (
                        ", with no gain in correct ones."
                        if no_gain
                        else f"; correct ones rose to {late['correct']:.0%}."
                    )
                ),
                suggestion=(
                    "Normal early on (the format is learned first); if it persists, the format credit is being farmed: "
                    "lower the task's format reward and watch eval/accuracy (see reward_hacking)."
                ),
                samples=tuple(quote(r) for r in picks[-2:]),
                ongoing=True,
            )
        )
    return out


# Per rule, the stored rollouts that show what it found (the last two are quoted); others get no quotes.
SAMPLE_PICKS: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "repetition": lambda rs: [r for r in rs if text_repetition(_text(r)) > REPETITION_THRESHOLD],
    "truncation_surge": lambda rs: [r for r in rs if is_truncated(str(r.get("finish_reason")))],
    "length_collapse": lambda rs: sorted(rs, key=lambda r: -len(_text(r))),
    "length_explosion": lambda rs: sorted(rs, key=lambda r: len(_text(r))),
    "reward_hacking": lambda rs: sorted(
        (r for r in rs if not r.get("correct")), key=lambda r: num(r.get("reward"))
    ),
    **dict.fromkeys(
        ("entropy_collapse", "entropy_explosion", "no_signal", "exact_zero", "reward_collapse"), list
    ),
}


def attach_samples(f: Finding, rollouts: Sequence[dict[str, Any]]) -> Finding:
    """Quote up to two stored rollouts from the finding's steps that show what it describes."""
    pick = SAMPLE_PICKS.get(f.name)
    if f.samples or not rollouts or pick is None:
        return f
    lo, hi = f.steps
    inside = [r for r in rollouts if lo <= num(r.get("step"), -1) <= hi] or [
        r for r in rollouts if num(r.get("step"), -1) >= lo
    ]
    return replace(f, samples=tuple(quote(r) for r in pick(inside)[-2:])) if inside else f


def format_traces(t: dict[str, Any]) -> list[str]:
    if not t.get("rollouts"):
        return []
    lines = [
        "",
        f"traces: {t['rollouts']} rollouts logged over {t['steps_logged']} steps ({t['first_step']}-{t['last_step']})",
        "  step     n  reward correct  tokens  trunc  repet  gibber  fmt-only  verify",
    ]
    lines += [
        f"  {r['step']:>5} {r['n']:>4}  {r['reward']:6.3f}  {r['correct']:6.2f}  {r['tokens']:6.1f}  {r['truncated']:5.2f}"
        f"  {r['repetitive']:5.2f}  {r['gibberish']:6.2f}  {r['format_only']:8.2f}  {r['verify']:6.2f}"
        for r in thin_evenly(t["by_step"], 10)
    ]
    e, la = t["early"], t["late"]
    lines.append(
        f"  first quarter (steps {e['steps'][0]}-{e['steps'][1]}) vs last (steps {la['steps'][0]}-{la['steps'][1]}): "
        f"format-only {e['format_only']:.0%} -> {la['format_only']:.0%}, correct {e['correct']:.0%} -> {la['correct']:.0%}, "
        f"truncated {e['truncated']:.0%} -> {la['truncated']:.0%}"
    )
    lines.append(
        f"  scorer reasons early: {_reasons(t['reasons_early'])}; late: {_reasons(t['reasons_late'])}"
    )
    vp = t["verify_phrases"]
    if vp["counts"]:
        firsts = ", ".join(
            f'"{k}" x{v} (first at step {vp["first_step"][k]})' for k, v in vp["counts"].items()
        )
        lines.append(
            f"  self-verification phrases: {vp['rollouts_with_phrase']} of {t['rollouts']} completions; {firsts}"
        )
    else:
        lines.append(f"  self-verification phrases: none in {t['rollouts']} completions")
    return lines + [
        f"  {label} sample > {quote(s)}" for label in ("early", "late") for s in t[f"samples_{label}"]
    ]


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"
