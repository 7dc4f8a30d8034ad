"""`keelrl doctor RUN_DIR`: the first pass over a run that a person would otherwise do by reading curves.

It reads what the run directory holds (any file may be missing; a metrics.jsonl alone is enough for the
metric rules), replays the guards' rules over the whole history (`keelrl.guards.scan`: the same code the
trainer runs live), adds what only hindsight and the stored traces can tell (a stalled or failed run,
gibberish, format-only answers, self-verification phrases), and prints the findings most severe first
with their step ranges, evidence, quoted rollouts and suggestions, or "healthy" with the headline numbers.

Exit status: 0 healthy (info notes at most), 1 warnings, 2 critical findings or an unreadable run dir.
Works on a run that is still going: every file is read as it is now (a torn last line is skipped).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from keelrl.guards import (
    SEVERITY_RANK,
    Finding,
    GuardsConfig,
    is_train_record,
    metric_value,
    scan,
    stalled,
)
from keelrl.monitor.run_dir import RunDir, read_jsonl
from keelrl.monitor.traces import REPETITION_N, REPETITION_THRESHOLD, repetition_rate

EXIT_CODES = {"healthy": 0, "warning": 1, "critical": 2}

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


class DoctorError(RuntimeError):
    """The run directory cannot be diagnosed (missing, or holding none of the run files)."""


# ----------------------------------------------------------------------------------------- loading


@dataclass
class RunData:
    """Everything the doctor reads from one run directory, as it is now."""

    path: Path
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]
    config: dict[str, Any]
    status: dict[str, Any]
    summary: dict[str, Any]
    last_write: float
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def load_run(path: str | Path) -> RunData:
    """Read a run directory (or a bare metrics.jsonl file). Raises DoctorError when there is nothing to read."""
    p = Path(path)
    if p.is_file() and p.name.endswith(".jsonl"):
        metrics = list(read_jsonl(p))
        return RunData(p.parent, _in_step_order(metrics), [], [], {}, {}, {}, p.stat().st_mtime)
    if not p.is_dir():
        raise DoctorError(
            f"{p} is not a run directory (it does not exist). Pass the --run-dir of a keelrl train run."
        )
    rd = RunDir(p, writer=False)
    files = [
        rd.metrics_file,
        rd.events_file,
        rd.rollouts_file,
        rd.status_file,
        rd.config_file,
        rd.summary_file,
    ]
    if not any(f.exists() for f in files):
        raise DoctorError(
            f"{p} holds none of metrics.jsonl, events.jsonl, rollouts.jsonl.gz, status.json, config.json: "
            "is it the run directory of a keelrl train run?"
        )
    status = _read_json(rd.status_file)
    stamps = [os.path.getmtime(f) for f in files if f.exists()]
    stamps += [
        float(status[k]) for k in ("updated", "last_heartbeat") if isinstance(status.get(k), (int, float))
    ]
    return RunData(
        path=p,
        metrics=_in_step_order(rd.metrics()),
        events=rd.events(),
        rollouts=list(read_jsonl(rd.rollouts_file)),
        config=_read_json(rd.config_file),
        status=status,
        summary=_read_json(rd.summary_file),
        last_write=max(stamps, default=0.0),
    )


def _in_step_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records sorted by step (stable); records without a step keep their place at the end."""
    with_step = [r for r in records if isinstance(r.get("step"), (int, float))]
    without = [r for r in records if not isinstance(r.get("step"), (int, float))]
    return sorted(with_step, key=lambda r: r["step"]) + without


def guards_config(run: RunData) -> GuardsConfig:
    """The run's [guards] thresholds when its config.json has them, else the defaults."""
    section = run.config.get("guards")
    if not isinstance(section, dict):
        return GuardsConfig()
    try:
        return GuardsConfig.model_validate(section)
    except ValidationError as err:
        run.notes.append(
            f"config.json [guards] not understood ({err.error_count()} errors); default thresholds used"
        )
        return GuardsConfig()


# ------------------------------------------------------------------------------------ trace analysis


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
    """repetition_rate over words (a word is a unit when the text has enough of them), else over
    characters with 2n-grams, so that character-level loops such as '2222...' also count."""
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


def _num(x: Any, default: float = 0.0) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else default


