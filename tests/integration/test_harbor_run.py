"""RL through the trainer on a folder of Harbor tasks in containers (the container backend; skipped, saying why,
only where no container runtime can run): a tiny model pretrained for a few seconds to call the shell tool once
(it writes a digit; the verifier pays digits >= 5), the oracle validation before training, checkpoints and an
exact resume, box times in the metrics. And a task whose verifier always errors: the run stops with the guard's
sentence before any update is made from it."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file

from keelrl.config import TinyModelConfig, load_config
from keelrl.loop.trainer import GuardStop, train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.run.faults import InjectedFault

INSTRUCTION = "Write a digit to a.txt."
PAYS = "#!/bin/bash\nd=$(head -c1 /app/a.txt 2>/dev/null)\ncase $d in [5-9]) echo 1;; *) echo 0;; esac > /logs/verifier/reward.txt\n"
COMMON = [
    'task.template="compact"',
    "rollout.batch_size=8",
    "rollout.group_size=4",
    "rollout.max_new_tokens=48",
    "episode.max_turns=2",
    "episode.max_context_tokens=240",
    "train.micro_batch_size=8",
    "train.threads=1",
    "train.steps=4",
    "checkpoint.every_steps=2",
    "eval.at_start=false",
    "eval.every_steps=0",
    "eval.problems=4",
    "log.progress=false",
    "log.rollouts_per_step=8",
    "supervisor.enabled=false",
    "algo.lr=1e-3",
]


def _transcript(i: int) -> str:
    d = random.Random(i).randint(0, 9)
    return (
        f"User: {INSTRUCTION}\nAssistant:<tool_call>shell: echo {d} >a.txt</tool_call><eos>"
        "\nTool: exit status 0\nAssistant:done"
    )


@pytest.fixture(scope="module")
def shell_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    cfg = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, max_positions=256, init_seed=1)
    model = build_tiny_model(cfg, len(tok), tok.eos_token_id)
    pretrain(model, tok, _transcript, steps=120, batch_size=32, lr=1e-2, seed=0)
    out = tmp_path_factory.mktemp("shell_model")
    save_hf_dir(model, tok, out)
    return out


def write_tasks(root: Path, test: str, names: tuple[str, ...] = ("alpha", "beta")) -> Path:  # one per split
    for name in names:
        d = root / name
        for rel, text in {
            "instruction.md": INSTRUCTION,
            "task.toml": 'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 30.0\n',
            "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
            "tests/test.sh": test,
            "solution/solve.sh": "#!/bin/bash\necho 9 > /app/a.txt\n",
        }.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
    return root


def _overrides(model: Path, tasks: Path, extra: str = "") -> list[str]:
    params = f"task.params={{brief = true, shell_timeout_s = 10, test_fraction = 0.5{extra}}}"
    return [
        *COMMON,
        f'model.path="{model}"',
        f'task.name="dir:{tasks}"',
        params,
        'sandbox.backend="container"',
    ]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # about 2 minutes on 2 cores (its always-erroring sibling below stays in the default suite)
def test_rl_on_harbor_tasks_in_containers_resumes_exactly(
    container_runtime: str, shell_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    overrides = _overrides(shell_model_dir, write_tasks(tmp_path / "tasks", PAYS))
    clean = train(load_config("configs/smoke.toml", overrides), tmp_path / "clean")
    crash = [*overrides, "faults.crash_at_step=3"]
    with pytest.raises(InjectedFault):
        train(load_config("configs/smoke.toml", crash), tmp_path / "resumed")
    resumed = train(
        load_config("configs/smoke.toml", crash), tmp_path / "resumed"
    )  # from step 2's checkpoint
    assert resumed["weights_sha256"] == clean["weights_sha256"]
    metrics = _lines(tmp_path / "clean" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [m["reward/mean"] for m in _lines(tmp_path / "resumed" / "metrics.jsonl")][-2:] == [
        m["reward/mean"] for m in metrics
    ][-2:]
    for m in metrics:
        assert m["episode/error_frac"] == 0.0 and m["episode/tool_calls"] > 0.5
        assert m["episode/container_s"] > m["episode/verifier_s"] > 0
    assert any(m["reward/std"] > 0 for m in metrics)  # digits vary: real advantages, real updates
    with gzip.open(tmp_path / "clean" / "rollouts.jsonl.gz", "rt") as f:
        rollouts = [json.loads(line) for line in f]
    shells = [r for r in rollouts if r["info"]["tool_calls"]]
    assert shells and all(r["status"] == "ok" and r["info"]["container_s"] > 0 for r in rollouts)
    assert {r["reward"] for r in shells} <= {0.0, 1.0} and shells[0]["info"]["transcript"][1][
        "role"
    ] == "tool"


def test_a_task_whose_verifier_always_errors_stops_the_run_before_any_update(
    container_runtime: str, shell_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = write_tasks(
        tmp_path / "tasks", "#!/bin/bash\necho 'cannot install the test runner' >&2\nexit 1\n"
    )
    # its oracle fails too, so the validation would leave it out: keep it, to see the guard
    overrides = _overrides(shell_model_dir, broken, ", keep_failing = true")
    run = tmp_path / "run"
    with pytest.raises(GuardStop):
        train(load_config("configs/smoke.toml", overrides), run)
    stop = [e for e in _lines(run / "events.jsonl") if e["kind"] == "guard_stop"]
    assert len(stop) == 1 and stop[0]["rule"] == "unscored_episodes" and stop[0]["step"] == 1
    assert "100% of step 1's episodes ended without a reward (8 verifier errors)" in stop[0]["message"]
    step1 = next(m for m in _lines(run / "metrics.jsonl") if m["step"] == 1)
    assert step1["episode/verifier_errors"] == 8 and "loss/total" not in step1  # no update was computed
    saved = sorted((run / "checkpoints").glob("step_*"))
    first, last = (load_file(str(p / "model.safetensors")) for p in (saved[0], saved[-1]))
    assert all(first[k].equal(last[k]) for k in first)
