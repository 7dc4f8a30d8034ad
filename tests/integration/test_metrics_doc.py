"""docs/metrics.md stays true: tiny real runs of every kind (RL with evals and a KL reference, a multi-turn
environment, asynchronous sampling, the critic, an adaptive curriculum over a task mixture with dynamic
sampling, self-play with two policies, SFT, a reward model, RL with that learned reward, the dataset task with a
reward function) write metrics.jsonl,
and every name they write must be a row of the table (a family row `a/<x>` covers `a/anything`), with a
meaning and a unit."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from keelrl.config import TinyModelConfig, load_config
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
from keelrl.monitor.run_dir import read_jsonl
from keelrl.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
SMOKE = ROOT / "configs" / "smoke.toml"
BASE = ["train.threads=1", "log.progress=false", "log.tensorboard=false", "supervisor.enabled=false",
        "train.steps=2", "eval.every_steps=2", "eval.problems=8"]  # fmt: skip


def rows() -> list[tuple[str, str, str]]:
    """(name, meaning, unit) of every table row of docs/metrics.md."""
    return [
        tuple(c.strip().strip("`") for c in line.strip().strip("|").split("|"))  # type: ignore[misc]
        for line in DOC.read_text().splitlines()
        if re.match(r"^\| `[^`]+` \|", line)
    ]


def covered(name: str, patterns: list[re.Pattern[str]]) -> bool:
    return any(p.fullmatch(name) for p in patterns)


def test_every_row_has_a_meaning_and_a_unit_and_families_match() -> None:
    table = rows()
    names = [n for n, _, _ in table]
    assert len(names) == len(set(names)) and len(names) > 100
    assert all(meaning and unit for _, meaning, unit in table)
    patterns = [re.compile(re.sub(r"<[^>]+>", ".+", re.escape(n))) for n in names]
    assert covered("curriculum/pass_rate/countdown/n3", patterns) and covered("proposer/kl/old", patterns)
    assert not covered("curriculum/pass_rates", patterns) and not covered("reward/means", patterns)
    for shared in (
        "reward/mean",
        "accuracy",
        "kl/ref",
        "eval/accuracy",
        "guard/skipped_steps",
    ):  # DESIGN.md's
        assert shared in names


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny run of every kind, 2 steps each (about a minute on 2 cores)."""
    out = tmp_path_factory.mktemp("metrics")
    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, max_positions=256),
        len(tok),
        tok.eos_token_id,
    )
    save_hf_dir(model, tok, out / "tiny")
    task = get_task("countdown", min_numbers=2, max_numbers=2, max_number=20, max_target=400)
    sft = [task.problem("train", i) for i in range(64)]
    (out / "sft.jsonl").write_text(
        "".join(
            json.dumps({"problem": p, "completion": f"<answer>{task.reference_answer(p)}</answer>"}) + "\n"
            for p in sft
        )
    )
    rng = random.Random(0)
    pairs = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(200)]
    (out / "prefs.jsonl").write_text("".join(
        json.dumps({"prompt": f"{a} {b} -> {a + b}", "chosen": f"<answer>{a}+{b}</answer>",
                    "rejected": f"<answer>{a}+{b}+0</answer>"}) + "\n" for a, b in pairs
    ))  # fmt: skip
    (out / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(60))
    )
    (out / "rewards.py").write_text(
        "def exact(completion, answer, **row):\n    return float(answer in completion)\n"
    )
    tiny = [f'model.path="{out / "tiny"}"', 'task.template="compact"']
    data = ["data.batch_size=16", "data.max_length=64"]
    kinds = {
        "rl": (SMOKE, ["algo.kl_coef=0.01"]),
        "env": (SMOKE, ['task.name="countdown_tools"', 'task.template="compact"', "task.params={}"]),
        "async": (SMOKE, ["rollout.max_staleness=1"]),
        "gae": (SMOKE, ['algo.advantage="gae"']),
        "curriculum": (ROOT / "configs" / "curriculum_tiny.toml", []),
        "selfplay": (SMOKE, [*tiny, 'train.stage="selfplay"', "selfplay.proposer_prompts=2", 'selfplay.policies="two"']),
        "sft": (SMOKE, [*tiny, 'train.stage="sft"', f'data.path="{out / "sft.jsonl"}"', *data, "data.eval_fraction=0.1"]),
        "rm": (SMOKE, [*tiny, 'train.stage="rm"', f'data.path="{out / "prefs.jsonl"}"', *data, "data.eval_fraction=0.2"]),
        "learned_reward": (SMOKE, [*tiny, f'reward.model="{out / "rm"}"']),  # the rm run's model, trained above
        "dataset": (SMOKE, ['task.name="dataset"', f'task.params={{path="{out / "rows.jsonl"}", reward="{out / "rewards.py"}:exact"}}']),
    }  # fmt: skip
    for name, (config, sets) in kinds.items():
        train(load_config(config, [*BASE, *sets]), out / name)
    return {name: out / name for name in kinds}


KINDS = ["rl", "env", "async", "gae", "curriculum", "selfplay", "sft", "rm", "learned_reward", "dataset"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_metric_a_tiny_run_writes_is_documented(runs: dict[str, Path], kind: str) -> None:
    patterns = [re.compile(re.sub(r"<[^>]+>", ".+", re.escape(n))) for n, _, _ in rows()]
    written = {k for rec in read_jsonl(runs[kind] / "metrics.jsonl") for k in rec} - {"step", "time"}
    assert len(written) >= 15  # the run wrote its metrics (not a vacuous pass)
    missing = sorted(k for k in written if not covered(k, patterns))
    assert missing == [], f"{kind} run writes metrics docs/metrics.md does not list: {missing}"
    family = {  # each kind's own family is among what it wrote
        "env": "episode/turns", "async": "async/batches_ready", "gae": "critic/value_loss",
        "curriculum": "curriculum/weight/countdown/n2", "selfplay": "proposer/entropy", "sft": "sft/fill",
        "rm": "rm/accuracy", "learned_reward": "reward/model", "rl": "kl/ref", "dataset": "reward/mean",
    }  # fmt: skip
    assert family[kind] in written
