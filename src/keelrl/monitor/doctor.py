"""`keelrl doctor RUN_DIR`: the first pass over a run that a person would otherwise do by reading curves.

It reads what the run directory holds (metrics.jsonl alone is enough for the metric rules; a torn last line
of a running run is skipped), replays the guards' rules over the whole history (`guards.engine.scan`), adds
what only hindsight and the traces tell (a stalled or failed run, gibberish, format-only answers,
self-verification phrases), and prints the findings most severe first with step ranges, evidence, quoted
rollouts and suggestions, or "healthy" with the headline numbers.
Exit status: 0 healthy (info notes at most), 1 warnings, 2 critical findings or an unreadable run dir.
Works on a run that is still going: every file is read as it is now (a torn last line is skipped).
A status.json that says "running" is only as true as its writer is alive: a SIGKILLed supervisor cannot
update it, so the shown state adds "stale" when nothing in the run directory (heartbeat included) was
written for longer than supervisor.hang_timeout_s, or at once when the process it names is gone.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from keelrl.config import SupervisorConfig
from keelrl.guards.base import SEVERITY_RANK, Finding, is_train_record, metric_value, num, step_of
from keelrl.guards.engine import scan
from keelrl.guards.rules import GuardsConfig
from keelrl.guards.rules.process import RUNNING_STATES, stalled
from keelrl.monitor.run_dir import HEARTBEAT_FILE, RunDir, read_json, read_jsonl
from keelrl.monitor.run_lock import describe as describe_lock
from keelrl.monitor.run_lock import pid_alive
from keelrl.monitor.traces import analyze_traces, attach_samples, format_traces, trace_findings

EXIT_CODES = {"healthy": 0, "warning": 1, "critical": 2}


class DoctorError(RuntimeError):
    """The run directory cannot be diagnosed (missing, or holding none of the run files)."""


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
    status = read_json(rd.status_file) or {}
    stamps = [os.path.getmtime(f) for f in (*files, p / HEARTBEAT_FILE) if f.exists()]
    stamps += [
        float(status[k]) for k in ("updated", "last_heartbeat") if isinstance(status.get(k), (int, float))
    ]
    return RunData(
        path=p,
        metrics=_in_step_order(rd.metrics()),
        events=rd.events(),
        rollouts=list(read_jsonl(rd.rollouts_file)),
        config=read_json(rd.config_file) or {},
        status=status,
        summary=read_json(rd.summary_file) or {},
        last_write=max(stamps, default=0.0),
        notes=[lock] if (lock := describe_lock(p)) else [],
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


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def shown_state(run: RunData, now: float) -> str:
    """The run's state as status.json (or summary.json) says, and for a "running" one whether that is stale:
    nothing written for over supervisor.hang_timeout_s, or the process it names (on this host) gone."""
    state = (
        run.status.get("state")
        or run.summary.get("state")
        or ("unknown" if run.metrics else "no metrics yet")
    )
    if state not in RUNNING_STATES:
        return state
    pid, silent = run.status.get("pid"), now - run.last_write
    here = run.status.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0
    alive = pid_alive(pid) if here else None
    section = run.config.get("supervisor")
    given = section.get("hang_timeout_s") if isinstance(section, dict) else None
    bound = num(given, SupervisorConfig().hang_timeout_s)
    if alive is False:
        return f"{state} (stale: no heartbeat for {_duration(silent)}; the process is gone)"
    if silent > bound:
        why = f"process {pid} is still there: hung?" if alive else "its process is on another host or unknown"
        return f"{state} (stale: no heartbeat for {_duration(silent)}; {why})"
    return state


def headline(run: RunData, now: float | None = None) -> dict[str, Any]:
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
    return {
        "state": shown_state(run, time.time() if now is None else now),
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


def _status_findings(run: RunData, cfg: GuardsConfig, now: float) -> list[Finding]:
    out: list[Finding] = []
    state, pid = run.status.get("state"), run.status.get("pid")
    if cfg.stalled.enabled:
        f = stalled(run.metrics, cfg.stalled, now=now, last_write=run.last_write, state=state or None)
        alive = pid_alive(pid) if f is not None and isinstance(pid, int) and pid > 0 else None
        if alive is not None:
            f = replace(f, evidence={**f.evidence, "pid": float(pid), "pid_alive": float(alive)})
        if f is not None:
            out.append(replace(f, ongoing=True))
    if state == "failed":
        step = step_of(run.status, 0)
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


def live_only_findings(events: list[dict[str, Any]], found: set[str]) -> list[Finding]:
    """Rules the live guards raised (events.jsonl) that the history no longer shows: a rollback cuts the
    metric lines after its target, and with them the evidence (measured: a learned reward's reward_hacking,
    raised at step 30, was gone after the rollbacks that followed). The latest event of each such rule."""
    latest: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("kind") == "guard" and e.get("rule") and e["rule"] not in found:
            latest[str(e["rule"])] = e
    out = []
    for rule, e in latest.items():
        step = int(e.get("step", 0))
        evidence = {k: float(v) for k, v in (e.get("evidence") or {}).items() if isinstance(v, (int, float))}
        out.append(
            Finding(
                rule,
                e.get("severity", "warning"),
                (int(e.get("first_step", step)), step),
                evidence,
                f"{e.get('message', '')} (raised live at step {step}; a rollback since cut that span from "
                "metrics.jsonl, so only events.jsonl shows it)",
                str(e.get("suggestion", "")),
                e.get("action", "warn"),
            )
        )
    return out


def diagnose(run: RunData, cfg: GuardsConfig | None = None, now: float | None = None) -> Diagnosis:
    """All findings for a loaded run, most severe first, with headline numbers and the trace analysis."""
    cfg = cfg or guards_config(run)
    now = time.time() if now is None else now
    findings = scan(run.metrics, cfg)
    traces = analyze_traces(run.rollouts)
    findings += trace_findings(traces, run.rollouts)
    findings += _status_findings(run, cfg, now)
    findings += live_only_findings(run.events, {f.name for f in findings})
    findings = [attach_samples(f, run.rollouts) for f in findings]
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], not f.ongoing, f.steps[0], f.name))
    worst = max((SEVERITY_RANK[f.severity] for f in findings), default=0)
    verdict = {2: "critical", 1: "warning", 0: "healthy"}[worst]
    notes = list(run.notes)
    if not run.metrics:
        notes.append("no metrics.jsonl records yet: metric rules not run")
    if not run.rollouts:
        notes.append("no rollouts.jsonl.gz records: trace analysis skipped")
    return Diagnosis(str(run.path), verdict, findings, headline(run, now), traces, notes)


def _fmt(x: float | None) -> str:
    """A headline number (a float: nan and inf too) to 3 decimals; None as "-"."""
    return "-" if x is None else f"{x:.3f}"


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
    counted = ("restarts", "resumes", "rollbacks", "skipped_steps", "faults", "checkpoints")
    ev = [f"{h[k]} {k.replace('_', ' ')}" for k in counted]
    ev.append(f"{h['checkpoint_failures']} failed checkpoints")
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
        span = f"step {f.steps[0]}" if f.steps[0] == f.steps[1] else f"steps {f.steps[0]}-{f.steps[1]}"
        state = ", ongoing" if f.ongoing else ""
        act = f", live action: {f.action}" if f.action != "warn" else ""
        lines += ["", f"[{f.severity.upper()}] {f.name}  {span}{state}{act}", f"  {f.message}"]
        lines += [f"  evidence: {_fmt_evidence(f.evidence)}", f"  suggestion: {f.suggestion}"]
        lines += [f"  > {s}" for s in f.samples]
    lines += format_traces(d.traces)
    lines += [f"note: {note}" for note in d.notes]
    lines += ["", f"exit status {d.exit_code} ({d.verdict})"]
    return "\n".join(lines)


def run_doctor(run_dir: str | Path, as_json: bool = False) -> int:
    """CLI entry: diagnose `run_dir`, print text (or JSON), return the exit status (module docstring)."""
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
