"""The order a table's rows and fields are sent in, chosen so consecutive prompts share prefixes.

Contract: a table is rows of cells, each cell one field's rendered text ("name: value\\n"),
so the same cell text in two rows is the same prompt bytes. A `TablePlan` says, for every
input row, the order of its fields and how many of the leading ones are declared as shape
components, and the order the rows are sent in. Whatever the method, every input row appears
exactly once in `order`, and each row's `fields` is a permutation of its own field indices
(so a prompt holds exactly its row's fields). `prefix_share` is the figure the methods are
judged by: the weight (tokens, or characters) of the leading cells each row shares with the
row sent before it, summed.

Methods (`Method`): ORIGINAL (the table's order, fields as given); GGR (Liu et al., MLSys
2025, as published: `table_groups.ggr`); FABRIC (fabricctl's own: the best of GGR, two
greedy trees scored by the share itself and the pilot tree, whose small groups are split
by looking ahead (`table_pilot`), each sent in trie order: never below GGR; then, up to
`LOCAL_MAX_ROWS` rows, rows moved to better paths by `table_local`);
EXHAUSTIVE (the optimum, `table_search`, for tables of at most 8 rows x 4 fields: ValueError
past that). `shared[i]` follows `declared`. `learn_rule` gives the same plan at table scale
as an `OrderRule` (`table_rule`): learnt from a sample, applied row by row, rows sorted by key.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fabricctl.core.table_groups import (
    GroupNode,
    column_tree,
    field_ranking,
    ggr,
    memo_weight,
    walk,
)
from fabricctl.core.table_local import improve
from fabricctl.core.table_pilot import pilot
from fabricctl.core.table_rule import OrderRule, rule_from_tree
from fabricctl.core.table_search import exhaustive

__all__ = ["Method", "OrderRule", "TablePlan", "cell_text", "declared", "learn_rule",
           "plan_table", "prefix_share", "prompt_parts"]

LOCAL_MAX_ROWS = 200_000  # FABRIC's local improvement up to this many rows (a pass per row)

Row = Sequence[str]  # one row's cells, in the table's field order
Weight = Callable[[str], int]  # a cell's cost when recomputed: tokens, or characters


class Method(enum.Enum):
    """How a plan is chosen."""

    ORIGINAL = "original"
    GGR = "ggr"
    FABRIC = "fabric"
    EXHAUSTIVE = "exhaustive"


@dataclass(frozen=True, slots=True)
class TablePlan:
    """Rows to send in `order`; row i's cells go in `fields[i]` order, the first `shared[i]`
    of them declared as shape components (after the instruction)."""

    order: tuple[int, ...]
    fields: tuple[tuple[int, ...], ...]
    shared: tuple[int, ...]


def cell_text(name: str, value: str) -> str:
    """One field of a row as the prompt shows it (its name, so moving it changes no content)."""
    return f"{name}: {value}\n"


def prompt_parts(instruction: str, cells: Row, fields: Sequence[int], shared: int,
                 question: str = "") -> tuple[list[str], str]:
    """A row's native line parts: the prefix components (the instruction, then the first
    `shared` cells in `fields` order) and the prompt (the other cells, then `question`)."""
    ordered = [cells[f] for f in fields]
    return [instruction, *ordered[:shared]], "".join(ordered[shared:]) + question


def learn_rule(sample: Sequence[Row], weight: Weight = len, *,
               keep_field_order: bool = False) -> OrderRule:
    """The rule for a table too large to plan whole, learnt from `sample` (its first rows or a
    random sample): the group tree of FABRIC's plan of the sample (`table_rule`). With
    `keep_field_order` every row keeps the table's order and is sorted by its cells."""
    width = len(sample[0]) if sample else 0
    if keep_field_order or not sample:
        return OrderRule(field_order=tuple(range(width)))
    w = memo_weight(weight)
    ranking = field_ranking(sample, range(len(sample)), range(width), w)
    best = _fabric(sample, w, ranking)
    return rule_from_tree(best.tree, ranking)


def plan_table(rows: Sequence[Row], weight: Weight = len, *, method: Method = Method.FABRIC,
               keep_field_order: bool = False) -> TablePlan:
    """The plan `method` chooses for `rows` (with `keep_field_order`, every row's fields stay
    in the table's order and only the rows move: sorted by their cells, the optimum then;
    ORIGINAL moves nothing). `shared` is `declared` over the plan's order, 0 for ORIGINAL
    (the table as a user would send it: no cell declared)."""
    n = len(rows)
    table_order = [tuple(range(len(r))) for r in rows]
    if method is Method.ORIGINAL:
        return TablePlan(order=tuple(range(n)), fields=tuple(table_order),
                         shared=tuple(0 for _ in rows))
    w = memo_weight(weight)
    if keep_field_order:
        fields = table_order
        order = _trie_order(rows, fields)
    elif method is Method.EXHAUSTIVE:
        order, fields = exhaustive(rows, w)
        order = _trie_order(rows, fields)
    elif method is Method.GGR:
        order, fields = _tree_plan(rows, ggr(rows, w, squared=True))
    else:
        width = max((len(r) for r in rows), default=0)
        ranking = field_ranking(rows, range(n), range(width), w)
        cand = _fabric(rows, w, ranking)
        order, fields = cand.order, cand.fields
    return TablePlan(order=tuple(order), fields=tuple(fields),
                     shared=tuple(declared(rows, order, fields)))


