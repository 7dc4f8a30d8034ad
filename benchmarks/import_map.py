"""The package's import map: how many modules, how many module-to-module imports, how many of them go from a
lower layer to a higher one, and how many pairs of modules import each other. Every import counts: at module
level, inside a function, under TYPE_CHECKING. The layers are the numbered list under "## Layers" in
docs/ARCHITECTURE.md (lowest first); a module's layer is the first part of its path under keelrl/, and the
package's own `__init__.py` and `__main__.py` (the entry points) sit above every layer. Prints JSON.

    python benchmarks/import_map.py [--root src/keelrl] [--layers docs/ARCHITECTURE.md] [--list]

tests/unit/test_layers.py runs the same functions and fails on any upward import or two-way pair.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOP = "(entry points)"


def module_paths(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under root (a package is its `__init__`)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        found[".".join(parts).removesuffix(".__init__")] = path
    return found


def imported_modules(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules an import statement anywhere in the file names (relative imports resolved;
    `from pkg import name` counts pkg.name when that is a module, else pkg)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {n for n in names if n in known and n != module}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name that is a module's attribute counts as its module)."""
    paths = module_paths(root)
    return {module: imported_modules(module, path, paths) for module, path in paths.items()}


def read_layers(markdown: Path) -> list[list[str]]:
    """The numbered list under the "## Layers" heading: one item per layer, lowest first; the folders of a layer
    are the `backticked` names before the item's first colon."""
    text = markdown.read_text(encoding="utf-8")
    section = re.search(r"^## Layers.*?\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if section is None:
        raise SystemExit(f"{markdown}: no '## Layers' section")
    items = re.findall(r"^\d+\.\s+(.*)$", section.group(1), re.M)
    return [re.findall(r"`([\w.]+)`", item.split(":")[0]) for item in items]


def layer_of(module: str, rank: dict[str, int]) -> int | None:
    """A module's layer number; the entry points are above all; None for a folder the list does not name."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return len(set(rank.values()))
    return rank.get(parts[1])


def measure(root: Path, layers: list[list[str]]) -> dict:
    graph = import_graph(root)
    rank = {folder: i for i, names in enumerate(layers) for folder in names}
    upward, unlayered = [], sorted({m for m in graph if layer_of(m, rank) is None})
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            low, high = layer_of(module, rank), layer_of(dep, rank)
            if low is not None and high is not None and high > low:
                upward.append(f"{module} -> {dep}")
    two_way = sorted(f"{a} <-> {b}" for a, deps in graph.items() for b in deps if a < b and a in graph[b])
    return {
        "modules": len(graph),
        "imports": sum(len(d) for d in graph.values()),
        "upward_imports": len(upward),
        "two_way_pairs": len(two_way),
        "unlayered_modules": unlayered,
        "upward": upward,
        "two_way": two_way,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO / "src" / "keelrl")
    parser.add_argument("--layers", type=Path, default=REPO / "docs" / "ARCHITECTURE.md")
    parser.add_argument("--list", action="store_true", help="also list the upward imports and two-way pairs")
    args = parser.parse_args()
    result = measure(args.root, read_layers(args.layers))
    if not args.list:
        result = {k: v for k, v in result.items() if k not in ("upward", "two_way")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
