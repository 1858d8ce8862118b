"""The memory-mode broker: shapes, lanes, packing, lifecycle and ledger composed.

Contract: `ingest(items, now)` assigns every item to a lane of its shape and makes it
dispatchable (`place` + `admit` do the same in two steps for the durable store, which writes
between them); `pull(consumer, now)` returns a batch of one lane of the model's current shape
or None; `complete(batch_id, now)` and `fail(batch_id, now)` settle a batch (a failed batch
goes back to the front of its lane); `disconnect` fails every batch a consumer holds;
a batch in `settling` (its completion is being committed) stays in flight through a
disconnect, as do the batches a disconnect is told to `keep`; `tick(now)` runs lane
maintenance and the lifecycle's timeouts; `snapshot(now)` is all an
observer needs. Time is always an argument. A batch whose entry belongs to another shape
raises `ShapeGuardError`, which derives from BaseException so no `except Exception` hides it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.lanes import Lane, LaneCounters
from fabricctl.core.ledger import Ledger
from fabricctl.core.lifecycle import Lifecycle, ModelState, Slot
from fabricctl.core.maintenance import Maintenance
from fabricctl.core.packing import pack
from fabricctl.core.settlement import InFlight, Settlement, UnknownBatchError
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.stats import BatchesHistogram
from fabricctl.core.types import Batch, Contract, Entry, Item, Prewarm

__all__ = ["Broker", "InFlight", "Placement", "ShapeGuardError", "UnknownBatchError",
           "guard_signature"]


class ShapeGuardError(BaseException):
    """A batch would feed an engine an item of another shape: stop rather than poison a cache."""


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


@dataclass(slots=True)
class Placement:
    """Why: the durable path assigns first and writes second; this is the assignment."""

    shape: Shape
    lane: Lane


class Broker(Settlement, Maintenance):
    """Why: one object that owns every scheduling decision, with no I/O and no clock."""

    def __init__(self, cfg: CoreConfig | None = None) -> None:
        self.cfg = cfg or CoreConfig()
        self.models: dict[str, ModelState] = {}
        self.consumers: dict[str, ConsumerState] = {}
        self.inflight: dict[int, InFlight] = {}
        self.settling: set[int] = set()  # in flight, their completion being committed
        self.ledger = Ledger()
        self.events = EventLog(self.cfg.events_kept)
        self.lane_counters = LaneCounters()
        self.batches_hist = BatchesHistogram(self.cfg.thrash_batches)
        self.lifecycle = Lifecycle(self.cfg, self.events, self.batches_hist)
        self.signals: list[Prewarm] = []  # pre-warm signals not yet sent by the server
        self.batches_total = 0
        self.padded_tokens = 0  # batch slots sent (count x pad_to), all shapes ever
        self.routed_tokens = 0  # real input tokens sent in them
        self.starving_lanes = 0
        self._next_batch = 1
        self._next_key = 1

    # -- models and consumers ------------------------------------------------------------

    def model(self, name: str) -> ModelState:
        ms = self.models.get(name)
        if ms is None:
            ms = ModelState(name, self._budget(name))
            self.models[name] = ms
        return ms

    def _budget(self, model: str) -> int:
        budgets = [c.contract.max_batch_tokens for c in self.consumers.values()
                   if c.contract.model == model]
        return max(budgets) if budgets else self.cfg.default_batch_tokens

    def register(self, name: str, contract: Contract, now: float) -> None:
        if name in self.consumers:
            self.disconnect(name, now, "re-registered")
        self.consumers[name] = ConsumerState(name, contract, now)
        self.model(contract.model).budget = self._budget(contract.model)
        self.events.emit(now, EventKind.CONSUMER_JOINED, model=contract.model, reason=name)

    def disconnect(self, name: str, now: float, why: str = "disconnected",
                   keep: frozenset[int] | set[int] = frozenset()) -> int:
        """Forget a consumer; every batch it held goes back to the front of its lane, except
        those whose completion is settling or was received (`keep`): they settle later."""
        c = self.consumers.pop(name, None)
        if c is None:
            return 0
        items = 0
        back = c.batches - self.settling - keep
        for batch_id in sorted(back, reverse=True):  # newest first: oldest ends in front
            items += len(self.fail(batch_id, now).entries)
        ms = self.models.get(c.contract.model)
        if ms is not None:
            ms.budget = self._budget(c.contract.model)
        self.events.emit(now, EventKind.CONSUMER_LOST, model=c.contract.model,
                         reason=f"{name}: {why}", value=items)
        return items

    # -- ingest ----------

    def place(self, model: str, signature: int, label: str, tokens: int, now: float) -> Placement:
        """Assign an item to a lane (first step of ingest); it is not dispatchable yet."""
        shape = self._open_shape(model, signature, label, now)
        return Placement(shape, shape.lanes.assign(tokens, now))

    def _open_shape(self, model: str, signature: int, label: str, now: float) -> Shape:
        """The key's open shape, made when there is none (a draining shape is no longer open)."""
        ms = self.models.get(model) or self.model(model)
        shape = ms.open.get(signature)
        if shape is None:
            state = ShapeState.STAGED if self.cfg.lifecycle else ShapeState.ACTIVE
            shape = Shape(model, signature, label, self.cfg, self.lane_counters, now, state)
            ms.open[signature] = shape
        elif label and not shape.label:
            shape.label = label
        return shape

    def placement_live(self, shape: Shape, lane: Lane) -> bool:
        """Whether a placement still names its key's open shape and a lane of it (the tick
        or a shape switch may have retired either while the placement was being written)."""
        ms = self.models.get(shape.model)
        return (ms is not None and ms.open.get(shape.signature) is shape
                and shape.lanes.lanes.get(lane.id) is lane)

    def admit(self, placement: Placement, entry: Entry) -> None:
        """Make a placed item dispatchable (second step, after its durable commit)."""
        shape = placement.shape
        placement.lane.push(entry)
        shape.tokens += entry.tokens
        shape.items += 1
        shape.lengths.add(entry.tokens)
        if shape.staged_since is None:
            shape.staged_since = entry.t
        self.ledger.receive(1, entry.tokens)

    def admit_all(self, admits: list[tuple[Shape, Lane, Entry]], now: float) -> None:
        """`admit` for a whole commit's placements (shape, lane, entry: the hot path of
        durable ingest); one whose shape or lane was retired while its commit ran joins its
        key's open shape."""
        live: dict[int, bool] = {}  # id(lane) -> its placements are still live
        n = tokens = 0
        for shape, lane, e in admits:
            ok = live.get(id(lane))
            if ok is None:
                ok = live[id(lane)] = self.placement_live(shape, lane)
            if not ok:
                p = self.place(shape.model, shape.signature, shape.label, e.tokens, now)
                shape, lane = p.shape, p.lane
            t = e.tokens
            lane.queue.append(e)
            lane.tokens += t
            shape.tokens += t
            shape.items += 1
            shape.lengths.add(t)
            if shape.staged_since is None:
                shape.staged_since = e.t
            n += 1
            tokens += t
        self.ledger.receive(n, tokens)

    def ingest(self, items: Iterable[Item], now: float) -> int:
        """Memory mode: place and admit each item at once; returns how many went in.

        The steps of `place` then `admit`, written out: this is the broker's hottest loop.
        """
        n = tokens = 0
        key = self._next_key
        try:
            for item in items:
                t = item.input_tokens
                shape = self._open_shape(item.model, item.signature, item.label, now)
                lane = shape.lanes.assign(t, now)
                lane.push(Entry(key, t, item.max_tokens, now, item))
                key += 1
                n += 1
                tokens += t
                shape.tokens += t
                shape.items += 1
                shape.lengths.add(t)
                if shape.staged_since is None:
                    shape.staged_since = now
        finally:  # one ledger entry for the call, even if an item fails halfway
            self._next_key = key
            self.ledger.receive(n, tokens)
        return n

    # -- dispatch ----------

    def slot(self, ms: ModelState, consumer: str | None) -> Slot | None:
        """The consumer's own slot in "consumer" scope; None in "model" scope."""
        if self.cfg.shape_scope != "consumer" or consumer is None:
            return None
        slot = ms.slots.get(consumer)
        if slot is None:
            slot = ms.slots[consumer] = Slot(consumer)
        return slot

    def current_shape(self, ms: ModelState, now: float, consumer: str | None = None
                      ) -> Shape | None:
        """The shape the model's consumers (in "consumer" scope: this consumer) pull from,
        advancing the lifecycle if due."""
        slot = self.slot(ms, consumer)
        h = ms if slot is None else slot
        cur = h.current
        if not self.cfg.lifecycle:
            if cur is None or cur.items == 0:
                best = max((s for s in ms.open.values() if s.items), key=lambda s: s.tokens,
                           default=None)
                if best is not None and best is not cur:
                    if slot is not None and ms.holders(best):
                        self.lifecycle.join(ms, slot, best)
                    else:
                        self.lifecycle.activate(ms, best, now, "most tokens", slot)
                cur = h.current
            return cur
        if cur is None or cur.state is not ShapeState.ACTIVE or (
            cur.tokens < self.cfg.prewarm_multiple * ms.budget
        ):
            hungry = cur is None or cur.items == 0
            self.signals.extend(self.lifecycle.advance(ms, now, hungry, slot, self.consumers))
            cur = h.current
        return cur

    def prewarm_targets(self, signal: Prewarm) -> list[str]:
        """The consumers a pre-warm signal is for: in "consumer" scope the one whose next
        shape it names, else every consumer of the model."""
        ms = self.models.get(signal.model)
        if ms is None:
            return []
        if self.cfg.shape_scope == "consumer":
            return [c for c, s in ms.slots.items() if s.warming is not None
                    and s.warming.signature == signal.signature
                    and s.warming.epoch == signal.epoch]
        return [c.name for c in self.consumers.values() if c.contract.model == signal.model]

    def pull(self, consumer: str, now: float) -> Batch | None:
        """The next batch for a consumer, or None when its model has nothing dispatchable."""
        c = self.consumers[consumer]
        ms = self.models.get(c.contract.model)
        if ms is None:
            return None
        shape = self.current_shape(ms, now, consumer)
        if shape is None:
            return None
        lane = shape.pick_lane()
        if lane is None:
            return None
        contract = c.contract
        entries, pad_to = pack(lane.queue, contract.max_batch_size, contract.max_batch_tokens,
                               self.cfg.pad_multiple)
        tokens = 0
        max_tokens = 0
        sig = shape.signature
        for e in entries:
            tokens += e.tokens
            if e.max_tokens > max_tokens:
                max_tokens = e.max_tokens
            if e.item is not None and e.item.signature != sig:
                guard_signature(sig, e.item.signature, f"item {e.item.id}")
        n = len(entries)
        lane.tokens -= tokens
        lane.inflight += 1
        shape.tokens -= tokens
        shape.items -= n
        shape.inflight_tokens += tokens
        shape.inflight_items += n
        shape.batches += 1
        shape.padded_tokens += n * pad_to
        shape.routed_tokens += tokens
        batch = Batch(self._next_batch, consumer, ms.name, sig, lane.id, shape.epoch, pad_to,
                      max_tokens, contract.max_input_len, entries, tokens)
        self._next_batch += 1
        self.inflight[batch.id] = InFlight(batch, shape, lane)
        c.batches.add(batch.id)
        self.ledger.dispatch(n, tokens)
        self.batches_total += 1
        self.padded_tokens += n * pad_to
        self.routed_tokens += tokens
        return batch
