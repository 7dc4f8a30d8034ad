"""Multi-turn environments through the normal trainer: countdown_tools with a tiny model that calls its tool,
a user's environment class from the README loaded by import path, and swe_mini. Each run checkpoints and
resumes exactly, and writes multi-turn metrics and whole transcripts."""

from __future__ import annotations

import gzip
import json
import random
import re
import sys
from pathlib import Path

import pytest

from keelrl.cli.main import main
from keelrl.config import TinyModelConfig, load_config
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.monitor.report import render_report
from keelrl.run.faults import InjectedFault
from keelrl.tasks.countdown import Countdown, random_expression
from keelrl.tasks.countdown_tools import calc

README = Path(__file__).parents[2] / "README.md"
COMMON = [
    'task.template="compact"',
    "rollout.batch_size=16",
    "rollout.group_size=4",
    "train.micro_batch_size=8",
    "train.threads=1",
    "train.steps=4",
    "checkpoint.every_steps=2",
    "eval.at_start=false",
    "eval.every_steps=0",
    "eval.problems=8",
    "log.progress=false",
    "log.rollouts_per_step=16",
    "supervisor.enabled=false",
]
EPISODE_METRICS = {"episode/turns", "episode/tool_calls", "episode/tool_errors", "episode/length"} | {
    f"episode/end/{r}" for r in ("done", "turns", "context", "length")
}


def _transcript(i: int) -> str:
    """A countdown_tools episode as the plain format writes it: a calc call, the tool's answer, an answer."""
    rng = random.Random(i)
    problem = Countdown(seed=0, min_numbers=3, max_numbers=3, max_number=9).problem("train", i)
    expr, _ = random_expression(list(problem["numbers"]), rng) or ("1+1", 2)
    numbers = " ".join(map(str, sorted(problem["numbers"], reverse=True)))
    return (
        f"User: {numbers} -> {problem['target']}\nAssistant:<tool_call>calc: {expr}</tool_call><eos>"
        f"\nTool: {calc(expr)}\nAssistant:<answer>{expr}</answer>"
    )


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory) -> Path:
    """A tiny model pretrained for a few seconds to call `calc` once and then answer (rewards vary)."""
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, max_positions=160, init_seed=1),
        len(tok),
        tok.eos_token_id,
    )
    pretrain(model, tok, _transcript, steps=120, batch_size=32, lr=1e-2, seed=0)
    out = tmp_path_factory.mktemp("tool_model")
    save_hf_dir(model, tok, out)
    return out


