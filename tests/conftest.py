"""Shared fixtures: tiny models built locally (no hub access), and a quiet torch. Every test under
tests/unit, tests/integration or tests/system gets that tier's marker (`pytest -m unit`); tests/learning's
tests are all `slow`."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from keelrl.config import TinyModelConfig
from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
# tests/user_tasks.py holds tasks that tests name by import path ("user_tasks:HackableMultiply")
sys.path.insert(0, str(Path(__file__).parent))

TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and (tier := item.path.relative_to(here).parts[0]) in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


# Skips, said out loud (one shared hook for every optional component: vLLM, containers, Ray, ...). At the end of
# every run: how many tests were skipped, grouped by reason with counts, and how many `-m` deselected.
# KEELRL_REQUIRE="vllm,podman" (comma-separated, case-insensitive; `make test` sets it for what install-dev
# installs) turns a skip whose reason names one of them into a failed run: where a component installs, its
# tests must run, not skip. A reason should therefore name what is missing ("vLLM is not installed ...").
def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _required_skips(reasons: Counter[str]) -> list[str]:
    required = [n.strip().lower() for n in os.environ.get("KEELRL_REQUIRE", "").split(",") if n.strip()]
    return [r for r in reasons if any(n in r.lower() for n in required)]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    reasons = Counter(_skip_reason(r) for r in terminalreporter.stats.get("skipped", []))
    deselected = len(terminalreporter.stats.get("deselected", []))
    if not reasons and not deselected:
        return
    terminalreporter.section("skips by reason")
    keyword = config.option.keyword
    chosen = f"-m {config.option.markexpr!r}" + (f" -k {keyword!r}" if keyword else "")
    terminalreporter.line(
        f"{sum(reasons.values())} skipped (a module skipped at import counts once); {deselected} deselected "
        f"by {chosen}"
    )
    for reason, n in reasons.most_common():
        terminalreporter.line(f"{n:5d}  {reason}")
    for reason in _required_skips(reasons):
        terminalreporter.line(
            f"ERROR: KEELRL_REQUIRE={os.environ['KEELRL_REQUIRE']} but skipped: {reason}", red=True
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and exitstatus == 0:
        reasons = Counter(_skip_reason(r) for r in reporter.stats.get("skipped", []))
        if _required_skips(reasons):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def container_runtime() -> str:
    """A container runtime with the debian:bookworm-slim base-image stand-in (sandbox/images.py: built once per
    machine, cached by hash); skips, saying why, where no runtime can run (make test then requires it: podman)."""
    from keelrl.sandbox.boxes import BoxError, find_runtime
    from keelrl.sandbox.images import make_stand_ins

    rt = find_runtime()
    if rt is None:
        pytest.skip("no container runtime works here (podman or docker; `make system-deps` installs podman)")
    try:
        make_stand_ins(rt, ["debian:bookworm-slim"])
    except BoxError as err:
        pytest.skip(f"{rt.cli} works but the debian:bookworm-slim stand-in cannot be built: {err}")
    return rt.cli


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(char_tokenizer):
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=128, init_seed=3),
        len(char_tokenizer),
        char_tokenizer.eos_token_id,
    )
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model, char_tokenizer) -> Path:
    out = tmp_path_factory.mktemp("tiny_model")
    save_hf_dir(tiny_model, char_tokenizer, out)
    return out


def _multiply_line(i: int) -> str:
    """A format-teaching line: a 1-digit product and a *random* answer (the model learns the format, not
    the arithmetic, so RL has something to learn)."""
    import random

    rng = random.Random(i)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"{a}*{b}\n<answer>{rng.randint(1, 81)}</answer>"


@pytest.fixture(scope="session")
def format_model_dir(tmp_path_factory) -> Path:
    """A tiny model pretrained for a few seconds to answer `a*b` in the <answer> format: its rewards vary
    (0.1 wrong, 1.0 right), so RL updates are real, unlike a random model whose rewards are all 0."""
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=64, init_seed=1),
        len(tok),
        tok.eos_token_id,
    )
    pretrain(model, tok, _multiply_line, steps=60, batch_size=64, lr=1e-2, seed=0)
    out = tmp_path_factory.mktemp("format_model")
    save_hf_dir(model, tok, out)
    return out


@pytest.fixture(scope="session")
def vllm_run(tmp_path_factory) -> list[str]:
    """--set overrides for a tiny multiplication run on the vLLM engine whose rewards vary: a format model
    as above, with head_dim 32 (vLLM's CPU attention refuses smaller heads)."""
    from keelrl.recipes.demo import pretrain

    tok = build_char_tokenizer()
    model = build_tiny_model(VLLM_TINY, len(tok), tok.eos_token_id)
    pretrain(model, tok, _multiply_line, steps=60, batch_size=64, lr=1e-2, seed=0)
    out = tmp_path_factory.mktemp("vllm_format_model")
    save_hf_dir(model, tok, out)
    return [
        f'model.path="{out}"',
        *[o for o in FORMAT_RUN if not o.startswith("algo.lr")],
        'rollout.engine="vllm"',
        "algo.lr=5e-4",  # 3e-3 collapses this wider model in one step (then no push changes anything)
        "train.steps=4",
        "eval.at_start=false",
        "eval.every_steps=0",
        "eval.problems=8",
        "checkpoint.every_steps=2",
        "log.rollouts_per_step=16",
    ]


VLLM_TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, max_positions=128, init_seed=3)


@pytest.fixture(scope="session")
def vllm_tiny() -> TinyModelConfig:
    """The tiny model shape the vLLM tests use (head_dim 32)."""
    return VLLM_TINY


@pytest.fixture(scope="session")
def format_run(format_model_dir: Path) -> list[str]:
    """--set overrides for a tiny RL run on 1-digit multiplication from `format_model_dir`."""
    return [f'model.path="{format_model_dir}"', *FORMAT_RUN]


FORMAT_RUN = [
    'task.name="multiply"',
    'task.template="compact"',
    "task.params={digits_a = 1, digits_b = 1}",
    "rollout.batch_size=16",
    "rollout.group_size=4",
    "rollout.max_new_tokens=24",
    "algo.lr=3e-3",
    "train.micro_batch_size=8",
    "train.threads=1",
    "log.progress=false",
]
