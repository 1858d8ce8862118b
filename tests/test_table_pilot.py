"""The pilot tree (fabricctl.core.table_pilot): its groups are real, it keeps its promise, and
it finds the splits the greedy trees miss, on rows taken from the bench's real tables."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_table_plan import tables

from fabricctl.core.table_groups import GroupNode, ggr, walk
from fabricctl.core.table_pilot import pilot, tree_share
from fabricctl.core.table_plan import Method, TablePlan, cell_text, plan_table, prefix_share


def table(names: str, text: str) -> list[list[str]]:
    """Rows of cells from a header of names and one line of values a row."""
    return [[cell_text(n, v) for n, v in zip(names.split(), line.split(), strict=True)]
            for line in text.strip().splitlines()]


def trie_share(rows: list[list[str]], tree: GroupNode) -> int:
    """The prefix share of the tree's field orders, the rows sent in trie order."""
    order: list[int] = []
    fields: list[tuple[int, ...]] = [() for _ in rows]
    walk(tree, (), fields, order)
    order = sorted(range(len(rows)), key=lambda r: [rows[r][f] for f in fields[r]])
    return prefix_share(rows, TablePlan(order=tuple(order), fields=tuple(fields),
                                        shared=tuple(0 for _ in rows)))


def groups_hold_their_cells(rows: list[list[str]], node: GroupNode, path: tuple[int, ...],
                            cells: tuple[str, ...]) -> list[int]:
    """Every row below `node` (returned) holds its path's cells; children have 2 rows +."""
    if node.field >= 0:
        path, cells = (*path, node.field), (*cells, node.cell)
    below = list(node.rest)
    for child in node.children:
        assert child.rows >= 2
        below += groups_hold_their_cells(rows, child, path, cells)
    for r in below:
        assert tuple(rows[r][f] for f in path) == cells
    assert len(below) == node.rows
    return below


@settings(max_examples=80, deadline=None)
@given(tables(max_rows=14, max_fields=5))
def test_every_row_once_and_every_group_holds_its_cells(rows: list[list[str]]) -> None:
    tree = pilot(rows, len)
    assert sorted(groups_hold_their_cells(rows, tree, (), ())) == list(range(len(rows)))


@settings(max_examples=80, deadline=None)
@given(tables(max_rows=14, max_fields=5), st.integers(0, 64))
def test_the_rows_sent_in_trie_order_share_what_the_tree_promises(rows: list[list[str]],
                                                                  cells: int) -> None:
    tree = pilot(rows, len, max_cells=cells)  # 0: the greedy split at every node
    assert trie_share(rows, tree) >= tree_share(tree, len)


def test_a_group_of_part_of_a_cells_rows() -> None:
    # 5 rows are "size: L" and 4 "type: classic", hawaiian both: the optimum groups the 4
    # other L rows and the 4 classic ones (hawaiian with the classics); taking every L row
    # leaves 3 classics, and grouping by type first splits the L rows in three
    rows = table("type size time name", """
chicken L 18:18:11 bbq_ckn
chicken L 18:27:28 cali_ckn
classic L 18:18:11 hawaiian
classic L 18:53:07 ital_cpcllo
classic S 18:17:26 napolitana
classic S 18:18:11 pepperoni
veggie L 18:15:22 four_cheese
veggie L 18:27:28 five_cheese
""")
    best = prefix_share(rows, plan_table(rows, method=Method.EXHAUSTIVE))
    assert best == 109
    assert tree_share(ggr(rows, len, squared=False), len) < best
    assert tree_share(pilot(rows, len), len) == best
    assert prefix_share(rows, plan_table(rows)) == best


def test_a_small_group_is_looked_into_before_it_is_chosen() -> None:
    # inside "type: veggie" the greedy takes the longest shared cell (the two green_garden
    # rows: 19 characters) and shares nothing more; two pairs by time and by price share 27,
    # which makes veggie (39 + 27) worth more than the time groups a greedy look-in prefers
    rows = table("time type name price", """
17:11:27 chicken cali_ckn 16.75
17:11:27 veggie four_cheese 17.95
17:11:27 veggie green_garden 12.0
17:36:59 classic hawaiian 13.25
17:36:59 veggie spinach_fet 16.0
17:55:58 chicken thai_ckn 20.75
17:55:58 classic pep_msh_pep 14.5
17:55:58 veggie green_garden 16.0
""")
    best = prefix_share(rows, plan_table(rows, method=Method.EXHAUSTIVE))
    assert best == 94
    assert prefix_share(rows, plan_table(rows, method=Method.GGR)) < best
    assert tree_share(pilot(rows, len), len) == best
    assert tree_share(pilot(rows, len, candidates=1), len) < best  # no look-ahead: greedy
