"""`keelrl ladder` end to end: the runner's reuse of finished runs, its report of failed ones, the prediction
kept as written before the target ran (a stub point process, fast), and both real kinds through the CLI:
pretraining points (`keelrl.ladder.pretrain_run`) and RL points (`keelrl train`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from keelrl.cli.main import main
from keelrl.config import Config, ConfigError
from keelrl.ladder import kinds
from keelrl.ladder.kinds import LadderError, PretrainKind
from keelrl.ladder.plan import LadderRun
from keelrl.ladder.runner import run_ladder

# a point process that writes a pretraining summary from a made-up Chinchilla law, counts its launches, and
# fails once when run_dir/fail_once exists
STUB = """
import json, pathlib, sys
d = pathlib.Path(sys.argv[1]); h = int(sys.argv[2]); steps = int(sys.argv[3])
d.mkdir(parents=True, exist_ok=True)
with open(d / "launches.txt", "a") as f: f.write("x")
if (d / "fail_once").exists():
    (d / "fail_once").unlink(); sys.exit(1)
n, t = 1000 * h * h, 100 * steps
loss = 0.5 + 40.0 * n ** -0.4 + 300.0 * t ** -0.5
s = {"state": "finished", "parameters": n, "tokens": t, "steps": steps, "heldout_loss": loss,
     "train_loss": loss, "seconds": 0.1}
