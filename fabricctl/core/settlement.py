"""Settlement: the book of batches out with consumers, from dispatch to how each one ends.

Contract: `dispatch(...)` books a packed batch out (its lane's and shape's queued counts move
to in flight, the ledger routes it, the consumer holds it) and returns it; `complete(batch_id,
now)` settles a batch and returns it (the store tombstones its entries); `fail(batch_id, now)`
puts its entries back at the front of their lane (into the key's open shape, placed by the
broker's `place` rule, when its own shape finished dispatching); `split(batch_id, indexes)`
moves some entries of an in-flight batch into a batch of their own. A batch that is not in
flight raises `UnknownBatchError`. A lane left idle by a settlement is released when it was
quiescing or its shape is draining. `Settlement` owns the in-flight table, the `settling` set
(batches whose completion is being committed), batch ids and the broker-wide dispatch totals;
the broker hands it the consumers, the ledger and its placement rule.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from fabricctl.core.lanes import Lane
from fabricctl.core.ledger import Ledger
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.tracking import ConsumerState, InFlight, Placement, UnknownBatchError
from fabricctl.core.types import Batch, Entry

Place = Callable[[str, int, str, int, float], Placement]  # (model, sig, label, tokens, now)


class Settlement:
    """Why: ending a batch touches lanes, shapes, consumers and the ledger at once."""

    def __init__(self, consumers: dict[str, ConsumerState], ledger: Ledger, place: Place,
                 queued: Callable[[Shape], None] = lambda shape: None) -> None:
        self.consumers = consumers  # the broker's registry, read and updated, never rebound
        self.ledger = ledger
        self.place = place
        self.queued = queued  # told of a shape a failed batch went back to (the choice's index)
        self.inflight: dict[int, InFlight] = {}
        self.settling: set[int] = set()  # in flight, their completion being committed
        self.next_batch = 1
        self.batches_total = 0
        self.padded_tokens = 0  # batch slots sent (count x pad_to), all shapes ever
        self.routed_tokens = 0  # real input tokens sent in them

    def dispatch(self, c: ConsumerState, model: str, shape: Shape, lane: Lane,
                 entries: list[Entry], pad_to: int, tokens: int, max_tokens: int) -> Batch:
        """Book entries just packed off `lane` out to consumer `c` as one batch."""
        n = len(entries)
        lane.tokens -= tokens
        lane.inflight += 1
        shape.tokens -= tokens
        shape.items -= n
        shape.count_jobs(entries, -1)
        shape.inflight_tokens += tokens
        shape.inflight_items += n
        shape.batches += 1
        shape.padded_tokens += n * pad_to
        shape.routed_tokens += tokens
        shape.served_items += n
        shape.consumers.add(c.name)
        batch = Batch(id=self.next_batch, model=model, signature=shape.signature, lane=lane.id,
                      epoch=shape.epoch, pad_to=pad_to, max_tokens=max_tokens,
                      max_input_len=c.contract.max_input_len, consumer=c.name, entries=entries,
                      tokens=tokens, mixed=shape.swept)
        self.next_batch += 1
        self.inflight[batch.id] = InFlight(batch, shape, lane)
        c.batches.add(batch.id)
        self.ledger.dispatch(n, tokens)
        self.batches_total += 1
        self.padded_tokens += n * pad_to
        self.routed_tokens += tokens
        return batch

    def waste(self) -> float:
        """Padding fraction of every batch dispatched so far."""
        return 1.0 - self.routed_tokens / self.padded_tokens if self.padded_tokens else 0.0

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
        f.shape.count_jobs(b.entries, 1)
        f.shape.batches -= 1
        f.shape.padded_tokens -= len(b.entries) * b.pad_to
        f.shape.routed_tokens -= b.tokens
        f.shape.served_items -= len(b.entries)
        self.padded_tokens -= len(b.entries) * b.pad_to
        self.routed_tokens -= b.tokens
        self.ledger.requeue(len(b.entries), b.tokens)
        self.queued(f.shape)
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
        nb = msgspec.structs.replace(b, id=self.next_batch, entries=out, tokens=tokens,
                                     max_tokens=max(e.max_tokens for e in out))
        self.next_batch += 1
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
        p.shape.served_items += len(b.entries)
        if p.shape.staged_since is None:
            p.shape.staged_since = min(e.t for e in b.entries)
        return InFlight(b, p.shape, p.lane)
