"""benchmarks/mutate_loss.py stays runnable: every mutant still applies to exactly one line of the code it
mutates (an edit of the update path that moves a mutant's text fails here, not months later in `make mutants`),
and its quick mode (three mutants, with their test files run unpatched first) catches all three."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_applies_to_one_line() -> None:
    spec = importlib.util.spec_from_file_location("mutate_loss", ROOT / "benchmarks" / "mutate_loss.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.check_mutations()  # raises SystemExit with the mutant's name otherwise
    assert len(module.MUTATIONS) >= 80
    assert set(module.QUICK) <= set(module.MUTATIONS)


def test_quick_mode_catches_its_mutants() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/mutate_loss.py", "--quick", "--jobs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["baseline_passes"] and out["survivors"] == [] and out["mutants"] == out["caught"] == 3
