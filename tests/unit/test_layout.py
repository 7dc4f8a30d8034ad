"""The layout promises of docs/ARCHITECTURE.md: short files, a loop on one screen, no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import keelrl

ROOT = Path(keelrl.__file__).parent
FILE_LIMIT, LOOP_LIMIT = 600, 300


def module_imports() -> dict[str, set[str]]:
    """keelrl module -> the keelrl modules it imports at import time (not inside functions, not under
    TYPE_CHECKING)."""
    names = {
        ".".join(("keelrl", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in ROOT.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found: set[str] = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if not isinstance(node, ast.Import | ast.ImportFrom | ast.If | ast.Try):
                continue  # imports inside functions run later, when the cycle is already resolved
            for n in ast.walk(node):
                if isinstance(n, ast.Import):
                    found |= {a.name for a in n.names}
                elif isinstance(n, ast.ImportFrom) and n.module:
                    found |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
        graph[name] = {d for d in found if d in names and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_no_file_over_the_limit_and_the_loop_fits_one_screen() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")
    }
    assert {f: n for f, n in sizes.items() if n > FILE_LIMIT} == {}
    assert sizes["loop/trainer.py"] <= LOOP_LIMIT


def test_no_import_cycles() -> None:
    assert find_cycle(module_imports()) is None


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
