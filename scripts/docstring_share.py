"""Count the docstring share of fabricctl's code, and the module docstrings over a limit.

Usage: `python scripts/docstring_share.py [--limit 25] [--list] [ROOT]` (ROOT: the package
directory, `fabricctl/` of this checkout by default). Prints the lines of every docstring
(module, class and function, counted from the opening to the closing quotes) against every
line of every `.py` file under ROOT, and how many module docstrings are longer than `--limit`
lines (`--list` names them, longest first). The same count `tests/test_docs_figures.py`
holds the modules to.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "fabricctl"


@dataclass(frozen=True)
class FileCount:
    """Why: one module's lines, its docstrings' lines and its module docstring's length."""

    path: Path
    lines: int
    docstring_lines: int
    module_docstring_lines: int


def _doc_lines(node: ast.AST) -> int:
    """Lines of `node`'s docstring expression, 0 when it has none."""
    body = getattr(node, "body", None)
    if not body or not isinstance(body[0], ast.Expr):
        return 0
    value = body[0].value
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return 0
    return (value.end_lineno or value.lineno) - value.lineno + 1


def count_file(path: Path) -> FileCount:
    """The counts of one module."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    docs = sum(_doc_lines(n) for n in ast.walk(tree) if isinstance(
        n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef))
    return FileCount(path, len(text.splitlines()), docs, _doc_lines(tree))


def count_tree(root: Path = ROOT) -> list[FileCount]:
    """The counts of every module under `root`, in path order."""
    return [count_file(p) for p in sorted(root.rglob("*.py"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", type=Path, default=ROOT)
    ap.add_argument("--limit", type=int, default=25, help="module docstring lines allowed")
    ap.add_argument("--list", action="store_true", help="name the modules over the limit")
    args = ap.parse_args(argv)
    counts = count_tree(args.root)
    lines = sum(c.lines for c in counts)
    docs = sum(c.docstring_lines for c in counts)
    over = sorted((c for c in counts if c.module_docstring_lines > args.limit),
                  key=lambda c: -c.module_docstring_lines)
    print(f"docstrings: {docs:,} of {lines:,} lines ({docs / max(1, lines):.1%}) "
          f"in {len(counts)} modules")
    print(f"module docstrings over {args.limit} lines: {len(over)}")
    if args.list:
        for c in over:
            print(f"  {c.module_docstring_lines:4d}  {c.path.relative_to(args.root.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
