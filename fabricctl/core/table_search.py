"""The exact optimum of a tiny table's prefix share, over row orders and per-row field orders.

Contract: `exhaustive(rows, w)` returns the row order and each row's field order of a plan of
the highest prefix share (the weight of the leading cells each row shares with the row
before it, summed), or raises ValueError past `MAX_ROWS` rows or `MAX_FIELDS` fields.
It searches the trie a plan sends its rows along: sent in trie order, rows below a node of
weight x share it x (rows - 1) times, and no order does better for the same field orders, so
OPT(rows, fields left) = the best split of the rows into groups, each by a cell all its rows
hold in one of the fields left, of sum(weight x (group - 1) + OPT(group, fields - that one)).
The lowest row either goes alone (it shares nothing here) or joins a group through one of
its cells with some subset of the rows holding that cell; memoised on (rows, fields).
Two groups by the same cell can come out of it: sent next to each other they share at least
what was counted, and merging them is never worse, so the maximum is the true optimum.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

MAX_ROWS = 8
MAX_FIELDS = 4

Split = tuple[tuple[int, frozenset[int]], ...]  # (field, rows) groups; rows alone left out


def exhaustive(rows: Sequence[Sequence[str]], w: Callable[[str], int]
               ) -> tuple[list[int], list[tuple[int, ...]]]:
    """(order, fields per row) of an optimal plan (see the module docstring)."""
    width = max((len(r) for r in rows), default=0)
    if len(rows) > MAX_ROWS or width > MAX_FIELDS:
        raise ValueError(f"an exhaustive search takes at most {MAX_ROWS} rows of "
                         f"{MAX_FIELDS} fields (got {len(rows)} x {width})")
    memo: dict[tuple[frozenset[int], frozenset[int]], tuple[int, Split]] = {}

    def best(ids: frozenset[int], cols: frozenset[int]) -> tuple[int, Split]:
        if len(ids) < 2 or not cols:
            return 0, ()
        key = (ids, cols)
        hit = memo.get(key)
        if hit is not None:
            return hit
        r = min(ids)
        others = ids - {r}
        value, split = best(others, cols)  # r alone
        for c in sorted(cols):
            mates = sorted(x for x in others if rows[x][c] == rows[r][c])
            for k in range(1, len(mates) + 1):
                for pick in itertools.combinations(mates, k):
                    group = frozenset((r, *pick))
                    inner, _ = best(group, cols - {c})
                    outer, outer_split = best(ids - group, cols)
                    v = w(rows[r][c]) * k + inner + outer
                    if v > value:
                        value, split = v, ((c, group), *outer_split)
        memo[key] = (value, split)
        return value, split

    order: list[int] = []
    fields: list[tuple[int, ...]] = [() for _ in rows]

    def emit(ids: frozenset[int], cols: frozenset[int], path: tuple[int, ...]) -> None:
        _, split = best(ids, cols)
        grouped: set[int] = set()
        for c, group in sorted(split, key=lambda g: rows[min(g[1])][g[0]]):
            grouped |= group
            emit(group, cols - {c}, (*path, c))
        for x in sorted(ids - grouped):
            order.append(x)
            fields[x] = (*path, *sorted(cols))

    emit(frozenset(range(len(rows))), frozenset(range(width)), ())
    return order, fields
