"""keelrl doctor on synthetic run directories: exit codes, the --json shape, partial directories (a
metrics.jsonl alone), running and failed runs, trace analysis (the report built on it: test_report.py)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from keelrl.monitor.doctor import diagnose, load_run, run_doctor
from keelrl.monitor.run_dir import RunDir
from keelrl.monitor.traces import analyze_traces, is_gibberish, text_repetition

T0 = 1_700_000_000.0


def metrics_stream(n: int = 60, seed: int = 0, **late: Any) -> list[dict[str, Any]]:
    """A healthy stream (eval-only step 0, evals every 10 steps); keys in `late` (with '/' written '__')
    are set from step n // 2 + 1 on."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = [{"step": 0, "time": T0, "eval/accuracy": 0.2}]
    for s in range(1, n + 1):
        rec: dict[str, Any] = {
            "step": s,
            "time": T0 + 2.0 * s,
            "reward/mean": 0.3 + 0.2 * s / n + rng.uniform(-0.02, 0.02),
            "reward/std": 0.4,
            "accuracy": 0.25 + 0.2 * s / n + rng.uniform(-0.02, 0.02),
            "response_length/mean": 80 + rng.uniform(-4, 4),
            "response_length/truncated_frac": 0.05,
            "repetition/frac": 0.0,
            "groups/no_signal_frac": 0.3 + rng.uniform(-0.05, 0.05),
            "loss/total": rng.uniform(-0.1, 0.1),
            "entropy": 0.8 + rng.uniform(-0.02, 0.02),
            "kl/old": 0.003,
            "grad_norm": 0.5 + rng.uniform(-0.05, 0.05),
            "lr": 1e-6,
            "throughput/tokens_per_s": 900 + rng.uniform(-40, 40),
            "time/step_s": 2.0,
        }
        if s % 10 == 0:
            rec["eval/accuracy"] = 0.2 + 0.2 * s / n
        if s > n // 2:
            rec.update({k.replace("__", "/"): v for k, v in late.items()})
        out.append(rec)
    return out


def rollout(step: int, text: str, reward: float = 0.0, correct: bool = False, **info: Any) -> dict[str, Any]:
    return {
        "step": step,
        "problem": {"a": 12, "b": 3},
        "text": text,
        "reward": reward,
        "correct": correct,
        "info": {
            "formatted": info.pop("formatted", False),
            "reason": info.pop("reason", "no_answer"),
            **info,
        },
        "finish_reason": "eos",
        "completion_tokens": len(text),
    }