def _step_rows(rollouts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rollouts:
        by_step.setdefault(int(_num(r.get("step"), -1)), []).append(r)
    rows = []
    for step in sorted(by_step):
        rs = by_step[step]
        n = len(rs)
        texts = [str(r.get("text", "")) for r in rs]
        rows.append(
            {
                "step": step,
                "n": n,
                "reward": sum(_num(r.get("reward")) for r in rs) / n,
                "correct": sum(bool(r.get("correct")) for r in rs) / n,
                "tokens": sum(_num(r.get("completion_tokens"), len(t)) for r, t in zip(rs, texts)) / n,
                "truncated": sum(r.get("finish_reason") == "length" for r in rs) / n,
                "repetitive": sum(text_repetition(t) > REPETITION_THRESHOLD for t in texts) / n,
                "gibberish": sum(is_gibberish(t) for t in texts) / n,
                "format_only": sum(_format_only(r) for r in rs) / n,
                "verify": sum(bool(verify_phrases(t)) for t in texts) / n,
            }
        )
    return rows


def _pool(rows: Sequence[dict[str, Any]], key: str) -> float:
    n = sum(r["n"] for r in rows)
    return sum(r[key] * r["n"] for r in rows) / n if n else 0.0


def analyze_traces(rollouts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-step statistics of the stored rollouts, first vs last quarter of the logged steps, the reasons
    the scorer gave, self-verification phrase counts and representative early and late samples."""
    if not rollouts:
        return {"rollouts": 0}
    rows = _step_rows(rollouts)
    q = max(1, len(rows) // 4)
    early_rows, late_rows = rows[:q], rows[-q:]
    early_steps = {r["step"] for r in early_rows}
    late_steps = {r["step"] for r in late_rows}
    keys = ("reward", "correct", "tokens", "truncated", "repetitive", "gibberish", "format_only", "verify")
    phrase_counts: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for r in sorted(rollouts, key=lambda r: _num(r.get("step"))):
        for name in verify_phrases(str(r.get("text", ""))):
            phrase_counts[name] += 1
            first_seen.setdefault(name, int(_num(r.get("step"))))
    early = [r for r in rollouts if int(_num(r.get("step"), -1)) in early_steps]
    late = [r for r in rollouts if int(_num(r.get("step"), -1)) in late_steps]
    return {
        "rollouts": len(rollouts),
        "steps_logged": len(rows),
        "first_step": rows[0]["step"],
        "last_step": rows[-1]["step"],
        "by_step": _thin(rows, 200),
        "early": {
            "steps": [early_rows[0]["step"], early_rows[-1]["step"]],
            **{k: _pool(early_rows, k) for k in keys},
        },
        "late": {
            "steps": [late_rows[0]["step"], late_rows[-1]["step"]],
            **{k: _pool(late_rows, k) for k in keys},
        },
        "reasons_early": dict(Counter(_reason(r) for r in early).most_common()),
        "reasons_late": dict(Counter(_reason(r) for r in late).most_common()),
        "verify_phrases": {
            "rollouts_with_phrase": sum(bool(verify_phrases(str(r.get("text", "")))) for r in rollouts),
            "counts": dict(phrase_counts.most_common()),
            "first_step": first_seen,
        },
        "samples_early": [_sample(r) for r in _representative(early)],
        "samples_late": [_sample(r) for r in _representative(late)],
    }


def _thin(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """At most n rows, evenly spaced, always keeping the first and the last."""
    if len(rows) <= n:
        return rows
    idx = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in idx]


def _representative(rs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best-rewarded and a median-rewarded rollout (distinct when possible)."""
    if not rs:
        return []
    ranked = sorted(rs, key=lambda r: (-_num(r.get("reward")), _num(r.get("step"))))
    picks = [ranked[0]]
    if len(ranked) > 1:
        picks.append(ranked[len(ranked) // 2])
    return picks


def _sample(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": int(_num(r.get("step"), -1)),
        "reward": _num(r.get("reward")),
        "correct": bool(r.get("correct")),
        "reason": _reason(r),
        "finish_reason": str(r.get("finish_reason", "")),
        "text": str(r.get("text", "")),
    }


def quote(r: dict[str, Any], width: int = 160) -> str:
    """One rollout as a short quoted line: step, reward, outcome, text (newlines shown as ⏎)."""
    text = str(r.get("text", "")).replace("\n", "⏎")
    if len(text) > width:
        text = text[: width - 1] + "…"
    finish = " truncated" if r.get("finish_reason") == "length" else ""
    reason = r["reason"] if isinstance(r.get("reason"), str) else _reason(r)
    return f'step {int(_num(r.get("step"), -1))}, reward {_num(r.get("reward")):.2f} ({reason}{finish}): "{text}"'


def trace_findings(traces: dict[str, Any], rollouts: Sequence[dict[str, Any]]) -> list[Finding]:
    """Findings only the stored texts can give: gibberish, and format-only answers rising."""
    if not traces.get("rollouts") or traces.get("steps_logged", 0) < 2:
        return []
    out: list[Finding] = []
    early, late = traces["early"], traces["late"]
    steps = (traces["late"]["steps"][0], traces["late"]["steps"][1])
    if late["gibberish"] >= GIBBERISH_FRAC:
        picks = [
            r
            for r in rollouts
            if int(_num(r.get("step"), -1)) >= steps[0] and is_gibberish(str(r.get("text", "")))
        ]
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
        picks = [r for r in rollouts if int(_num(r.get("step"), -1)) >= steps[0] and _format_only(r)]
        out.append(
            Finding(
                name="format_only",
                severity="warning" if no_gain else "info",
                steps=(traces["early"]["steps"][0], steps[1]),
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


def _attach_samples(f: Finding, rollouts: Sequence[dict[str, Any]]) -> Finding:
    """Quote up to two stored rollouts from the finding's steps that show what it describes."""
    if f.samples or not rollouts:
        return f
    lo, hi = f.steps
    inside = [r for r in rollouts if lo <= _num(r.get("step"), -1) <= hi] or [
        r for r in rollouts if _num(r.get("step"), -1) >= lo
    ]
    if not inside:
        return f
    text = _text
    picks: list[dict[str, Any]]
    if f.name == "repetition":
        picks = [r for r in inside if text_repetition(text(r)) > REPETITION_THRESHOLD]
    elif f.name == "truncation_surge":
        picks = [r for r in inside if r.get("finish_reason") == "length"]
    elif f.name == "length_collapse":
        picks = sorted(inside, key=lambda r: -len(text(r)))
    elif f.name == "length_explosion":
        picks = sorted(inside, key=lambda r: len(text(r)))
    elif f.name == "reward_hacking":
        picks = sorted((r for r in inside if not r.get("correct")), key=lambda r: _num(r.get("reward")))
    elif f.name in ("entropy_collapse", "entropy_explosion", "no_signal", "exact_zero", "reward_collapse"):
        picks = list(inside)
    else:
        return f
    return replace(f, samples=tuple(quote(r) for r in picks[-2:]))


# --------------------------------------------------------------------------------------- diagnosis


@dataclass
class Diagnosis:
    run_dir: str
    verdict: str
    findings: list[Finding]
    headline: dict[str, Any]
    traces: dict[str, Any]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "headline": self.headline,
            "findings": [f.to_json() for f in self.findings],
            "traces": self.traces,
            "notes": self.notes,
        }


def _avg(history: Sequence[dict[str, Any]], key: str, first: bool, n: int = 5) -> float | None:
    vals = [v for r in history if (v := metric_value(r, key)) is not None and math.isfinite(v)]
    if not vals:
        return None
    part = vals[:n] if first else vals[-n:]
    return sum(part) / len(part)


def headline(run: RunData) -> dict[str, Any]:
    """The numbers a person looks at first: steps, reward and accuracy start -> end (means of the first and
    last 5 training steps), eval accuracy, throughput, and what the events say happened."""
    train = [r for r in run.metrics if is_train_record(r)]
    evals = [
        (int(r["step"]), v)
        for r in run.metrics
        if (v := metric_value(r, "eval/accuracy")) is not None and "step" in r
    ]
    kinds = Counter(str(e.get("kind", "")) for e in run.events)
    skipped = max((metric_value(r, "guard/skipped_steps") or 0.0 for r in run.metrics), default=0.0)
    times = [t for r in run.metrics if (t := metric_value(r, "time")) is not None]
    tps = [
        v for r in train if (v := metric_value(r, "throughput/tokens_per_s")) is not None and math.isfinite(v)
    ]
    out: dict[str, Any] = {
        "state": run.status.get("state")
        or run.summary.get("state")
        or ("unknown" if run.metrics else "no metrics yet"),
        "steps": int(train[-1]["step"]) if train and "step" in train[-1] else 0,
        "reward_start": _avg(train, "reward/mean", True),
        "reward_end": _avg(train, "reward/mean", False),
        "accuracy_start": _avg(train, "accuracy", True),
        "accuracy_end": _avg(train, "accuracy", False),
        "eval_accuracy_first": evals[0][1] if evals else None,
        "eval_accuracy_last": evals[-1][1] if evals else None,
        "eval_accuracy_best": max(v for _, v in evals) if evals else None,
        "eval_best_step": max(evals, key=lambda e: (e[1], -e[0]))[0] if evals else None,
        "evals": len(evals),
        "tokens_per_s": statistics.median(tps) if tps else None,
        "wall_s": (max(times) - min(times)) if len(times) > 1 else None,
        "restarts": kinds.get("restart", 0),
        "resumes": kinds.get("resume", 0),
        "rollbacks": kinds.get("rollback", 0),
        "skipped_steps": max(kinds.get("skip", 0), int(skipped)),
        "faults": kinds.get("fault", 0),
        "guard_events": kinds.get("guard", 0),
        "checkpoints": kinds.get("checkpoint", 0),
        "checkpoint_failures": kinds.get("checkpoint_failed", 0),
    }
    return out


def _status_findings(run: RunData, cfg: GuardsConfig, now: float) -> list[Finding]:
    out: list[Finding] = []
    state = run.status.get("state")
    if cfg.stalled.enabled:
        f = stalled(
            run.metrics, cfg.stalled, now=now, last_write=run.last_write, state=state if state else None
        )
        if f is not None and run.status:
            pid = run.status.get("pid")
            if isinstance(pid, int) and pid > 0:
                alive = _pid_alive(pid)
                if alive is not None:
                    f = replace(f, evidence={**f.evidence, "pid": float(pid), "pid_alive": float(alive)})
        if f is not None:
            out.append(replace(f, ongoing=True))
    if state == "failed":
        step = int(_num(run.status.get("step"), 0))
        out.append(
            Finding(
                name="run_failed",
                severity="critical",
                steps=(step, step),
                evidence={"step": float(step)},
                message=f"The run's status is 'failed' at step {step}: the trainer raised an exception and was not restarted.",
                suggestion="Read the end of the console log and events.jsonl; fix the cause, then resume with keelrl train ... --resume auto.",
                ongoing=True,
            )
        )
    return out


def _pid_alive(pid: int) -> bool | None:
    """Whether a process with this id exists on this machine (signal 0 sends nothing). None if unknown."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def diagnose(run: RunData, cfg: GuardsConfig | None = None, now: float | None = None) -> Diagnosis:
    """All findings for a loaded run, most severe first, with headline numbers and the trace analysis."""
    cfg = cfg or guards_config(run)
    now = time.time() if now is None else now
    findings = scan(run.metrics, cfg)
    traces = analyze_traces(run.rollouts)
    findings += trace_findings(traces, run.rollouts)
    findings += _status_findings(run, cfg, now)
    findings = [_attach_samples(f, run.rollouts) for f in findings]
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], not f.ongoing, f.steps[0], f.name))
    worst = max((SEVERITY_RANK[f.severity] for f in findings), default=0)
    verdict = {2: "critical", 1: "warning", 0: "healthy"}[worst]
    notes = list(run.notes)
    if not run.metrics:
        notes.append("no metrics.jsonl records yet: metric rules not run")
    if not run.rollouts:
        notes.append("no rollouts.jsonl.gz records: trace analysis skipped")
    return Diagnosis(str(run.path), verdict, findings, headline(run), traces, notes)


# ------------------------------------------------------------------------------------------ output


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def _fmt_evidence(ev: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in ev.items())


def format_text(d: Diagnosis) -> str:
    """The human-readable report printed by `keelrl doctor`."""
    h = d.headline
    lines = [f"keelrl doctor: {d.run_dir}  ({h['steps']} steps, state {h['state']})"]
    head = [
        f"reward {_fmt(h['reward_start'])} -> {_fmt(h['reward_end'])}",
        f"accuracy {_fmt(h['accuracy_start'])} -> {_fmt(h['accuracy_end'])}",
    ]
    if h["evals"]:
        head.append(
            f"eval accuracy {_fmt(h['eval_accuracy_first'])} -> {_fmt(h['eval_accuracy_last'])} "
            f"(best {_fmt(h['eval_accuracy_best'])} at step {h['eval_best_step']}, {h['evals']} evals)"
        )
    lines.append("  " + " | ".join(head))
    ev = [
        f"{h[k]} {label}"
        for k, label in (
            ("restarts", "restarts"),
            ("resumes", "resumes"),
            ("rollbacks", "rollbacks"),
            ("skipped_steps", "skipped steps"),
            ("faults", "faults"),
            ("checkpoints", "checkpoints"),
            ("checkpoint_failures", "failed checkpoints"),
        )
    ]
    extra = []
    if h["tokens_per_s"] is not None:
        extra.append(f"{h['tokens_per_s']:.4g} tokens/s (median)")
    if h["wall_s"] is not None:
        extra.append(f"{h['wall_s']:.0f} s logged")
    lines.append("  " + ", ".join(ev) + ("; " + ", ".join(extra) if extra else ""))
    lines.append("")
    counts = Counter(f.severity for f in d.findings)
    if d.verdict == "healthy":
        lines.append(
            "healthy: no warnings or critical findings"
            + (f" ({counts['info']} notes below)" if counts["info"] else "")
        )
    else:
        lines.append(
            f"{d.verdict.upper()}: {counts['critical']} critical, {counts['warning']} warning, {counts['info']} info"
        )
    for f in d.findings:
        lines.append("")
        span = f"step {f.steps[0]}" if f.steps[0] == f.steps[1] else f"steps {f.steps[0]}-{f.steps[1]}"
        state = ", ongoing" if f.ongoing else ""
        act = f", live action: {f.action}" if f.action != "warn" else ""
        lines.append(f"[{f.severity.upper()}] {f.name}  {span}{state}{act}")
        lines.append(f"  {f.message}")
        lines.append(f"  evidence: {_fmt_evidence(f.evidence)}")
        lines.append(f"  suggestion: {f.suggestion}")
        for s in f.samples:
            lines.append(f"  > {s}")
    lines.extend(_format_traces(d.traces))
    for note in d.notes:
        lines.append(f"note: {note}")
    lines.append("")
    lines.append(f"exit status {d.exit_code} ({d.verdict})")
    return "\n".join(lines)


def _format_traces(t: dict[str, Any]) -> list[str]:
    if not t.get("rollouts"):
        return []
    lines = [
        "",
        f"traces: {t['rollouts']} rollouts logged over {t['steps_logged']} steps ({t['first_step']}-{t['last_step']})",
    ]
    lines.append("  step     n  reward correct  tokens  trunc  repet  gibber  fmt-only  verify")
    for r in _thin(t["by_step"], 10):
        lines.append(
            f"  {r['step']:>5} {r['n']:>4}  {r['reward']:6.3f}  {r['correct']:6.2f}  {r['tokens']:6.1f}  {r['truncated']:5.2f}"
            f"  {r['repetitive']:5.2f}  {r['gibberish']:6.2f}  {r['format_only']:8.2f}  {r['verify']:6.2f}"
        )
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
    for label, key in (("early", "samples_early"), ("late", "samples_late")):
        for s in t[key]:
            lines.append(f"  {label} sample > {quote(s)}")
    return lines


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def run_doctor(run_dir: str | Path, as_json: bool = False) -> int:
    """CLI entry: diagnose `run_dir`, print text (or JSON with --json), return the exit status
    (0 healthy, 1 warnings, 2 critical findings or an unreadable run dir)."""
    try:
        run = load_run(run_dir)
    except DoctorError as err:
        if as_json:
            print(
                json.dumps({"run_dir": str(run_dir), "verdict": "error", "exit_code": 2, "error": str(err)})
            )
        else:
            print(f"keelrl doctor: error: {err}", file=sys.stderr)
        return 2
    d = diagnose(run)
    print(json.dumps(d.to_json(), indent=2, default=str) if as_json else format_text(d))
    return d.exit_code
