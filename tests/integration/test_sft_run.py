"""SFT runs through keelrl's training loop: the run directory, held-out loss and task accuracy, exact resume,
the loss-spike guard, `keelrl sft` / `keelrl rft` on the command line, and STaR's loop learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keelrl.cli.main import main
from keelrl.config import config_from_dict
from keelrl.loop.trainer import train
from keelrl.models.load import load_policy
from keelrl.run.checkpoint import weights_sha256
from keelrl.tasks import get_task

TASK = {
    "name": "countdown",
    "template": "compact",
    "params": {"min_numbers": 2, "max_numbers": 2, "max_number": 20, "max_target": 400},
}


def write_data(path: Path, n: int) -> Path:
    """Countdown training problems with a correct answer each, as {problem, completion} records."""
    task = get_task("countdown", **TASK["params"])
    rows = []
    for i in range(n):
        p = task.problem("train", i)
        rows.append({"problem": p, "completion": f"<answer>{task.reference_answer(p)}</answer>"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_config(model_dir: Path, data: Path, steps: int, **data_over) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "task": TASK,
        "rollout": {"max_new_tokens": 24},
        "algo": {"lr": 3e-3, "lr_schedule": "constant"},
        "data": {"path": str(data), "batch_size": 16, "max_length": 64, "eval_fraction": 0.1, **data_over},
        "train": {"stage": "sft", "steps": steps, "micro_batch_size": 8, "threads": 1},
        "eval": {"every_steps": 3, "problems": 20, "at_start": True},
        "checkpoint": {"every_steps": 3, "keep_last": 3},
        "supervisor": {"enabled": False},
    }


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return write_data(tmp_path_factory.mktemp("sft") / "data.jsonl", 300)


def test_sft_run_directory_eval_and_exact_resume(tmp_path, tiny_model_dir, data_file):
    full = train(config_from_dict(sft_config(tiny_model_dir, data_file, 6, packing=True)), tmp_path / "full")
    metrics = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "eval/loss" in m]
    assert [m["step"] for m in evals] == [0, 3, 6]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"] - 0.3  # it learns the held-out answers' format
    assert all("eval/accuracy" in m for m in evals)  # data.task_eval: the task is sampled too
    steps = [m for m in metrics if "loss/nll" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]
    for m in steps:
        assert m["sft/examples"] == 16 and 0 < m["sft/fill"] <= 1 and m["tokens/trained"] > 16
    assert steps[-1]["sft/epoch"] == pytest.approx(6 * 16 / 270, abs=0.02)  # ~270 of 300 kept for training
    assert full["steps"] == 6 and (tmp_path / "full" / "final" / "config.json").exists()

    # stop at 3, resume to 6: the same weights, bit for bit
    cfg = sft_config(tiny_model_dir, data_file, 3, packing=True)
    train(config_from_dict(cfg), tmp_path / "split")
    cfg["train"]["steps"] = 6
    train(config_from_dict(cfg), tmp_path / "split")
    a, _ = load_policy(config_from_dict({"model": {"path": str(tmp_path / "full" / "final")}}).model)
    b, _ = load_policy(config_from_dict({"model": {"path": str(tmp_path / "split" / "final")}}).model)
    assert weights_sha256(a) == weights_sha256(b)


def test_nonfinite_update_is_skipped(tmp_path, tiny_model_dir, data_file):
    """NaN gradients at one step: the per-step guard skips that update and the run goes on."""
    cfg = sft_config(tiny_model_dir, data_file, 14)
    cfg["faults"] = {"nan_grad_at_step": 12}
    cfg["eval"] = {"every_steps": 0, "problems": 5, "at_start": False}
    train(config_from_dict(cfg), tmp_path / "run")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    skips = [e for e in events if e.get("kind") == "skip"]
    assert [(e["step"], e["rule"]) for e in skips] == [(12, "nonfinite")]


def test_cli_sft_refuses_missing_data(tmp_path, tiny_model_dir, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\npath = "{tiny_model_dir}"\n[supervisor]\nenabled = false\n')
    assert main(["sft", str(cfg), "--run-dir", str(tmp_path / "r")]) == 2
    assert "needs data.path" in capsys.readouterr().err
    assert main(["sft", str(cfg), "--run-dir", str(tmp_path / "r"), "--set", "data.path=nope.jsonl"]) == 2
    assert "nope.jsonl does not exist" in capsys.readouterr().err


def test_rft_keeps_only_correct_completions_and_sft_trains_on_them(tmp_path, format_run, capsys):
    """`keelrl rft` samples the training problems, keeps what the checker accepts (at most --per-problem
    distinct ones each), and `keelrl sft` trains on the file (STaR's loop, one round)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[supervisor]\nenabled = false\n")
    sets = [x for s in format_run for x in ("--set", s)]
    out = tmp_path / "rft.jsonl"
    assert main(["rft", str(cfg), "--out", str(out), "--problems", "81", "--samples", "8", *sets]) == 0
    counts = json.loads(capsys.readouterr().out.splitlines()[0])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert counts["kept"] == len(rows) > 0 and counts["sampled"] == 81 * 8
    task = get_task("multiply", digits_a=1, digits_b=1)
    for r in rows:
        assert task.score(r["problem"], r["completion"]).correct and r["reward"] == 1.0
    per = {}
    for r in rows:
        per.setdefault(json.dumps(r["problem"]), set()).add(r["completion"])
    assert max(len(v) for v in per.values()) <= 2 and len(per) == counts["problems_solved"]
    run = tmp_path / "sft"
    sft_sets = [*sets, "--set", f"data.path={out}", "--set", "data.batch_size=8", "--set", "train.steps=3",
                "--set", "eval.problems=10", "--set", "eval.at_start=false"]  # fmt: skip
    assert main(["sft", str(cfg), "--run-dir", str(run), *sft_sets]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss/nll" in m] == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["data"]["path"] == str(out)


def test_supervised_sft_survives_a_crash_and_resumes_exactly(tmp_path, tiny_model_dir, data_file):
    """`keelrl sft` under the supervisor: the worker crashes after step 4, is restarted from the step-3
    checkpoint, and ends with the weights of an uninterrupted run."""
    cfg = sft_config(tiny_model_dir, data_file, 6)
    cfg["eval"] = {"every_steps": 0, "problems": 5, "at_start": False}
    train(config_from_dict(cfg), tmp_path / "plain")
    toml = tmp_path / "c.toml"
    toml.write_text("[supervisor]\nenabled = true\nbackoff_s = 0.2\n")
    sets = [
        f'model.path="{tiny_model_dir}"', "task.params={max_number = 20, max_target = 400, min_numbers = 2, max_numbers = 2}",
        'task.name="countdown"', 'task.template="compact"', "rollout.max_new_tokens=24", "algo.lr=3e-3",
        'algo.lr_schedule="constant"', f'data.path="{data_file}"', "data.batch_size=16", "data.max_length=64",
        "data.eval_fraction=0.1", "train.steps=6", "train.micro_batch_size=8", "train.threads=1",
        "eval.every_steps=0", "eval.problems=5", "eval.at_start=false", "checkpoint.every_steps=3",
        "checkpoint.keep_last=3", "faults.crash_at_step=4", "log.progress=false",
    ]  # fmt: skip
    argv = ["sft", str(toml), "--run-dir", str(tmp_path / "crashed")]
    assert main([*argv, *[x for s in sets for x in ("--set", s)]]) == 0
    events = [json.loads(x) for x in (tmp_path / "crashed" / "events.jsonl").read_text().splitlines()]
    assert any(e.get("kind") == "restart" for e in events), [e.get("kind") for e in events]
    a, _ = load_policy(config_from_dict({"model": {"path": str(tmp_path / "plain" / "final")}}).model)
    b, _ = load_policy(config_from_dict({"model": {"path": str(tmp_path / "crashed" / "final")}}).model)
    assert weights_sha256(a) == weights_sha256(b)
