"""A model's shape state and its consumers' slots, and who may take a shape from whom.

Contract: `ModelState` is one model's shapes (open by signature, the current and warming
one in "model" scope), its epoch and switch counts, its consumers' `Slot`s ("consumer"
scope: each consumer's own current and warming shape), the shapes waiting for a holder and
its measured rate; `Holder` is what holds a current and a warming shape (a model or a
slot). For a consumer whose shape is exhausted, in "consumer" scope: `orphaned` names the
slots of departed consumers that still hold work (to adopt), `steal_target` the slot whose
warming shape waits while its consumer still has queued work of its own (the one with the
most tokens), and `join_target` another consumer's live shape with at least `join_multiple`
batch budgets queued (the one with the most tokens), worth one more prefill of its prefix.
`DISPATCHING` are the states a shape hands out batches in. `fabricctl.core.lifecycle`
decides with these; nothing here changes a shape.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from fabricctl.core.rate import RateMeter
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.waiting import Waiting

DISPATCHING = (ShapeState.ACTIVE, ShapeState.DRAINING)


@dataclass(slots=True)
class Slot:
    """Why: with shape_scope "consumer", each consumer drains its own current shape."""

    consumer: str
    current: Shape | None = None  # the active or draining shape this consumer pulls from
    warming: Shape | None = None  # the shape pre-warmed for this consumer
    runs: int = 0  # shapes this consumer has taken (activated, adopted or joined)
    batches: int = 0  # batches it pulled of its current shape since taking it (amortising)
    taken_at: float = 0.0  # when it took its current shape


@dataclass(slots=True)
class ModelState:
    """Why: the current shape is one field per model, so every consumer drains the same one
    (in "consumer" scope each consumer's `Slot` holds its own)."""

    name: str
    budget: int  # B: the model's batch token budget (largest registered contract)
    open: dict[int, Shape] = field(default_factory=dict)  # signature -> staged/warming/active
    current: Shape | None = None  # the active or draining shape consumers pull from
    warming: Shape | None = None
    epoch: int = 0
    switches: int = 0  # activations that replaced a previous shape
    midstream_switches: int = 0  # activations while the previous shape still had work
    slots: dict[str, Slot] = field(default_factory=dict)  # "consumer" scope: consumer -> slot
    waiting: Waiting = field(default_factory=Waiting)  # shapes with work and no holder
    meter: RateMeter = field(default_factory=RateMeter)  # its completed tokens per second
    preemptions: int = 0  # consumers that left a shape with work for a waiting one

    def holders(self, shape: Shape) -> list[str]:
        """Consumers whose current shape is `shape` ("consumer" scope)."""
        return [c for c, s in self.slots.items() if s.current is shape]


Holder = ModelState | Slot  # what holds a current and a warming shape: a model or a consumer


def orphaned(ms: ModelState, live: Container[str]) -> list[Slot]:
    """Slots of departed consumers that still hold work."""
    return [s for c, s in ms.slots.items() if c not in live and (
        (s.current is not None and s.current.items and s.current.state in DISPATCHING)
        or s.warming is not None)]


def steal_target(ms: ModelState, slot: Slot) -> Slot | None:
    """Another consumer's slot whose warming shape waits while that consumer still has
    queued work of its own (the one with the most tokens)."""
    best: Slot | None = None
    for s in ms.slots.values():
        w = s.warming
        if s is slot or w is None or s.current is None or not s.current.items:
            continue
        if best is None or w.tokens > best.warming.tokens:  # type: ignore[union-attr]
            best = s
    return best


def join_target(ms: ModelState, slot: Slot, join_multiple: float) -> Shape | None:
    """Another consumer's shape with enough queued tokens to amortise a prefill here."""
    best: Shape | None = None
    for s in ms.slots.values():
        shape = s.current
        if s is slot or shape is None or shape is slot.current:
            continue
        worth = shape.tokens >= join_multiple * ms.budget
        more = best is None or shape.tokens > best.tokens
        if worth and more and shape.state in DISPATCHING:
            best = shape
    return best
