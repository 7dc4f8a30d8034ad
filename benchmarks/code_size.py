"""Size of the package: physical lines, code lines (not blank, not a comment, not a docstring), the
largest files, and the files over the 600-line limit. Prints JSON.

    python benchmarks/code_size.py [src/keelrl]
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from pathlib import Path

LIMIT = 600


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding at least one token that is not a comment, a newline or part of a docstring."""
    skip = docstring_lines(ast.parse(source))
    ignored = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    seen: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in ignored or tok.type == tokenize.ENDMARKER:
            continue
        for line in range(tok.start[0], tok.end[0] + 1):
            if line not in skip:
                seen.add(line)
    return len(seen)


def main(root: str = "src/keelrl") -> dict:
    files = {}
    for path in sorted(Path(root).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        files[str(path.relative_to(root))] = (len(text.splitlines()), code_lines(text))
    largest = sorted(files.items(), key=lambda kv: -kv[1][0])[:10]
    return {
        "root": root,
        "files": len(files),
        "physical_lines": sum(p for p, _ in files.values()),
        "code_lines": sum(c for _, c in files.values()),
        "largest": {name: physical for name, (physical, _) in largest},
        "over_limit": {name: p for name, (p, _) in files.items() if p > LIMIT},
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:]), indent=2))