def make_run(
    path: Path,
    metrics: list[dict[str, Any]] | None = None,
    events: list[tuple[str, int]] = (),  # type: ignore[assignment]
    rollouts: list[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    rd = RunDir(path)
    for rec in metrics or []:
        rd.append_metrics(rec)
    for kind, step in events:
        rd.event(kind, step, reason="test")
    if rollouts:
        rd.append_rollouts(rollouts)
    if status is not None:
        rd.write_status(**status)
    if config is not None:
        rd.write_config(config)
    return path


def doctor_json(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = run_doctor(path, as_json=True)
    return code, json.loads(capsys.readouterr().out)


# -------------------------------------------------------------------------------------- exit codes


def test_metrics_only_healthy_run_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics_stream()))
    code = run_doctor(run, as_json=False)
    out = capsys.readouterr().out
    assert code == 0
    assert "healthy: no warnings or critical findings" in out
    assert "60 steps" in out and "exit status 0 (healthy)" in out
    code, data = doctor_json(run, capsys)
    assert code == 0 and data["verdict"] == "healthy" and data["exit_code"] == 0 and data["findings"] == []
    h = data["headline"]
    assert h["steps"] == 60 and h["evals"] == 7 and h["eval_accuracy_first"] == 0.2
    assert h["reward_end"] > h["reward_start"]
    assert any("trace analysis skipped" in n for n in data["notes"])


def test_a_bare_metrics_file_is_enough(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "exported.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in metrics_stream(entropy=0.05)))
    code, data = doctor_json(f, capsys)
    assert code == 2 and [x["name"] for x in data["findings"]] == ["entropy_collapse"]


def test_warning_run_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", metrics_stream(repetition__frac=0.3))
    code, data = doctor_json(run, capsys)
    assert code == 1 and data["verdict"] == "warning"
    assert [(f["name"], f["severity"]) for f in data["findings"]] == [("repetition", "warning")]


def test_critical_run_exits_2_and_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", metrics_stream(entropy=0.05, groups__no_signal_frac=0.85))
    code, data = doctor_json(run, capsys)
    assert code == 2 and data["verdict"] == "critical"
    assert set(data) == {"run_dir", "verdict", "exit_code", "headline", "findings", "traces", "notes"}
    names = [f["name"] for f in data["findings"]]
    assert names == ["entropy_collapse", "no_signal"]  # critical before warning
    for f in data["findings"]:
        assert set(f) == {
            "name",
            "severity",
            "steps",
            "evidence",
            "message",
            "suggestion",
            "action",
            "samples",
            "ongoing",
        }
        first, last = f["steps"]
        assert isinstance(first, int) and isinstance(last, int) and 1 <= first <= last <= 60
        assert all(isinstance(v, (int, float)) for v in f["evidence"].values())
        assert f["ongoing"] is True and f["message"] and f["suggestion"]
    assert data["findings"][0]["evidence"]["fraction_left"] < 0.1


def test_nonfinite_values_written_as_strings_are_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = metrics_stream(30)
    m[20]["loss/total"] = float("nan")  # RunDir writes it as the string "nan"
    m[21]["grad_norm"] = float("inf")
    run = make_run(tmp_path / "run", m)
    assert '"nan"' in (run / "metrics.jsonl").read_text()
    code, data = doctor_json(run, capsys)
    f = next(f for f in data["findings"] if f["name"] == "nonfinite")
    assert f["steps"] == [20, 21] and f["ongoing"] is False
    assert f["severity"] == "warning"  # an incident the run moved past
    assert code == 1


def test_torn_last_line_and_unreadable_status_are_tolerated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run", metrics_stream(20))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "reward/me')
    (run / "status.json").write_text("{not json")
    code, data = doctor_json(run, capsys)
    assert code == 0 and data["headline"]["steps"] == 20


def test_unreadable_run_dir_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_doctor(tmp_path / "nope", as_json=False) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_doctor(tmp_path / "empty", as_json=False) == 2
    assert "holds none of metrics.jsonl" in capsys.readouterr().err
    code, data = doctor_json(tmp_path / "empty", capsys)
    assert code == 2 and data["verdict"] == "error"


# ------------------------------------------------------------------------ running and failed runs


def test_running_run_that_went_silent_is_stalled(tmp_path: Path) -> None:
    m = metrics_stream(30)
    run = make_run(tmp_path / "run", m, status={"state": "running", "step": 30, "pid": os.getpid()})
    last = m[-1]["time"]
    for f in run.iterdir():
        if f.is_file():
            os.utime(f, (last, last))
    status = json.loads((run / "status.json").read_text())
    status["updated"] = last
    (run / "status.json").write_text(json.dumps(status))
    os.utime(run / "status.json", (last, last))
    d = diagnose(load_run(run), now=last + 900)
    f = next(f for f in d.findings if f.name == "stalled")
    assert f.severity == "critical" and f.ongoing and f.steps == (30, 30)
    assert f.evidence["silent_s"] == pytest.approx(900, abs=2) and f.evidence["pid_alive"] == 1.0
    assert d.exit_code == 2
    # the same silence is fine for a run that finished, and for a running run inside its normal gaps
    assert not [f for f in diagnose(load_run(run), now=last + 20).findings if f.name == "stalled"]
    RunDir(run).write_status(state="finished")
    assert not [f for f in diagnose(load_run(run), now=last + 900).findings if f.name == "stalled"]


def test_doctor_reads_a_run_in_progress(tmp_path: Path) -> None:
    """Files as a live run leaves them: no summary, status running, metrics growing between reads."""
    rd = RunDir(tmp_path / "run")
    rd.write_status(state="running", step=0)
    m = metrics_stream(40, entropy=0.05)
    for rec in m[:15]:
        rd.append_metrics(rec)
    first = diagnose(load_run(rd.path))
    assert first.verdict == "healthy" and first.headline["state"] == "running"
    for rec in m[15:]:
        rd.append_metrics(rec)
    second = diagnose(load_run(rd.path))
    assert [f.name for f in second.findings] == ["entropy_collapse"]


def test_failed_status_is_critical(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", metrics_stream(10), status={"state": "failed", "step": 10})
    d = diagnose(load_run(run))
    f = next(f for f in d.findings if f.name == "run_failed")
    assert f.severity == "critical" and d.exit_code == 2


def test_events_are_counted_in_the_headline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [
        ("checkpoint", 10),
        ("restart", 12),
        ("resume", 10),
        ("rollback", 25),
        ("skip", 31),
        ("skip", 32),
    ]
    run = make_run(tmp_path / "run", metrics_stream(40), events=events)
    _, data = doctor_json(run, capsys)
    h = data["headline"]
    assert (h["restarts"], h["resumes"], h["rollbacks"], h["skipped_steps"], h["checkpoints"]) == (
        1,
        1,
        1,
        2,
        1,
    )
    run_doctor(run, as_json=False)
    assert "1 restarts, 1 resumes, 1 rollbacks, 2 skipped steps" in capsys.readouterr().out


def test_guards_section_of_the_run_config_is_used(tmp_path: Path) -> None:
    m = metrics_stream(repetition__frac=0.3)
    run = make_run(tmp_path / "a", m, config={"guards": {"repetition": {"enabled": False}}})
    assert diagnose(load_run(run)).findings == []
    run = make_run(tmp_path / "b", m, config={"guards": {"repetition": {"bogus": 1}}})
    d = diagnose(load_run(run))
    assert [f.name for f in d.findings] == ["repetition"]
    assert any("[guards] not understood" in n for n in d.notes)


# ----------------------------------------------------------------------------------- trace analysis


def test_text_classifiers() -> None:
    assert not is_gibberish("Let me think. We need 24 from the numbers, so 6 * 4 = 24.")
    assert not is_gibberish("<answer> (1 + 2) / 3 </answer>")
    assert not is_gibberish("222222222222222222222222")
    assert is_gibberish("3Hpxhq6-g ;Em);EcjIIg")
    assert is_gibberish('Jk5B&=~[e"n\\/IHpR5jd65Vu')
    assert text_repetition("2" * 24) > 0.5
    assert text_repetition("the cat sat on the mat " * 6) > 0.5
    assert text_repetition("We need 24. Try 6 * 4 = 24, which uses both numbers once.") == 0.0


def test_trace_analysis_format_only_and_self_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rs = []
    for step in range(1, 9):
        for k in range(4):
            if step <= 4:
                rs.append(rollout(step, f"I think the answer is {k}", 0.0))
            elif step == 5 and k == 0:
                rs.append(
                    rollout(
                        step,
                        "12 + 3 = 14. Wait, let me check: 12 + 3 = 15 <answer>15</answer>",
                        1.0,
                        True,
                        formatted=True,
                        reason="correct",
                    )
                )
            else:
                rs.append(
                    rollout(step, "<answer> 12 - 3 </answer>", 0.1, formatted=True, reason="wrong_value")
                )
    t = analyze_traces(rs)
    assert t["rollouts"] == 32 and t["steps_logged"] == 8
    assert t["early"]["format_only"] == 0.0 and t["late"]["format_only"] == 1.0
    assert t["reasons_early"] == {"no_answer": 8} and t["reasons_late"] == {"wrong_value": 8}
    vp = t["verify_phrases"]
    assert vp["rollouts_with_phrase"] == 1 and vp["first_step"] == {"wait": 5, "let me check": 5}
    assert t["samples_late"][0]["reward"] == 0.1 and t["samples_early"]
    run = make_run(tmp_path / "run", metrics_stream(8), rollouts=rs)
    _, data = doctor_json(run, capsys)
    f = next(f for f in data["findings"] if f["name"] == "format_only")
    assert f["severity"] == "warning" and f["samples"] and "12 - 3" in f["samples"][0]
    run_doctor(run, as_json=False)
    out = capsys.readouterr().out
    assert 'self-verification phrases: 1 of 32 completions; "wait" x1 (first at step 5)' in out


def test_gibberish_traces_and_quoted_samples_on_metric_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(0)
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789;:&%$#@!~[]{}|"
    rs = [rollout(s, "".join(rng.choice(chars) for _ in range(24))) for s in range(1, 31) for _ in range(2)]
    rs += [rollout(s, "2" * 24, 1.0) for s in range(31, 61) for _ in range(2)]
    run = make_run(tmp_path / "run", metrics_stream(60, repetition__frac=0.9), rollouts=rs)
    code, data = doctor_json(run, capsys)
    rep = next(f for f in data["findings"] if f["name"] == "repetition")
    assert rep["samples"] and '"222222' in rep["samples"][0]
    assert data["traces"]["early"]["gibberish"] == 1.0 and data["traces"]["late"]["repetitive"] == 1.0
    noisy = make_run(tmp_path / "noisy", metrics_stream(30), rollouts=rs[:60])
    code, data = doctor_json(noisy, capsys)
    assert [f["name"] for f in data["findings"]] == ["gibberish"] and code == 1


def test_a_rule_raised_live_but_cut_from_the_history_by_a_rollback_is_still_reported(tmp_path: Path) -> None:
    """The guards raised reward_hacking at step 30, then rolled back to step 10: metrics.jsonl no longer holds the
    evidence, events.jsonl does, and the doctor reports it from there (a real run's case, docs/RESULTS.md)."""
    run = make_run(tmp_path / "run", metrics_stream(12))
    event = {
        "time": T0, "step": 30, "kind": "guard", "rule": "reward_hacking", "severity": "critical", "action": "warn",
        "first_step": 15, "evidence": {"eval_accuracy_best": 0.395, "eval_accuracy": 0.14},
        "message": "The learned reward (reward/model) rose", "suggestion": "Read the rollouts",
    }  # fmt: skip
    with (run / "events.jsonl").open("a") as f:
        f.write(json.dumps(event) + "\n")
    found = {f.name: f for f in diagnose(load_run(run)).findings}
    f = found["reward_hacking"]
    assert (f.severity, f.steps, f.evidence["eval_accuracy"]) == ("critical", (15, 30), 0.14)
    assert "raised live at step 30" in f.message and f.suggestion == "Read the rollouts"
    # a rule the history still shows (non-finite values at step 8) is reported once, from the history
    m = metrics_stream(12)
    m[8]["loss/total"] = float("nan")
    shown = make_run(tmp_path / "shown", m)
    with (shown / "events.jsonl").open("a") as f2:
        f2.write(json.dumps({**event, "rule": "nonfinite", "message": "from the event"}) + "\n")
    nonfinite = [x for x in diagnose(load_run(shown)).findings if x.name == "nonfinite"]
    assert len(nonfinite) == 1 and "raised live" not in nonfinite[0].message
