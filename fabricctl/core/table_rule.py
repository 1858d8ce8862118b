"""The plan of a table too large to plan whole, as a rule each row is put through on its own.

Contract: `OrderRule` is a plan's group tree with its rows taken out (learnt from a sample by
`table_plan.learn_rule`). A row walks it from the root: at each node it joins the first
child, in the order the groups were chosen, whose field holds the child's cell in the row
(as the planner assigned a sample row to the first group that took it), and stops where
none does. `fields_for` is the fields of that path, then the others in the stopping node's
order (its fields ranked by how much the sample shared their values); `shared_for` the
path's length (groups of two or more sample rows), never the row's every cell, so a prompt
keeps a cell of its own; `key` the row's cells in that order. Sorting rows by `key` sends
them in the trie order of their field orders, which no other order of the same rows beats,
and keeps each group's rows together, whatever rows the sample missed. The rule holds only
the tree (bounded by the sample); a row costs O(path x fields) dict look-ups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fabricctl.core.table_groups import GroupNode


@dataclass(frozen=True, slots=True)
class RuleNode:
    """Why: one group of the learnt tree: the cells that lead into its subgroups."""

    field: int  # the field this group adds to the path (-1 at the root)
    cell: str  # that field's cell text
    children: tuple[RuleNode, ...]  # subgroups, in the order they were chosen
    rest_fields: tuple[int, ...]  # the order of the fields left, for a row stopping here
    index: dict[tuple[int, str], int]  # (field, cell) -> its child's position in `children`
    child_fields: tuple[int, ...]  # the fields the children split on

    def child_for(self, row: Sequence[str]) -> RuleNode | None:
        """The first-chosen child whose cell the row holds (None: the row stops here)."""
        pos = [p for f in self.child_fields if (p := self.index.get((f, row[f]))) is not None]
        return self.children[min(pos)] if pos else None


@dataclass(frozen=True, slots=True)
class OrderRule:
    """The plan at table scale, learnt from a sample: each row's field order, how many of its
    leading cells to declare, and a sort key; rows sorted by `key` go in the planned order."""

    field_order: tuple[int, ...]  # the order of a row that joins no group
    root: RuleNode | None = None  # the group tree (None: every row keeps `field_order`)

    def _path(self, row: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        node = self.root
        if node is None:
            return (), self.field_order
        path: list[int] = []
        while True:
            child = node.child_for(row)
            if child is None:
                return tuple(path), node.rest_fields
            path.append(child.field)
            node = child

    def fields_for(self, row: Sequence[str]) -> tuple[int, ...]:
        path, rest = self._path(row)
        taken = set(path)
        tail = [f for f in rest if f not in taken]
        tail += [f for f in range(len(row)) if f not in taken and f not in tail]
        return (*path, *tail)

    def shared_for(self, row: Sequence[str]) -> int:
        path, _ = self._path(row)
        return max(0, min(len(path), len(row) - 1))

    def key(self, row: Sequence[str]) -> tuple[str, ...]:
        return tuple(row[f] for f in self.fields_for(row))


def rule_from_tree(tree: GroupNode, field_order: tuple[int, ...]) -> OrderRule:
    """The rule of a planned tree: its groups, every stopping row in `field_order` (the
    fields ranked over the sample) after its path."""

    def node(n: GroupNode) -> RuleNode:
        kids = tuple(node(c) for c in n.children)
        return RuleNode(field=n.field, cell=n.cell, children=kids, rest_fields=field_order,
                        index={(c.field, c.cell): i for i, c in enumerate(kids)},
                        child_fields=tuple(dict.fromkeys(c.field for c in kids)))

    return OrderRule(field_order=field_order, root=node(tree))
