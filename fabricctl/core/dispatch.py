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
from fabricctl.core.events import EventKind
from fabricctl.core.lifecycle import Lifecycle
from fabricctl.core.model_state import ModelState, Slot
from fabricctl.core.packing import pack_counted
from fabricctl.core.rate import IDLE_S
from fabricctl.core.serving import Live, rank, serves
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
        live = Live(self.consumers, ms.name)
        if (slot is not None and cur is not None and slot.batches >= 1
                and (ms.waiting.levels or slot.warming is not None or (
                    slot.batches % self.cfg.amortise_batches == 0
                    and self.lifecycle.chooser.windows()))
                and cur.items and self.lifecycle.preempt(ms, slot, now, live)):
            cur = slot.current
        if cur is None or cur.state is not ShapeState.ACTIVE or (
            cur.tokens < self.cfg.prewarm_multiple * ms.budget
        ):
            hungry = cur is None or cur.items == 0
            self.signals.extend(self.lifecycle.advance(ms, now, hungry, slot, live))
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
        return [c.name for c in self.consumers.values() if serves(c, signal.model)]

    def pull(self, consumer: str, now: float) -> Batch | None:
        """The next batch for a consumer, or None when none of its names has anything
        dispatchable."""
        c = self.consumers[consumer]
        if not c.contract.names:
            ms = self.models.get(c.contract.model)
            return None if ms is None else self._pull(c, ms, now)
        ms = self.models.get(c.serving)
        if ms is not None and self.cfg.shape_scope == "consumer" and self.cfg.lifecycle:
            moved = self._leave_for(c, ms, now)
            if moved is not None:
                ms = moved
        batch = None if ms is None else self._pull(c, ms, now)
        if batch is not None:
            return batch
        for other in self._wanting(c):  # its name ran dry: the one that wants it most
            self._move(c, other, now, "ran dry")
            batch = self._pull(c, other, now)
            if batch is not None:
                return batch
        return None

    def _wanting(self, c: ConsumerState) -> list[ModelState]:
        """The consumer's other names with something for it, most wanting first."""
        ranked = []
        for name in c.contract.served():
            ms = self.models.get(name)
            if ms is None or name == c.serving:
                continue
            key = rank(ms, Live(self.consumers, name))
            if key is not None:
                ranked.append((key, name, ms))
        ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
        return [ms for _, _, ms in ranked]

    def _leave_for(self, c: ConsumerState, ms: ModelState, now: float) -> ModelState | None:
        """At a batch boundary, another of the consumer's names whose waiting shape the
        shape choice puts before its current one (a higher priority, a due deadline, a wait
        past the bound, a fresh job; as `Lifecycle.preempt` does within a name): it moves
        there and takes that shape, the shape it left and the one warming for it there
        waiting for whoever comes (`Lifecycle.unwarm`). None: it stays."""
        slot = ms.slots.get(c.name)
        cur = None if slot is None else slot.current
        if slot is None or cur is None or not cur.items or slot.batches < 1:
            return None
        amortised = slot.batches >= self.cfg.amortise_batches
        for name in c.contract.served():
            other = self.models.get(name)
            if other is None or other is ms:
                continue
            pick = self.lifecycle.preemption.worth_leaving_for(
                other, cur, now, Live(self.consumers, name), amortised)
            if pick is None:
                continue
            self.lifecycle.switch_event(ms, slot, cur, pick.shape, now, f"{name}: {pick.why}")
            self.lifecycle.hold(slot, None, now)
            self.lifecycle.unwarm(ms, slot, now, f"{c.name} moved to {name!r}")
            self._move(c, other, now)
            self.lifecycle.take(other, pick, now, self.slot(other, c.name))
            return other
        return None

    def _move(self, c: ConsumerState, to: ModelState, now: float, why: str = "") -> None:
        """The consumer pulls from `to` from now on: a shape switch on its server (counted
        on the consumer; the shape it takes there is counted by `to` as any take is; `why`:
        logged as a switch event, when the move is not a preemption already logged)."""
        if c.serving == to.name:
            return
        if why:
            self.lifecycle.log.emit(now, EventKind.SWITCH, model=c.serving, value=0,
                                    reason=f"{c.name} moved to {to.name!r}: {why}")
        c.serving = to.name
        c.name_switches += 1
        slot = to.slots.get(c.name)
        if slot is not None:
            slot.batches = 0  # its run there amortises afresh

    def _pull(self, c: ConsumerState, ms: ModelState, now: float) -> Batch | None:
        consumer = c.name
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
        self._begin(ms, now)
        shape.served_at = now
        return self.settlement.dispatch(c, ms.name, shape, lane, entries, pad_to, tokens,
                                        max_tokens)

    def _begin(self, ms: ModelState, now: float) -> None:
        """Mark a dispatch on the model's meter; a span may start (`RateMeter.begin`): told
        whether nothing of the model is in flight and how many consumers serve it."""
        meter = ms.meter
        if meter.start is not None and (meter.done_at is None or now - meter.done_at <= IDLE_S):
            return  # (the common case: a busy span goes on)
        idle = not any(f.batch.model == ms.name for f in self.settlement.inflight.values())
        meter.begin(now, idle, sum(1 for c in self.consumers.values() if serves(c, ms.name)))


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