def _train(run_dir: Path, overrides: list[str]) -> dict:
    return train(load_config("configs/smoke.toml", [*COMMON, *overrides]), run_dir)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _rollouts(run: Path) -> list[dict]:
    with gzip.open(run / "rollouts.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def _resumes_exactly(tmp_path: Path, overrides: list[str]) -> tuple[Path, dict]:
    clean = _train(tmp_path / "clean", overrides)
    with pytest.raises(InjectedFault):
        _train(tmp_path / "resumed", [*overrides, "faults.crash_at_step=3"])
    resumed = _train(tmp_path / "resumed", [*overrides, "faults.crash_at_step=3"])  # resumes from step 2
    assert resumed["weights_sha256"] == clean["weights_sha256"]
    assert [m["episode/turns"] for m in _metrics(tmp_path / "resumed")][-2:] == [
        m["episode/turns"] for m in _metrics(tmp_path / "clean")
    ][-2:]
    return tmp_path / "clean", clean


def test_countdown_tools_trains_resumes_exactly_and_logs_episodes(
    tool_model_dir: Path, tmp_path: Path
) -> None:
    overrides = [
        f'model.path="{tool_model_dir}"',
        'task.name="countdown_tools"',
        "task.params={brief = true, min_numbers = 3, max_numbers = 3, max_number = 9}",
        "rollout.max_new_tokens=40",
        "episode.max_turns=3",
        "episode.max_context_tokens=150",
        "algo.lr=1e-3",
    ]
    run, _ = _resumes_exactly(tmp_path, overrides)
    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert EPISODE_METRICS <= set(m)
        assert sum(m[f"episode/end/{r}"] for r in ("done", "turns", "context", "length")) == pytest.approx(
            1.0
        )
        truncated = 1 - m["episode/end/done"]
        assert m["response_length/truncated_frac"] == pytest.approx(truncated)  # the truncation guard's input
    assert (
        max(m["episode/turns"] for m in metrics) > 1.5 and max(m["episode/tool_calls"] for m in metrics) > 0.5
    )
    assert any(m["reward/std"] > 0 for m in metrics)
    # rollouts.jsonl.gz keeps whole transcripts, turn by turn, with which tokens were trained
    records = _rollouts(run)
    multi = [r for r in records if r["info"]["turns"] > 1]
    assert multi
    roles = [t["role"] for t in multi[0]["info"]["transcript"]]
    assert roles[:3] == ["assistant", "tool", "assistant"]
    assert [t["trained"] for t in multi[0]["info"]["transcript"]][:3] == [True, False, True]
    tool_turn = multi[0]["info"]["transcript"][1]["content"]
    assert re.fullmatch(r"-?\d+(/\d+)?|error: .*", tool_turn, re.DOTALL)
    # the report renders them turn by turn, trained and context apart
    html = render_report([run])
    assert '<div class="turn trained">' in html and '<div class="turn context">' in html
    # keelrl eval on the final model: pass@k over whole episodes, with turns and tool errors
    out = tmp_path / "eval.json"
    args = ["eval", str(run / "final"), "--task", "countdown_tools", "--problems", "6", "--samples", "4"]
    assert (
        main([*args, "--k", "1,2", "--temperature", "1.0", "--max-new-tokens", "40", "--out", str(out)]) == 0
    )
    result = json.loads(out.read_text())["metrics"]
    assert {"pass@1", "pass@2", "turns/mean", "tool_calls/mean", "tool_errors/mean"} <= set(result)
    assert result["turns/mean"]["value"] >= 1.0 and result["pass@2"]["value"] >= result["pass@1"]["value"]


def _readme_environment(tmp_path: Path) -> str:
    """The README's environment example, written to a module on sys.path; returns its import path."""
    text = README.read_text()
    block = text.split("<!-- env-example -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 40  # "a complete 30-line example"
    (tmp_path / "guess_number.py").write_text(block)
    sys.path.insert(0, str(tmp_path))
    return "guess_number:GuessNumber"


def _guesses(i: int) -> str:
    """Guessing games as the plain format writes them: a random guess, a random hint, another guess."""
    rng = random.Random(i)
    a, b, hint = rng.randint(1, 4), rng.randint(1, 4), rng.choice(["higher", "lower"])
    return f"User: Guess my number from 1 to 4.\nAssistant:{a}<eos>\nUser: {hint}\nAssistant:{b}"


def test_a_user_environment_from_the_readme_trains(tmp_path: Path) -> None:
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=128), len(tok), 0
    )
    pretrain(model, tok, _guesses, steps=60, batch_size=32, lr=1e-2, seed=0)  # it guesses, then stops
    save_hf_dir(model, tok, tmp_path / "model")
    name = _readme_environment(tmp_path)
    try:
        summary = _train(
            tmp_path / "run",
            [
                f'model.path="{tmp_path / "model"}"',
                f'task.name="{name}"',
                "task.params={high = 4}",
                "rollout.max_new_tokens=8",
                "episode.max_turns=3",
                "episode.max_context_tokens=120",
                "train.steps=2",
            ],
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("guess_number", None)
    metrics = _metrics(tmp_path / "run")
    assert summary["state"] == "finished" and [m["step"] for m in metrics] == [1, 2]
    assert EPISODE_METRICS <= set(metrics[-1])
    # wrong guesses get hints and another turn; some guesses are right
    assert max(m["episode/turns"] for m in metrics) > 1.2 and max(m["reward/mean"] for m in metrics) > 0
    assert all(0.0 <= m["accuracy"] <= 1.0 for m in metrics)


def test_swe_mini_trains_resumes_exactly_and_runs_hidden_tests(tmp_path: Path) -> None:
    """A random tiny model on swe_mini: its one turn is cut by the token cap or has no tool call, and every
    episode's hidden tests run in the sandbox at its end (all fail: the bug is still there)."""
    overrides = [
        'model.path="tiny"',
        "model.tiny.max_positions=1536",
        'task.name="swe_mini"',
        "task.params={}",
        "rollout.batch_size=8",
        "rollout.max_new_tokens=12",
        "episode.max_turns=2",
        "episode.max_context_tokens=1500",
    ]
    run, _ = _resumes_exactly(tmp_path, overrides)
    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(EPISODE_METRICS <= set(m) and m["reward/mean"] == 0.0 for m in metrics)
    records = _rollouts(run)
    assert records and all(r["info"]["reason"] == "wrong_answer" for r in records)
    assert all(r["info"]["total"] > 10 and r["info"]["passed"] < r["info"]["total"] for r in records)
