"""Withdrawal: queued entries taken out of their lanes unrun (a job cancelled or expired).

Contract: `withdraw(shapes, ledger, pick)` removes from the lanes of `shapes` every queued
entry `pick` accepts (never one in flight: those are not in a lane) and returns them with
the shape and lane they left, in queue order per lane; the ledger books them out as it books
a dispatch (queued -> in flight), so received = routed + queued holds while the store
commits their outcome. Then `settle_withdrawn(ledger, withdrawn)` completes them in the
ledger (their outcome, an error result, is durable), or `return_withdrawn(place, ledger,
withdrawn, now)` puts them back at the front of their lanes (the commit failed; a lane or
shape retired meanwhile: the key's open shape, through the broker's placement rule), as a
failed batch goes back. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fabricctl.core.lanes import Lane
from fabricctl.core.ledger import Ledger
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.tracking import Placement
from fabricctl.core.types import Entry

Withdrawn = tuple[Shape, Lane, Entry]
Place = Callable[[str, int, str, int, float], Placement]  # (model, sig, label, tokens, now)


def withdraw(shapes: Iterable[Shape], ledger: Ledger, pick: Callable[[Entry], bool]
             ) -> list[Withdrawn]:
    """Take every queued entry `pick` accepts out of the lanes of `shapes`."""
    out: list[Withdrawn] = []
    items = tokens = 0
    for shape in shapes:
        for lane in list(shape.lanes.lanes.values()):
            if not lane.queue:
                continue
            for e in lane.queue.retain(lambda e: not pick(e)):
                out.append((shape, lane, e))
                lane.tokens -= e.tokens
                shape.tokens -= e.tokens
                shape.items -= 1
                shape.count_job(e.job, -1, -e.tokens)
                items += 1
                tokens += e.tokens
    if items:
        ledger.dispatch(items, tokens)
    return out


def settle_withdrawn(ledger: Ledger, withdrawn: list[Withdrawn]) -> None:
    """Their outcome is durable: the ledger counts them completed."""
    if withdrawn:
        ledger.complete(len(withdrawn), sum(e.tokens for _, _, e in withdrawn))


def _live(shape: Shape, lane: Lane) -> bool:
    return (shape.state is not ShapeState.FINISHED
            and shape.lanes.lanes.get(lane.id) is lane)


def return_withdrawn(place: Place, ledger: Ledger, withdrawn: list[Withdrawn], now: float
                     ) -> None:
    """Put withdrawn entries back at the front of their lanes, in their order."""
    if not withdrawn:
        return
    by_lane: dict[int, tuple[Shape, Lane, list[Entry]]] = {}
    for shape, lane, e in withdrawn:
        if not _live(shape, lane):
            p = place(shape.model, shape.signature, shape.label, e.tokens, now)
            shape, lane = p.shape, p.lane
        slot = by_lane.setdefault(id(lane), (shape, lane, []))
        slot[2].append(e)
    items = tokens = 0
    for shape, lane, entries in by_lane.values():
        lane.push_front(entries)
        t = sum(e.tokens for e in entries)
        shape.tokens += t
        shape.items += len(entries)
        shape.count_jobs(entries, 1)
        if shape.staged_since is None:
            shape.staged_since = min(e.t for e in entries)
        items += len(entries)
        tokens += t
    ledger.requeue(items, tokens)
