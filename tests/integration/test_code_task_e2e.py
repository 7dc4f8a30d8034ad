"""The `code` task end to end on CPU with a tiny random model: `keelrl train` (configs/code_tiny.toml,
shortened) and `keelrl eval` on the exported final/ directory. Smoke only: a tiny random model does not
write working code, so this checks that sampling, sandboxed scoring, the update, eval and the exports
all run on the code task, not that anything is learned."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from keelrl.cli.main import main
from keelrl.config import load_config
from keelrl.loop.trainer import train

FAST = [
    "train.steps=2",
    "rollout.batch_size=8",
    "rollout.group_size=4",
    "rollout.max_new_tokens=32",
    "train.micro_batch_size=8",
    "eval.every_steps=2",
    "eval.problems=4",
    "checkpoint.every_steps=2",
]
REASONS = {"ok", "wrong_answer", "syntax_error", "runtime_error", "timeout", "memory", "crash", "output_limit",
           "no_code", "too_long"}  # fmt: skip


@pytest.fixture(scope="module")
def code_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("code") / "run"
    train(load_config("configs/code_tiny.toml", FAST), run)
    return run


def test_training_on_the_code_task_runs(code_run: Path) -> None:
    cfg = json.loads((code_run / "config.json").read_text())
    assert cfg["task"]["name"] == "code"
    metrics = [json.loads(line) for line in (code_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics[1:]:
        assert (
            0.0 <= m["reward/mean"] <= 1.0 and 0.0 <= m["accuracy"] <= 1.0 and 0.0 <= m["format_rate"] <= 1.0
        )
        assert "time/score_s" in m
    assert "eval/accuracy" in metrics[0] and "eval/accuracy" in metrics[2]
    with gzip.open(code_run / "rollouts.jsonl.gz", "rt") as f:
        rollouts = [json.loads(line) for line in f]
    assert rollouts and all(r["problem"]["entry_point"] and r["problem"]["tests"] for r in rollouts)
    for r in rollouts:
        assert r["reward"] in (0.0, 0.1) or 0.1 <= r["reward"] <= 1.0
    summary = json.loads((code_run / "summary.json").read_text())
    assert summary["steps"] == 2 and "accuracy" in summary["final_eval"]
    assert (code_run / "final" / "config.json").is_file()


def test_eval_cli_on_the_code_task(
    code_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval.json"
    args = ["eval", str(code_run / "final"), "--task", "code", "--problems", "4", "--max-new-tokens", "32"]
    assert main([*args, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "code" and result["problems"] == 4
    assert 0.0 <= result["accuracy"] <= 1.0
    records = result.get("records") or result.get("problems_detail") or []
    if isinstance(records, dict):  # {"greedy": [...], "sampled": [...]}
        records = records.get("greedy") or next(iter(records.values()))
    ids = [d["problem"]["id"] for d in records]
    assert len(ids) == 4 and all(isinstance(i, str) for i in ids)


def test_scoring_path_inside_the_trainer_scores_real_code(tmp_path: Path) -> None:
    """The trainer's scoring phase with completions that do hold code (a random model's do not)."""
    from keelrl.tasks import get_task

    cfg = load_config("configs/code_tiny.toml", FAST)
    task = get_task(cfg.task.name, seed=cfg.task.seed, **cfg.task.params)
    problem = task.problem("train", 0)
    prefix = task.prompt(problem, "compact").assistant_prefix
    right = task.score(problem, prefix + problem["reference"] + "```")
    wrong = task.score(problem, prefix + f"def {problem['entry_point']}(*a):\n    return None\n```")
    assert (right.reward, right.correct, right.info["reason"]) == (1.0, True, "ok")
    assert not wrong.correct and 0.1 <= wrong.reward < 1.0 and wrong.info["reason"] in REASONS
