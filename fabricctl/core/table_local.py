"""Local improvement of a plan's field orders: each row moved to the best path of the others.

Contract: `improve(rows, fields, w, ranking)` returns field orders whose trie share (sum over
trie nodes of weight x (rows - 1): what the rows get sent in trie order) is never below that
of `fields`. One pass takes each row out of the trie of all rows' field orders and puts it
back along the path of existing nodes whose cells it holds of the highest weight (a
depth-first search over its cells, at most `MAX_EXPANSIONS` nodes a row), its other fields
after it in `ranking` order, when that path beats the one it had; a move adds its new path's
weight and takes away its old one's, so every move raises the share. Passes repeat until
none moves a row or `rounds` are done. Cost: O(rows x fields) trie nodes, O(rows x
MAX_EXPANSIONS) a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_EXPANSIONS = 64

_Node = list  # [rows through it, {(field, cell): child}]


def _insert(root: _Node, row: Sequence[str], path: Sequence[int]) -> None:
    node = root
    for f in path:
        key = (f, row[f])
        child = node[1].get(key)
        if child is None:
            child = node[1][key] = [0, {}]
        child[0] += 1
        node = child


def _remove(root: _Node, row: Sequence[str], path: Sequence[int]) -> None:
    node = root
    for f in path:
        key = (f, row[f])
        child = node[1][key]
        child[0] -= 1
        if child[0] == 0:
            del node[1][key]
            return
        node = child


def _gain(root: _Node, row: Sequence[str], path: Sequence[int], w: Callable[[str], int]
          ) -> int:
    node, total = root, 0
    for f in path:
        child = node[1].get((f, row[f]))
        if child is None:
            break
        total += w(row[f])
        node = child
    return total


def _best(root: _Node, row: Sequence[str], w: Callable[[str], int]
          ) -> tuple[int, tuple[int, ...]]:
    best: tuple[int, tuple[int, ...]] = (0, ())
    budget = MAX_EXPANSIONS
    stack: list[tuple[_Node, int, tuple[int, ...]]] = [(root, 0, ())]
    while stack and budget > 0:
        node, total, path = stack.pop()
        budget -= 1
        if total > best[0]:
            best = (total, path)
        for f in range(len(row)):
            if f not in path:
                child = node[1].get((f, row[f]))
                if child is not None:
                    stack.append((child, total + w(row[f]), (*path, f)))
    return best


def improve(rows: Sequence[Sequence[str]], fields: Sequence[tuple[int, ...]],
            w: Callable[[str], int], ranking: Sequence[int], rounds: int = 2
            ) -> list[tuple[int, ...]]:
    """Field orders of a share at least that of `fields` (see the module docstring)."""
    out = list(fields)
    root: _Node = [0, {}]
    for r, row in enumerate(rows):
        _insert(root, row, out[r])
    for _ in range(rounds):
        moved = False
        for r, row in enumerate(rows):
            _remove(root, row, out[r])
            gain, path = _best(root, row, w)
            if gain > _gain(root, row, out[r], w):
                rest = [f for f in ranking if f not in path and f < len(row)]
                rest += [f for f in range(len(row)) if f not in path and f not in rest]
                out[r] = (*path, *rest)
                moved = True
            _insert(root, row, out[r])
        if not moved:
            break
    return out
