"""Imports point one way (docs/ARCHITECTURE.md, "Layers"): no module imports from a higher layer, and no two
modules import each other. Every import counts: at module level, inside a function, under TYPE_CHECKING. A
module's layer is the first part of its path under keelrl/ (the package's own __init__.py and __main__.py, the
entry points, sit above every layer). benchmarks/import_map.py does the parsing and prints the counts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import keelrl

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(keelrl.__file__).parent
_spec = importlib.util.spec_from_file_location("import_map", REPO / "benchmarks" / "import_map.py")
assert _spec is not None and _spec.loader is not None
import_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_map)


def test_every_folder_has_a_layer_and_imports_point_down() -> None:
    layers = import_map.read_layers(REPO / "docs" / "ARCHITECTURE.md")
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {f for layer in layers for f in layer}, (
        "docs/ARCHITECTURE.md's layers name every folder"
    )
    loose = {p.name for p in ROOT.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert loose == set(), "the top of the package holds only the entry points"
    found = import_map.measure(ROOT, layers)
    assert found["unlayered_modules"] == []
    assert found["upward"] == [], "imports from a lower layer to a higher one"
    assert found["two_way"] == [], "pairs of modules that import each other"


def test_the_map_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    for folder in ("", "low", "high"):
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from pkg.low import b\n")
    (pkg / "low" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high.a import x\n"
    )
    (pkg / "low" / "c.py").write_text("def f():\n    from . import b\n    import pkg.high.a\n")
    found = import_map.measure(pkg, [["low"], ["high"]])
    assert found["upward"] == ["pkg.low.b -> pkg.high.a", "pkg.low.c -> pkg.high.a"]
    assert found["two_way"] == ["pkg.high.a <-> pkg.low.b"]
    assert (found["modules"], found["imports"]) == (6, 4)
