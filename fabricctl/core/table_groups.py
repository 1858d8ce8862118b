"""The greedy groupings of a table's rows: GGR as published and fabricctl's variants.

Contract: every function takes the table as rows of cells (the same cell text in two rows is
the same prompt bytes) and a cell weight, and returns a `GroupNode` tree: a node's rows
share its path of cells (one cell per level, each from a field its ancestors did not use);
its `children` come in the order they were chosen, each with at least two rows; its `rest`
rows share nothing past the node's path and go, after the children, in `rest_fields` order.
A row's field order is its path's fields, then the fields left in `rest_fields` order.

- `ggr` is Greedy Group Recursion (Liu et al., "Optimizing LLM Queries in Relational
  Workloads", MLSys 2025, Algorithm 1, without functional dependencies): in a sub-table,
  the (field, value) of highest HITCOUNT = len(value)^2 x (rows holding it - 1) (here the
  cell's weight squared; ties to the lowest field index, then the smallest value, as the
  published pseudocode's strict `>` over columns then sorted values), its rows split off
  and recursed on without that field, the other rows recursed on with all fields; one row:
  as it is; one field: rows sorted by it. It stops when no value is held by two rows (the
  published recursion peels such rows off one at a time: the same prefix share). The other
  rows' counts are kept up to date in place (a lazy max-heap), so a level costs
  O(rows x fields x log) instead of a rescan per group.
- `ggr(..., squared=False)` scores weight x (rows - 1): the objective itself.
- `column_tree` splits a node by the one field whose values are shared most (sum over its
  values of weight x (rows - 1)), every value of it at once, recursing on each group.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Cells = Sequence[Sequence[str]]
CellWeight = Callable[[str], int]


@dataclass(slots=True)
class GroupNode:
    """Why: one group of rows sharing a path of cells, so a plan and a rule read one tree."""

    field: int  # the field this node adds to its parent's path (-1 at the root)
    cell: str  # that field's cell text ("" at the root)
    rows: int  # how many rows this node's subtree holds
    children: list[GroupNode] = dataclasses.field(default_factory=list)
    rest: list[int] = dataclasses.field(default_factory=list)  # rows sharing nothing past the path
    rest_fields: tuple[int, ...] = ()  # the fields left, in the order the rest rows use


def memo_weight(weight: CellWeight) -> CellWeight:
    """`weight`, computed once per distinct cell text (a tokenizer is the costly case)."""
    seen: dict[str, int] = {}

    def w(cell: str) -> int:
        v = seen.get(cell)
        if v is None:
            v = seen[cell] = weight(cell)
        return v

    return w


def field_ranking(rows: Cells, ids: Sequence[int], fields: Sequence[int],
                  w: CellWeight) -> tuple[int, ...]:
    """`fields` by how much their values are shared among `ids` (sum of weight x (rows - 1)
    over values), most first, ties by index: the order for rows past the groups."""
    score = {}
    for f in fields:
        counts: dict[str, int] = {}
        for r in ids:
            c = rows[r][f]
            counts[c] = counts.get(c, 0) + 1
        score[f] = sum(w(c) * (n - 1) for c, n in counts.items())
    return tuple(sorted(fields, key=lambda f: (-score[f], f)))


def ggr(rows: Cells, w: CellWeight, *, squared: bool = True,
        rest_order: tuple[int, ...] | None = None) -> GroupNode:
    """The GGR tree of `rows` (see the module docstring); `rest_order` orders the fields of
    rows past the groups (default: the table's order, as published)."""
    width = len(rows[0]) if rows else 0
    order = rest_order if rest_order is not None else tuple(range(width))
    root = GroupNode(field=-1, cell="", rows=len(rows))
    _ggr(rows, list(range(len(rows))), [f for f in order], w, squared, root)
    return root


def _score(w: CellWeight, squared: bool, cell: str, n: int) -> int:
    x = w(cell)
    return (x * x if squared else x) * (n - 1)


def _ggr(rows: Cells, ids: list[int], cols: list[int], w: CellWeight, squared: bool,
         node: GroupNode) -> None:
    if not settled(rows, ids, cols, node):
        greedy_step(rows, ids, cols, w, node, squared=squared)


def settled(rows: Cells, ids: list[int], cols: list[int], node: GroupNode) -> bool:
    """Start a node of `ids` with `cols` left, and split it where there is no choice to make
    (one row or no field: all rest; one field: `one_field`); whether it is done."""
    node.rest_fields = tuple(cols)
    if len(ids) == 1 or not cols:
        node.rest = ids
        return True
    if len(cols) == 1:
        one_field(rows, ids, cols[0], node)
        return True
    return False


def one_field(rows: Cells, ids: list[int], c: int, node: GroupNode) -> None:
    """A node with one field left: its rows sorted by it (groups of equal cells)."""
    by: dict[str, list[int]] = {}
    for r in sorted(ids, key=lambda r: rows[r][c]):
        by.setdefault(rows[r][c], []).append(r)
    for cell, group in by.items():
        if len(group) >= 2:
            node.children.append(GroupNode(field=c, cell=cell, rows=len(group), rest=group))
        else:
            node.rest.extend(group)


Recurse = Callable[[list[int], list[int], GroupNode], None]  # (rows, fields left, child)


def greedy_step(rows: Cells, ids: list[int], cols: list[int], w: CellWeight, node: GroupNode,
                *, squared: bool, recurse: Recurse | None = None) -> None:
    """GGR's split of one node: groups of the highest score split off one at a time, each
    recursed on by `recurse` (default: GGR itself), the rows no group took left as `rest`."""
    counts: dict[tuple[int, str], int] = {}
    index: dict[tuple[int, str], list[int]] = {}
    for r in ids:
        row = rows[r]
        for c in cols:
            k = (c, row[c])
            n = counts.get(k)
            if n is None:
                counts[k] = 1
                index[k] = [r]
            else:
                counts[k] = n + 1
                index[k].append(r)
    heap = [(-_score(w, squared, k[1], n), k[0], k[1]) for k, n in counts.items() if n >= 2]
    heapq.heapify(heap)
    alive = dict.fromkeys(ids)
    while heap:
        neg, c, cell = heapq.heappop(heap)
        n = counts[(c, cell)]
        s = _score(w, squared, cell, n)
        if s != -neg:  # stale: rows holding it were taken by an earlier group
            if n >= 2:
                heapq.heappush(heap, (-s, c, cell))
            continue
        if s <= 0:
            break
        group = [r for r in index[(c, cell)] if r in alive]
        for r in group:
            del alive[r]
            row = rows[r]
            for c2 in cols:
                counts[(c2, row[c2])] -= 1
        child = GroupNode(field=c, cell=cell, rows=len(group))
        node.children.append(child)
        left = [x for x in cols if x != c]
        if recurse is None:
            _ggr(rows, group, left, w, squared, child)
        else:
            recurse(group, left, child)
    node.rest = list(alive)


def column_tree(rows: Cells, w: CellWeight, rest_order: tuple[int, ...] | None = None
                ) -> GroupNode:
    """The tree that splits each group by its most shared field, every value at once."""
    width = len(rows[0]) if rows else 0
    order = rest_order if rest_order is not None else tuple(range(width))
    root = GroupNode(field=-1, cell="", rows=len(rows))
    column_split(rows, list(range(len(rows))), list(order), w, root)
    return root


def column_split(rows: Cells, ids: list[int], cols: list[int], w: CellWeight,
                 node: GroupNode) -> None:
    """A node split by its most shared field, every value at once, each group recursed on."""
    node.rest_fields = tuple(cols)
    if len(ids) == 1 or not cols:
        node.rest = ids
        return
    best, best_score, best_groups = -1, 0, {}
    for c in cols:
        groups: dict[str, list[int]] = {}
        for r in ids:
            groups.setdefault(rows[r][c], []).append(r)
        s = sum(w(cell) * (len(g) - 1) for cell, g in groups.items())
        if s > best_score:
            best, best_score, best_groups = c, s, groups
    if best < 0:
        node.rest = ids
        return
    left = [x for x in cols if x != best]
    for cell, group in sorted(best_groups.items(), key=lambda kv: -len(kv[1])):
        if len(group) < 2:
            node.rest.extend(group)
            continue
        child = GroupNode(field=best, cell=cell, rows=len(group))
        node.children.append(child)
        column_split(rows, group, left, w, child)
    node.rest_fields = (best, *left) if node.rest else tuple(cols)


def walk(node: GroupNode, path: tuple[int, ...], fields: list[tuple[int, ...]],
         order: list[int]) -> None:
    """Rows of the tree in its order (each node's groups, then its rest), each row's field
    order written at its index."""
    if node.field >= 0:
        path = (*path, node.field)
    for child in node.children:
        walk(child, path, fields, order)
    tail = tuple(f for f in node.rest_fields if f not in path)
    for r in node.rest:
        order.append(r)
        fields[r] = (*path, *tail)
