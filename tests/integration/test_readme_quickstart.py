"""The README's quick start as a new user types it, on a fresh copy of the repository (issue 46): its bash block
line by line under `set -e`, then its Python example (`keelrl.train` with a reward function). The default test
uses this checkout's virtual environment for `make install && . .venv/bin/activate`; the slow one runs those
too, on a `git clone` of the committed tree (it installs from the package index: minutes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "make install && . .venv/bin/activate"


def blocks(language: str, after: str = "") -> list[str]:
    """The README's fenced `language` blocks (those after the heading `after`, when given)."""
    text = (ROOT / "README.md").read_text()
    if after:
        text = text[text.index(after) :]
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def quick_start() -> str:
    return blocks("bash", "## Quick start")[0]


def python_example() -> str:
    return next(b for b in blocks("python") if "keelrl.train(" in b)


def fresh_copy(dest: Path) -> Path:
    """The files a clone of this working tree has: tracked ones and new ones not ignored (no runs/, no .venv)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def run_script(script: str, cwd: Path, timeout: float = 900) -> None:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, (
        f"{script}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


def test_the_quick_start_and_the_python_example_run_on_a_fresh_copy(tmp_path: Path) -> None:
    block = quick_start()
    assert block.startswith(INSTALL), "the quick start's first line installs keelrl"
    repo = fresh_copy(tmp_path / "keelrl")
    # this checkout's environment stands in for `make install && . .venv/bin/activate`
    script = block.replace(INSTALL, f"export PATH={Path(sys.executable).parent}:$PATH", 1)
    run_script(script, repo)
    assert (repo / "runs/smoke/summary.json").is_file() and (repo / "runs/sums/report.html").is_file()
    (repo / "example.py").write_text(python_example())
    run_script(f"{sys.executable} example.py", repo)
    assert (repo / "runs/sums-api/summary.json").is_file()


@pytest.mark.slow
def test_the_quick_start_installs_and_runs_on_a_git_clone(tmp_path: Path) -> None:
    """`git clone` of the committed tree, then the block as written, `make install` included."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp_path / "keelrl")], check=True)
    run_script(quick_start(), tmp_path / "keelrl", timeout=3600)