(d / "summary.json").write_text(json.dumps(s))
"""


class StubKind(PretrainKind):
    def argv(
        self, config: str | None, overrides: list[str], run: LadderRun, run_dir: Path, threads: int
    ) -> list[str]:
        p = dict(run.point)
        return [
            sys.executable,
            "-c",
            STUB,
            str(run_dir),
            str(p["model.tiny.hidden_size"]),
            str(p["ladder.pretrain_steps"]),
        ]

    def parameters(self, cfg: Config) -> int:
        return 1000 * cfg.model.tiny.hidden_size**2


def _launches(out: Path) -> dict[str, int]:
    return {d.name: len((d / "launches.txt").read_text()) for d in sorted((out / "runs").iterdir())}


def test_runner_reuses_finished_runs_reports_failures_and_keeps_its_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(kinds.KINDS, "pretrain", StubKind())
    out = tmp_path / "ladder"
    args: dict[str, Any] = {
        "config": None,
        "overrides": ['ladder.kind="pretrain"', "ladder.resamples=20"],
        "out": out,
        "axes": ["model.tiny.hidden_size=16,32,64", "ladder.pretrain_steps=100,200,400"],
        "seeds": 1,
        "target": ["model.tiny.hidden_size=128", "ladder.pretrain_steps=400"],
        "jobs": 2,
        "say": lambda _: None,
    }
    failing = out / "runs" / "hidden_size=32_pretrain_steps=200__seed0"
    failing.mkdir(parents=True)
    (failing / "fail_once").write_text("")
    with pytest.raises(LadderError, match=r"hidden_size=32_pretrain_steps=200__seed0 \(exit 1; log: "):
        run_ladder(**args)
    assert not (out / "ladder.json").exists()
    result = run_ladder(**args)  # again: only the failed point runs, then the prediction, then the target
    launches = _launches(out)
    assert launches.pop("hidden_size=32_pretrain_steps=200__seed0") == 2
    assert set(launches.values()) == {1} and len(launches) == 9  # the 8 other grid points + the target, once
    pred, val = result["prediction"], result["validation"]
    assert pred["parameters"] == 1000 * 128**2 and pred["tokens"] == 100 * 400
    assert val["inside_interval"] and pred["interval"][0] <= val["loss"] <= pred["interval"][1]
    assert val["loss"] == pytest.approx(0.5 + 40.0 * (1000 * 128**2) ** -0.4 + 300.0 * 40000**-0.5)
    assert result["chinchilla"]["fit"]["alpha"] == pytest.approx(0.4, rel=0.05)
    # a third time: nothing runs, and the prediction written before the target ran is kept as it was
    saved = json.loads((out / "ladder.json").read_text())
    saved["prediction"]["loss"] = 123.0  # as if the prediction had been another: it must not be recomputed
    (out / "ladder.json").write_text(json.dumps(saved))
    assert result["cost"]["cpu_seconds_complete"] and result["cost"]["cpu_seconds"] > 0
    # a ladder killed while a point ran leaves that invocation open: its CPU seconds are then a lower bound
    cost_file = out / "runs" / "hidden_size=16_pretrain_steps=100__seed0" / "ladder_cost.json"
    cost = json.loads(cost_file.read_text())
    cost["invocations"].insert(0, {"exit": None, "cpu_seconds": 0.0, "wall_seconds": 0.0})
    cost_file.write_text(json.dumps(cost))
    again = run_ladder(**args)
    assert not again["cost"]["cpu_seconds_complete"] and "&ge; " in (out / "ladder.html").read_text()
    assert _launches(out) == {**launches, "hidden_size=32_pretrain_steps=200__seed0": 2}
    assert again["prediction"]["loss"] == 123.0 and again["prediction"]["made_at"] == pred["made_at"]
    assert "Prediction and validation" in (out / "ladder.html").read_text()
    with pytest.raises(ConfigError, match="another plan"):
        run_ladder(**{**args, "seeds": 2})


def test_pretraining_point(tmp_path: Path) -> None:
    """One pretraining point in-process: summary, held-out loss, and a base model RL can load."""
    from keelrl.ladder.pretrain_run import main as pretrain_main
    from keelrl.models.load import load_policy

    sets = [
        "model.tiny.hidden_size=16",
        "ladder.pretrain_steps=4",
        "ladder.pretrain_batch=4",
        "ladder.heldout_lines=8",
    ]
    assert (
        pretrain_main(
            [
                "configs/ladder_pretrain_tiny.toml",
                "--run-dir",
                str(tmp_path),
                *[a for s in sets for a in ("--set", s)],
            ]
        )
        == 0
    )
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["state"] == "finished" and s["steps"] == 4 and s["heldout_loss"] > 0
    model, _ = load_policy(Config().model.model_copy(update={"path": str(tmp_path / "final")}))
    assert sum(p.numel() for p in model.parameters()) == s["parameters"]
    assert PretrainKind().record(tmp_path)["compute"] == 6.0 * s["parameters"] * s["tokens"]
    # not the demo's corpus: refused with a user error
    assert (
        pretrain_main(
            [
                "configs/ladder_pretrain_tiny.toml",
                "--run-dir",
                str(tmp_path / "x"),
                "--set",
                'task.name="multiply"',
                "--set",
                "task.params={}",
            ]
        )
        == 2
    )


@pytest.mark.slow
def test_pretraining_ladder_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "pre"
    code = main([
        "ladder", "configs/ladder_pretrain_tiny.toml", "--out", str(out), "--jobs", "2",
        "--axis", "model.tiny.hidden_size=16,32", "--axis", "ladder.pretrain_steps=3,6,9",
        "--target", "model.tiny.hidden_size=48", "--target", "ladder.pretrain_steps=9",
        "--set", "ladder.pretrain_batch=4", "--set", "ladder.heldout_lines=16", "--set", "ladder.resamples=10",
    ])  # fmt: skip
    assert code == 0
    result = json.loads((out / "ladder.json").read_text())
    points = result["chinchilla"]["points"]
    assert len(points) == 6 and {p["parameters"] for p in points} == {
        r["parameters"] for r in result["runs"][:6]
    }
    assert (
        all(p["loss"] > 0 for p in points)
        and result["validation"]["label"] == "target:hidden_size=48,pretrain_steps=9"
    )
    base = out / "runs" / "hidden_size=16_pretrain_steps=9__seed0" / "final"
    assert (base / "model.safetensors").is_file() and (base / "tokenizer.json").is_file()  # a base for RL
    assert result["cost"]["cpu_seconds"] > 0 and '<div class="plot"' in (out / "ladder.html").read_text()


def test_rl_ladder_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "rl"
    code = main([
        "ladder", "configs/smoke.toml", "--out", str(out), "--jobs", "2", "--seeds", "1",
        "--axis", "model.tiny.hidden_size=16,32", "--target", "model.tiny.hidden_size=48",
        "--set", "train.steps=3", "--set", "eval.every_steps=1", "--set", "eval.problems=8",
        "--set", "supervisor.enabled=false", "--set", "checkpoint.every_steps=0", "--set", "ladder.resamples=10",
    ])  # fmt: skip
    assert code == 0
    result = json.loads((out / "ladder.json").read_text())
    assert [f["steps"] for f in result["fits"]] == [[0, 1, 2, 3]] * 2
    for r in result["runs"]:
        assert r["compute"][0] == 0 and all(b > a for a, b in zip(r["compute"], r["compute"][1:]))
        assert r["cpu_seconds"] > 0 and r["eval_problems"] == 8
    p = result["prediction"]
    assert p["method"] == "joint size fit over 2 sizes" and p["made_at"]
    assert result["validation"]["label"] == "target:hidden_size=48" and "size_law" in result
    assert main(["ladder", "configs/smoke.toml", "--out", str(out), "--page"]) == 0


def test_user_errors_stop_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    assert main(["ladder", "configs/smoke.toml", "--out", str(out)]) == 2
    assert "needs at least one axis" in capsys.readouterr().err
    assert main(["ladder", "configs/smoke.toml", "--out", str(out), "--axis", "algo.lrr=1e-4,3e-4"]) == 2
    assert "algo.lrr" in capsys.readouterr().err
    assert (
        main(
            [
                "ladder",
                "configs/smoke.toml",
                "--out",
                str(out),
                "--axis",
                "algo.lr=1e-4",
                "--set",
                "eval.at_start=false",
            ]
        )
        == 2
    )
    assert "eval.at_start" in capsys.readouterr().err
    assert main(["ladder", "configs/smoke.toml", "--out", str(out), "--page"]) == 2
    assert not (out / "runs").exists()
