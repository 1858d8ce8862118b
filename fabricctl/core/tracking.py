"""Where work is: an item's placement, a batch in flight, what a consumer holds.

Contract: the records the broker's parts hand each other, and nothing that acts on them.
`Placement` (shape, lane) is an item's lane assignment before it is admitted; `InFlight` is a
batch out with a consumer, with the shape and lane it settles into; `ConsumerState` is a
registered consumer, the batches it holds and what it has done. `guard_signature` raises
`ShapeGuardError` when an entry of a batch belongs to another shape (a BaseException, so no
`except Exception` hides it); `UnknownBatchError` (a KeyError) names a batch that is not in
flight. This module imports no part of the broker, so every part may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricctl.core.lanes import Lane
from fabricctl.core.shape import Shape
from fabricctl.core.types import Batch, Contract

__all__ = ["ConsumerState", "InFlight", "Placement", "ShapeGuardError", "UnknownBatchError",
           "guard_signature"]


class ShapeGuardError(BaseException):
    """Why: a batch would feed an engine an item of another shape: stop, not poison a cache."""


class UnknownBatchError(KeyError):
    """Why: a completion names a batch that is not in flight (settled already, or never sent)."""


def guard_signature(expected: int, got: int, where: str) -> None:
    """The hard guard: every entry of a batch must carry the batch's signature."""
    if expected != got:
        raise ShapeGuardError(
            f"shape guard: {where} has signature {got:016x}, expected {expected:016x}"
        )


@dataclass(slots=True)
class ConsumerState:
    """Why: batches in flight must return to their lanes when their consumer goes away."""

    name: str
    contract: Contract
    joined: float
    batches: set[int] = field(default_factory=set)
    batches_done: int = 0
    items_done: int = 0
    tokens_done: int = 0
    serving: str = ""  # the name it pulls from now (of several: `core.serving`)
    name_switches: int = 0  # moves from one of its names to another (each a shape switch)

    def __post_init__(self) -> None:
        if not self.serving:
            self.serving = self.contract.model


@dataclass(slots=True)
class Placement:
    """Why: the durable path assigns first and writes second; this is the assignment."""

    shape: Shape
    lane: Lane


@dataclass(slots=True)
class InFlight:
    """Why: a batch out with a consumer, with the shape and lane it must settle into."""

    batch: Batch
    shape: Shape
    lane: Lane
