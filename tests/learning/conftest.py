"""One full demo lifecycle (pretrain -> eval -> RL -> eval, ~6 minutes on 2 cores) shared by the learning
tests: its summary shows that RL learns, and its pretrained base is where the failure cases start.
KEELRL_TEST_DEMO_DIR=runs/demo reuses the output of a finished `keelrl demo` (same code, same seed) instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os

    from keelrl.recipes.demo import run_demo

    if os.environ.get("KEELRL_TEST_DEMO_DIR"):
        return Path(os.environ["KEELRL_TEST_DEMO_DIR"])
    out = tmp_path_factory.mktemp("learning") / "demo"
    run_demo(seed=0, out=out)
    return out


@pytest.fixture(scope="session")
def demo_summary(demo_dir: Path) -> dict[str, Any]:
    import json

    return json.loads((demo_dir / "summary.json").read_text())
