"""The exception tree: one home, every class documented, one exit code per cause.

Promises checked: outside `fabricctl/core` no code raises (or re-raises) a bare
`ValueError`, `RuntimeError` or `KeyError`; every `FabricError` subclass is defined in
`fabricctl/errors.py` and nowhere else; the tree in ARCHITECTURE.md ("Errors") lists every
class with the exit code it has; the causes that differ (usage, backend missing, timeout, engine,
launch) have distinct codes, and `ExitCode`, the README's "Exit status" table and the man
pages' list name the same codes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fabricctl import errors
from fabricctl.errors import (
    BackendMissing,
    EngineError,
    ExitCode,
    FabricError,
    FabricTimeout,
    LaunchError,
    UsageError,
    exit_code_of,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fabricctl"
CORE = PACKAGE / "core"
BARE = {"ValueError", "RuntimeError", "KeyError"}


def outside_core() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if CORE not in p.parents)


def _names(node: ast.expr | None) -> set[str]:
    """The exception names an `except` clause's type (a name or a tuple of names) gives."""
    if node is None:
        return set()
    if isinstance(node, ast.Tuple):
        return {n for e in node.elts for n in _names(e)}
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _raised(node: ast.expr) -> str | None:
    """The class name a `raise X(...)` or `raise X` names, else None."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def bare_raises(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every raise of a bare ValueError/RuntimeError/KeyError: by name, or
    re-raised from an `except` clause that catches one (`raise`, `raise e`)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, caught: set[str], bound: dict[str, set[str]]) -> None:
        if isinstance(node, ast.Raise):
            if node.exc is None:
                hit = caught & BARE
                if hit:
                    found.append((node.lineno, f"raise (re-raises {', '.join(sorted(hit))})"))
            elif isinstance(node.exc, ast.Name) and node.exc.id in bound:
                hit = bound[node.exc.id] & BARE
                if hit:
                    found.append((node.lineno, f"raise {node.exc.id} (a {', '.join(hit)})"))
            elif _raised(node.exc) in BARE:
                found.append((node.lineno, f"raise {_raised(node.exc)}"))
        if isinstance(node, ast.ExceptHandler):
            kinds = _names(node.type)
            inner = dict(bound)
            if node.name:
                inner[node.name] = kinds
            for child in node.body:
                visit(child, kinds, inner)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            caught, bound = set(), {}  # a nested function re-raises nothing of ours
        for child in ast.iter_child_nodes(node):
            visit(child, caught, bound)

    visit(tree, set(), {})
    return found


def test_no_bare_value_runtime_or_key_error_leaves_a_module_outside_core() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{line}: {what}"
                 for p in outside_core()
                 for line, what in bare_raises(ast.parse(p.read_text(), str(p)))]
    assert offenders == [], "raise a class of fabricctl.errors instead:\n" + "\n".join(offenders)


def test_the_scan_finds_each_kind_of_bare_raise() -> None:
    source = """
def f(x):
    if x:
        raise ValueError("bad")
    try:
        g()
    except (KeyError, OSError):
        raise
    try:
        g()
    except RuntimeError as e:
        raise e
    try:
        g()
    except ValueError as e:
        raise UsageError(str(e)) from None
"""
    assert [line for line, _ in bare_raises(ast.parse(source))] == [4, 8, 12]


TREE_NAMES = {name for name, obj in vars(errors).items()
              if isinstance(obj, type) and issubclass(obj, FabricError)}


def test_every_fabric_error_is_defined_in_errors_py() -> None:
    for name in TREE_NAMES:
        assert getattr(errors, name).__module__ == "fabricctl.errors", name
    elsewhere = []
    for p in outside_core():
        if p == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ClassDef) and {_raised(b) for b in node.bases} & TREE_NAMES:
                elsewhere.append(f"{p.relative_to(ROOT)}:{node.lineno}: class {node.name}")
    assert elsewhere == [], "move these into fabricctl/errors.py:\n" + "\n".join(elsewhere)


def documented_tree() -> dict[str, int | None]:
    """Each class ARCHITECTURE.md's tree ("Errors") lists, with the exit code it states (None:
    its parent's)."""
    doc = (ROOT / "ARCHITECTURE.md").read_text().split("\n## Errors\n", 1)[1].split("\n## ")[0]
    out: dict[str, int | None] = {}
    for m in re.finditer(r"^[│├└─ ]*(\w+)\s+(?:\(exit (\d+)\))?", doc, re.M):
        name, code = m.group(1), m.group(2)
        if name in TREE_NAMES:
            out[name] = int(code) if code else None
    return out


def test_the_documented_tree_lists_every_class_with_its_exit_code() -> None:
    tree = documented_tree()
    assert set(tree) == TREE_NAMES
    for name, code in tree.items():
        cls = getattr(errors, name)
        if code is None:  # a subclass listed under its parent, with the parent's code
            parent = cls.__mro__[1]
            assert cls.exit_code == parent.exit_code, name
        else:
            assert cls.exit_code == code, name


def test_causes_that_differ_have_distinct_exit_codes() -> None:
    causes = [FabricError, UsageError, BackendMissing, FabricTimeout, EngineError, LaunchError]
    codes = [c.exit_code for c in causes]
    assert len(set(codes)) == len(codes), dict(zip(causes, codes, strict=True))
    assert len({int(c) for c in ExitCode}) == len(ExitCode)
    assert EngineError.exit_code == ExitCode.ENGINE_FAILED == 5
    assert LaunchError.exit_code == ExitCode.LAUNCH_FAILED == 6


def test_readme_and_man_pages_name_every_exit_code() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("### Exit status", 1)[1].split("\n\n", 2)[1]
    in_readme = [int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)]
    assert in_readme == sorted(int(c) for c in ExitCode)
    page = (ROOT / "man" / "fabricctl.1").read_text()
    for code in ExitCode:
        assert f"\\fB{int(code)}\\fR\n" in page, code


@pytest.mark.parametrize(("exc", "code"), [
    (UsageError("x"), 2), (BackendMissing("x"), 3), (FabricTimeout("x"), 4),
    (EngineError("x"), 5), (LaunchError("x"), 6), (FabricError("x"), 1),
    (KeyboardInterrupt(), 130), (ValueError("a bug"), 1),
])
def test_exit_code_of(exc: BaseException, code: int) -> None:
    assert exit_code_of(exc) == code