@dataclass(slots=True)
class _Candidate:
    """Why: one tree FABRIC weighs, with the order it sends and the share that order gets."""

    tree: GroupNode
    order: list[int]
    fields: list[tuple[int, ...]]
    share: int


def _fabric(rows: Sequence[Row], w: Weight, ranking: tuple[int, ...]) -> _Candidate:
    """FABRIC: GGR as published, GGR scored by the objective itself (weight x (rows - 1)),
    the column tree (`table_groups`) and the pilot tree (`table_pilot`), each sent in the
    trie order of its field orders (never worse than the tree's own order); the one of the
    highest prefix share wins (ties: the first), so FABRIC's share is never below GGR's;
    then, up to `LOCAL_MAX_ROWS` rows, `table_local.improve` moves rows to better paths
    (kept only when the share rises)."""
    best: _Candidate | None = None
    for tree in (ggr(rows, w, squared=True), ggr(rows, w, squared=False, rest_order=ranking),
                 column_tree(rows, w, rest_order=ranking), pilot(rows, w, rest_order=ranking)):
        _, fields = _tree_plan(rows, tree)
        order = _trie_order(rows, fields)
        share = _share(rows, order, fields, w)
        if best is None or share > best.share:
            best = _Candidate(tree=tree, order=order, fields=fields, share=share)
    assert best is not None
    if len(rows) <= LOCAL_MAX_ROWS:
        fields = improve(rows, best.fields, w, ranking)
        order = _trie_order(rows, fields)
        share = _share(rows, order, fields, w)
        if share > best.share:
            best = _Candidate(tree=best.tree, order=order, fields=fields, share=share)
    return best


def _tree_plan(rows: Sequence[Row], tree: GroupNode) -> tuple[list[int], list[tuple[int, ...]]]:
    order: list[int] = []
    fields: list[tuple[int, ...]] = [() for _ in rows]
    walk(tree, (), fields, order)
    return order, fields


def _trie_order(rows: Sequence[Row], fields: Sequence[Sequence[int]]) -> list[int]:
    """Rows sorted by their cells in their own field order: the depth-first order of their
    trie, whose prefix share no other order of the same field orders beats."""
    return sorted(range(len(rows)), key=lambda r: [rows[r][f] for f in fields[r]])


def _lcps(rows: Sequence[Row], order: Sequence[int], fields: Sequence[Sequence[int]]
          ) -> list[int]:
    """Leading cells each row in `order` shares with the one before it (0 for the first)."""
    out = [0] * len(order)
    for k in range(1, len(order)):
        a, b = rows[order[k - 1]], rows[order[k]]
        fa, fb = fields[order[k - 1]], fields[order[k]]
        d = 0
        for x, y in zip(fa, fb, strict=False):
            if a[x] != b[y]:
                break
            d += 1
        out[k] = d
    return out


def _share(rows: Sequence[Row], order: Sequence[int], fields: Sequence[Sequence[int]],
           w: Weight) -> int:
    total = 0
    for k, d in enumerate(_lcps(rows, order, fields)):
        r = order[k]
        total += sum(w(rows[r][f]) for f in fields[r][:d])
    return total


def declared(rows: Sequence[Row], order: Sequence[int], fields: Sequence[Sequence[int]]
             ) -> list[int]:
    """How many leading cells each row (by index) declares as shape components: rows are
    grouped by the trie of their cells in `order`; a node's rows not declared deeper declare
    its depth when there are two or more of them, else they pass up to its parent (at the
    root: 0), so every declared prefix is held by two rows or more and a row declares no
    cell no other row holds. Capped at the row's fields - 1: a prompt keeps a cell."""
    n = len(order)
    lcp = _lcps(rows, order, fields)
    depth = [0] * n

    def go(lo: int, hi: int, d: int) -> list[int]:
        left: list[int] = []
        k = lo
        while k < hi:
            j = k + 1
            while j < hi and lcp[j] > d:
                j += 1
            if j - k == 1:
                left.append(k)
            else:
                left += go(k, j, min(lcp[k + 1:j]))
            k = j
        if len(left) >= 2:
            for p in left:
                depth[p] = d
            return []
        return left

    go(0, n, 0)
    out = [0] * n
    for p, r in enumerate(order):
        out[r] = max(0, min(depth[p], len(fields[r]) - 1))
    return out


def prefix_share(rows: Sequence[Row], plan: TablePlan, weight: Weight = len) -> int:
    """Sum over rows sent after the first of the weight of the leading cells (in each row's
    own field order) equal to the previous row's."""
    total = 0
    prev: list[str] = []
    for i in plan.order:
        cells = [rows[i][f] for f in plan.fields[i]]
        for a, b in zip(prev, cells, strict=False):
            if a != b:
                break
            total += weight(b)
        prev = cells
    return total
