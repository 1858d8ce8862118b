"""The group tree chosen by looking ahead: each split tried, the rest of the tree rolled out.

Contract: `pilot(rows, w)` returns a `GroupNode` tree (as `table_groups` defines it). A node
of at most `max_cells` cells (rows x fields left) is split by the pilot method (Duin and
Voss, 1999): among the rows not yet grouped, the `candidates` (field, cell) groups of the
highest weight x (rows - 1) are tried: each whole, each after another of another field
(less the rows that one took), and each one's field split by all its cells at once; a
split is scored by its groups' weight x (rows - 1) plus a rollout of each group (without
its field) and of the rows left, and the best is taken and recursed on, until no cell is
held by two rows left. A rollout is the better of the greedy tree on the objective
(`table_groups.greedy_step`) and the column tree; for a group of at most `NESTED_ROWS` rows
it is a pilot tree itself (rolled out by those two), since the greedy's first choice
inside a small group is its costliest mistake. A larger node is split as the greedy one
(`ggr` on the objective), so a table's upper levels cost what GGR's do and the pilot
refines the groups below. No bound is promised against the greedy tree: `table_plan`'s
FABRIC keeps the best of its candidate trees. Rollouts are memoised on (rows, fields)
while a node the pilot splits is being split, so memory stays that of one such node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fabricctl.core.table_groups import (
    Cells,
    CellWeight,
    GroupNode,
    column_split,
    greedy_step,
    settled,
)

PILOT_CELLS = 64  # nodes of at most this many cells (rows x fields left) take the pilot
CANDIDATES = 6  # groups tried at each step of the pilot
NESTED_ROWS = 8  # a group tried of at most this many rows is rolled out by a pilot itself


def pilot(rows: Cells, w: CellWeight, rest_order: tuple[int, ...] | None = None, *,
          max_cells: int = PILOT_CELLS, candidates: int = CANDIDATES) -> GroupNode:
    """The pilot tree of `rows` (see the module docstring); `rest_order` orders the fields
    of rows past the groups (default: the table's order)."""
    width = len(rows[0]) if rows else 0
    order = rest_order if rest_order is not None else tuple(range(width))
    root = GroupNode(field=-1, cell="", rows=len(rows))
    _Pilot(rows, w, max_cells, candidates).split(list(range(len(rows))), list(order), root)
    return root


def tree_share(node: GroupNode, w: CellWeight) -> int:
    """The share a tree's groups promise: weight x (rows - 1) of every node below the root."""
    return sum(w(c.cell) * (c.rows - 1) + tree_share(c, w) for c in node.children)


_Group = tuple[tuple[int, str], list[int]]  # a group tried: its (field, cell) and its rows


@dataclass
class _Pilot:
    """Why: one table's pilot, with the rollouts it has made in the node being split (a group
    is tried again at every step until one is split off)."""

    rows: Cells
    w: CellWeight
    max_cells: int
    candidates: int
    rolled: dict[tuple[frozenset[int], tuple[int, ...], bool], int] = field(
        default_factory=dict)  # the rollouts of the pilot node being split (then cleared)
    depth: int = 0  # pilot splits under way (nested ones included)

    def split(self, ids: list[int], cols: list[int], node: GroupNode, nested: bool = True
              ) -> None:
        rows, w = self.rows, self.w
        if settled(rows, ids, cols, node):
            return
        if len(ids) * len(cols) > self.max_cells:
            greedy_step(rows, ids, cols, w, node, squared=False,
                        recurse=lambda g, left, child: self.split(g, left, child, nested))
            return
        self.depth += 1
        alive = list(ids)
        while True:
            index = _groups(rows, alive, cols)
            tried = sorted(((w(k[1]) * (len(g) - 1), k) for k, g in index.items()
                            if len(g) >= 2), key=lambda t: (-t[0], t[1]))[:self.candidates]
            if not tried:
                break
            best: tuple[int, list[_Group]] | None = None
            for trial in _trials(index, [k for _, k in tried]):
                taken = {r for _, g in trial for r in g}
                value = self.rollout([r for r in alive if r not in taken], cols, False)
                for (f, cell), group in trial:
                    value += (w(cell) * (len(group) - 1)
                              + self.rollout(group, [x for x in cols if x != f], nested))
                if best is None or value > best[0]:
                    best = (value, trial)
            assert best is not None
            for (f, cell), group in best[1]:
                taken = set(group)
                alive = [r for r in alive if r not in taken]
                child = GroupNode(field=f, cell=cell, rows=len(group))
                node.children.append(child)
                self.split(group, [x for x in cols if x != f], child, nested)
        node.rest = alive
        self.depth -= 1
        if self.depth == 0:  # its rollouts hold its rows only: no other node asks for them
            self.rolled.clear()

    def rollout(self, ids: list[int], cols: list[int], nested: bool) -> int:
        """What the rows' own tree would share: the better of the greedy one on the
        objective and the column tree, or with `nested`, for at most `NESTED_ROWS` rows, a
        pilot tree rolled out by those two (a greedy first choice inside a group is the
        costliest mistake)."""
        if len(ids) < 2 or not cols:
            return 0
        nested = nested and len(ids) <= NESTED_ROWS
        key = (frozenset(ids), tuple(cols), nested)
        done = self.rolled.get(key)
        if done is not None:
            return done
        if nested:
            node = GroupNode(field=-1, cell="", rows=len(ids))
            self.split(ids, cols, node, nested=False)
            share = tree_share(node, self.w)
        else:
            greedy = GroupNode(field=-1, cell="", rows=len(ids))
            greedy_step(self.rows, ids, cols, self.w, greedy, squared=False)
            column = GroupNode(field=-1, cell="", rows=len(ids))
            column_split(self.rows, ids, cols, self.w, column)
            share = max(tree_share(greedy, self.w), tree_share(column, self.w))
        self.rolled[key] = share
        return share


def _groups(rows: Cells, ids: Sequence[int], cols: Sequence[int]
            ) -> dict[tuple[int, str], list[int]]:
    index: dict[tuple[int, str], list[int]] = {}
    for r in ids:
        for c in cols:
            index.setdefault((c, rows[r][c]), []).append(r)
    return index


def _trials(index: dict[tuple[int, str], list[int]], keys: list[tuple[int, str]]
            ) -> list[list[_Group]]:
    """The splits tried: each candidate group's rows; another candidate of another field
    whole, then the first's rows less its own (the rows both hold go with the one chosen
    first, as a row walking `table_rule`'s tree does); and each candidate's field split by
    all its cells at once (as `column_split` does)."""
    out = [[(k, index[k])] for k in keys]
    for k in keys:
        for j in keys:
            if j[0] != k[0]:
                other = set(index[j])
                sub = [r for r in index[k] if r not in other]
                if 2 <= len(sub) < len(index[k]):
                    out.append([(j, index[j]), (k, sub)])
    for f in dict.fromkeys(k[0] for k in keys):
        whole = [(k, g) for k, g in index.items() if k[0] == f and len(g) >= 2]
        if len(whole) >= 2:
            out.append(sorted(whole, key=lambda kg: -len(kg[1])))
    return out
