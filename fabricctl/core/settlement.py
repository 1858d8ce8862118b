"""Settlement: how a batch in flight ends (completed, failed back, split).

Contract: `complete(batch_id, now)` settles a batch and returns it (the store tombstones its
entries); `fail(batch_id, now)` puts its entries back at the front of their lane (into the
key's open shape when its own shape finished dispatching); `split(batch_id, indexes)` moves
some entries of an in-flight batch into a batch of their own. A batch that is not in flight
raises `UnknownBatchError`. A lane left idle by a settlement is released when it was
quiescing or its shape is draining. `Broker` inherits this and owns the state it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.types import Batch

if TYPE_CHECKING:
    from fabricctl.core.broker import Placement
    from fabricctl.core.lanes import Lane
    from fabricctl.core.ledger import Ledger


class UnknownBatchError(KeyError):
    """A completion names a batch that is not in flight (already settled or never sent)."""


@dataclass(slots=True)
class InFlight:
    """Why: a batch out with a consumer, with the shape and lane it must settle into."""

    batch: Batch
    shape: Shape
    lane: Lane


class Settlement:
    """Why: ending a batch touches lanes, shapes, consumers and the ledger at once."""

    inflight: dict[int, InFlight]
    consumers: dict[str, Any]
    ledger: Ledger
    padded_tokens: int
    routed_tokens: int
    _next_batch: int

    def place(self, model: str, signature: int, label: str, tokens: int, now: float
              ) -> Placement:
        raise NotImplementedError

    def _settle(self, batch_id: int) -> InFlight:
        f = self.inflight.pop(batch_id, None)
        if f is None:
            raise UnknownBatchError(batch_id)
        b = f.batch
        f.lane.inflight -= 1
        f.shape.inflight_tokens -= b.tokens
        f.shape.inflight_items -= len(b.entries)
        c = self.consumers.get(b.consumer)
        if c is not None:
            c.batches.discard(batch_id)
        return f

    def complete(self, batch_id: int, now: float) -> Batch:
        """A consumer finished a batch; returns it so the store can tombstone its entries."""
        f = self._settle(batch_id)
        b = f.batch
        self.ledger.complete(len(b.entries), b.tokens)
        c = self.consumers.get(b.consumer)
        if c is not None:
            c.batches_done += 1
            c.items_done += len(b.entries)
            c.tokens_done += b.tokens
        self._after_settle(f, now)
        return b

    def fail(self, batch_id: int, now: float) -> Batch:
        """A batch came back undone: its entries return to the front of their lane."""
        f = self._settle(batch_id)
        b = f.batch
        if f.shape.state is ShapeState.FINISHED:
            self._after_settle(f, now)
            f = self._reopen(f, now)  # its shape finished dispatching: back to staging
        f.lane.push_front(b.entries)
        f.shape.tokens += b.tokens
        f.shape.items += len(b.entries)
        f.shape.batches -= 1
        f.shape.padded_tokens -= len(b.entries) * b.pad_to
        f.shape.routed_tokens -= b.tokens
        self.padded_tokens -= len(b.entries) * b.pad_to
        self.routed_tokens -= b.tokens
        self.ledger.requeue(len(b.entries), b.tokens)
        return b

    def split(self, batch_id: int, indexes: list[int]) -> Batch:
        """Move the entries at `indexes` of an in-flight batch into a batch of their own,
        in flight with the same consumer, lane and shape; returns it. The durable store
        settles poison entries this way without holding back the rest of their batch."""
        f = self.inflight[batch_id]
        b = f.batch
        take = set(indexes)
        if not take or len(take) >= len(b.entries):
            raise ValueError("a split must leave entries on both sides")
        out = [e for i, e in enumerate(b.entries) if i in take]
        b.entries = [e for i, e in enumerate(b.entries) if i not in take]
        tokens = sum(e.tokens for e in out)
        b.tokens -= tokens
        nb = Batch(self._next_batch, b.consumer, b.model, b.signature, b.lane, b.epoch,
                   b.pad_to, max(e.max_tokens for e in out), b.max_input_len, out, tokens)
        self._next_batch += 1
        self.inflight[nb.id] = InFlight(nb, f.shape, f.lane)
        f.lane.inflight += 1
        f.shape.batches += 1
        c = self.consumers.get(b.consumer)
        if c is not None:
            c.batches.add(nb.id)
        return nb

    def _after_settle(self, f: InFlight, now: float) -> None:
        lane, shape = f.lane, f.shape
        live = shape.lanes.lanes.get(lane.id) is lane
        if live and lane.idle() and (
            lane.quiescing or shape.state in (ShapeState.DRAINING, ShapeState.FINISHED)
        ):
            shape.lanes.release(lane)

    def _reopen(self, f: InFlight, now: float) -> InFlight:
        """A failed batch of a finished shape: its items rejoin the key's open shape, staged
        like late arrivals; the returned record says where they now belong."""
        b = f.batch
        p = self.place(b.model, b.signature, f.shape.label, max(e.tokens for e in b.entries), now)
        p.shape.batches += 1  # fail() takes one back off the shape it settles into
        p.shape.padded_tokens += len(b.entries) * b.pad_to
        p.shape.routed_tokens += b.tokens
        if p.shape.staged_since is None:
            p.shape.staged_since = min(e.t for e in b.entries)
        return InFlight(b, p.shape, p.lane)
