"""Dispatch: which batch a consumer gets next, and whom a pre-warm signal is for.

Contract: `pull(consumer, now)` returns the next batch for a registered consumer, or None
when its model has nothing dispatchable: the batch is packed (`pack_counted`, to the
consumer's contract) off one lane (`Shape.pick_lane`) of the shape `current_shape` gives,
checked by the hard signature guard (a batch whose entry belongs to another shape raises
`ShapeGuardError`; a swept shape's batch claims no one signature and is not checked) and
booked out through `Settlement.dispatch`. `current_shape(ms, now, consumer)` is the shape
the model's consumers (in "consumer" scope: that consumer's slot, made by `slot` on first
use) pull from: with the lifecycle off, the open shape of most tokens when the current one
is empty; with it on, a consumer whose run has amortised its switch may be preempted, and
the lifecycle advances when the current shape is missing, not active or below
`prewarm_multiple` budgets, its pre-warm signals going to the broker's outbox.
`prewarm_targets(signal)` names the consumers a signal is for. Pure: `now` is an argument.
`Dispatcher` owns nothing; the broker hands it its config, models, consumers, lifecycle,
settlement and signal outbox.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabricctl.core.config import CoreConfig
from fabricctl.core.lifecycle import Lifecycle
from fabricctl.core.model_state import ModelState, Slot
from fabricctl.core.packing import pack_counted
from fabricctl.core.settlement import Settlement
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.tracking import ConsumerState, guard_signature
from fabricctl.core.types import Batch, Item, Prewarm


class Dispatcher:
    """Why: a pull's shape, lane and guard are one decision, read apart from the bookkeeping."""

    def __init__(self, cfg: CoreConfig, models: Mapping[str, ModelState],
                 consumers: Mapping[str, ConsumerState], lifecycle: Lifecycle,
                 settlement: Settlement, signals: list[Prewarm]) -> None:
        self.cfg = cfg
        self.models = models  # the broker's, by name
        self.consumers = consumers  # the connected consumers, by name
        self.lifecycle = lifecycle
        self.settlement = settlement
        self.signals = signals  # the broker's outbox of pre-warm signals

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
        if (slot is not None and cur is not None and slot.batches >= 1
                and (ms.waiting.levels or slot.warming is not None) and cur.items
                and self.lifecycle.preempt(ms, slot, now, self.consumers)):
            cur = slot.current
        if cur is None or cur.state is not ShapeState.ACTIVE or (
            cur.tokens < self.cfg.prewarm_multiple * ms.budget
        ):
            hungry = cur is None or cur.items == 0
            self.signals.extend(self.lifecycle.advance(ms, now, hungry, slot, self.consumers))
            cur = h.current
        return cur

    def prewarm_targets(self, signal: Prewarm) -> list[str]:
        """The consumers a pre-warm signal is for: in "consumer" scope the one whose next
        shape it names (the signal's `consumer`, while it is registered), else every
        consumer of the model."""
        ms = self.models.get(signal.model)
        if ms is None:
            return []
        if signal.consumer is not None:
            return [signal.consumer] if signal.consumer in self.consumers else []
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
        entries, pad_to, tokens = pack_counted(lane.queue, contract.max_batch_size,
                                               contract.max_batch_tokens, self.cfg.pad_multiple)
        max_tokens = max(0, max([e.max_tokens for e in entries], default=0))
        if not shape.swept:  # a swept shape's batch claims no one signature (`core.sweep`)
            _guard(shape.signature, [e.item for e in entries])
        slot = ms.slots.get(consumer)
        if slot is not None and slot.current is shape:
            slot.batches += 1
        ms.meter.begin(now)
        shape.served_at = now
        return self.settlement.dispatch(c, ms.name, shape, lane, entries, pad_to, tokens,
                                        max_tokens)


def _guard(sig: int, items: list[Item | None]) -> None:
    """The hard guard over a batch's entries that carry their item (memory mode)."""
    if items and items[0] is not None:  # memory mode: every entry carries its item
        try:
            sigs = {it.signature for it in items}  # type: ignore[union-attr]
        except AttributeError:  # some entry without its item: check those with one
            sigs = {it.signature for it in items if it is not None}
    else:  # a store's entries (their items live in the store)
        sigs = {it.signature for it in items if it is not None}
    if sigs and sigs != {sig}:
        for it in items:  # the first entry of another shape, by name
            if it is not None:
                guard_signature(sig, it.signature, f"item {it.id}")
