"""The shape lifecycle of one model: staged -> (warming) -> active -> draining -> finished.

Contract:
- a new shape is staged (assigned and stored, nothing dispatches); it is eligible to activate
  when its staged tokens reach activate_multiple x B, its oldest item is older than
  stage_timeout_s, or (activate_when_idle) the model's consumers idle with nothing else;
- with no current shape, the warming shape (or the best eligible one) activates at once,
  bumping the model's epoch and copying the length histogram onto the shape;
- below prewarm_multiple x B queued, the best eligible staged shape becomes warming (one at
  a time) and a `Prewarm` goes to the consumer it warms for (`Broker.prewarm_targets`);
- below drain_multiple x B with a warming shape waiting, the active shape drains (closed to
  new items); it finishes when every lane returned its slot (dispatched its last item; its
  batches in flight settle afterwards), and the warming shape activates. One finishing after
  fewer than thrash_batches batches while its prefix was staged again is thrashing
  (`stats.thrash_reason`, a critical event). Finished shapes join `finished_out` (bounded).
- off (an ablation): shapes dispatch once they exist; the current one is sticky.
Scope (`shape_scope`): "model" keeps one current and one warming shape per model (the seed's
rule, an ablation); "consumer" (the default) keeps them per consumer (a `Slot`): each GPU
stays shape-pure and sticky, two GPUs may run two shapes. A consumer whose shape is exhausted
takes, in order: a shape a departed consumer left (adopted), a staged shape, a shape warming
for a busy consumer (taken while idle), else it joins the live shape with the most queued
tokens if at least join_multiple x B. The last holder leaving an exhausted shape drains and
finishes it. A join bumps no epoch. Leaving a shape with work left is `core.preemption`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Mapping

from fabricctl.core.choice import Chooser, Context, Pick
from fabricctl.core.config import CoreConfig
from fabricctl.core.context import choice_context, horizon
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.model_state import (
    DISPATCHING,
    Holder,
    ModelState,
    Slot,
    join_target,
    orphaned,
    steal_target,
)
from fabricctl.core.preemption import Preemption
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.stats import BatchesHistogram, thrash_reason
from fabricctl.core.sweep import OpenSwept, Sweeper
from fabricctl.core.terms import JobTerms
from fabricctl.core.types import Prewarm
from fabricctl.core.waiting import candidate

FINISHED_OUT = 10_000  # finished shapes held for the store to take; older ones are dropped

class Lifecycle:
    """Why: the thresholds that decide when a GPU pays for a shape switch, in one place."""

    def __init__(self, cfg: CoreConfig, log: EventLog, histogram: BatchesHistogram,
                 terms: Mapping[int, JobTerms] | None = None,
                 queued_tokens: Callable[[], int] = lambda: 0,
                 models: Mapping[str, ModelState] | None = None,
                 open_swept: OpenSwept | None = None) -> None:
        self.cfg = cfg
        self.log = log
        self.histogram = histogram
        self.terms: Mapping[int, JobTerms] = {} if terms is None else terms
        self.chooser = Chooser(cfg, self.terms)
        self.sweeper = Sweeper(cfg, self.terms, log, open_swept, self.index)
        self.preemption = Preemption(cfg, self.terms, self.chooser, self.sweeper, self.context)
        self.queued_tokens = queued_tokens  # queued and in-flight tokens (the horizon)
        self._models_of: Mapping[str, ModelState] = {} if models is None else models
        self.finished: list[Shape] = []  # recently finished shapes, newest last (bounded)
        # finished shapes not yet taken (`Broker.take_finished`), oldest first (bounded)
        self.finished_out: deque[Shape] = deque(maxlen=FINISHED_OUT)

    def _transition(self, ms: ModelState, shape: Shape, dst: ShapeState, now: float, why: str):
        src = shape.state
        shape.set_state(dst, now)
        self.log.emit(
            now, EventKind.TRANSITION, model=ms.name, signature=shape.signature,
            label=shape.label, src=src.value, dst=dst.value, reason=why, value=shape.epoch,
        )

    # -- the shape choice (`core.choice`) ----------

    def context(self, ms: ModelState, now: float, hungry: bool,
                live: Container[str] | None = None) -> Context:
        """What the choice sees for this model now (`core.context`)."""
        return choice_context(self.cfg, ms, now, hungry, self.queued_tokens(), live)

    def choose(self, ms: ModelState, now: float, hungry: bool,
               live: Container[str] | None = None, slot: Slot | None = None) -> Pick | None:
        """The shape a consumer with none takes next (`Chooser.choose`); in "consumer" scope,
        rather than that waiting shape, a live shape that goes before it (`Preemption.held_first`:
        a higher priority, or a due window earlier than the pick's), joined."""
        pick = None
        ctx = self.context(ms, now, hungry, live)
        if ms.waiting.levels:
            pick = self.chooser.choose(ms.waiting, ctx)
            if pick is not None and self.sweeper.loose(ms, pick.shape):
                pick = self.sweeper.sweep(ms, pick, now)
        if slot is None or live is None:
            return pick
        # nothing waits: priority 0 joins only by the join rule (`_join_target`), or a window
        return self.preemption.held_first(ms, None if pick is None else pick.shape, slot, live,
                                          ctx) or pick

    def index(self, ms: ModelState, shape: Shape) -> None:
        """(Re)enter a shape in the model's waiting index under its current terms (a shape
        with a holder, or nothing queued, is not a candidate and stays out)."""
        if not candidate(shape):
            return
        prio, deadline = self.chooser.terms_of(shape)
        since = shape.waiting_since()
        if shape.fifo_by is None and since is not None and self.cfg.wait_bound_s <= 0:
            shape.fifo_by = since + horizon(ms, since, self.queued_tokens())
        ms.waiting.touch(shape, prio, deadline, since)

    def hold(self, h: Holder, shape: Shape | None, now: float = 0.0) -> None:
        """Make `shape` the holder's current; a shape it lets go of with work left waits."""
        old = h.current
        if old is shape:
            return
        h.current = shape
        if shape is not None:
            shape.held += 1
            self.chooser.taken(shape)
            shape.fifo_by = None  # served: its next wait is measured afresh
        if isinstance(h, Slot):
            h.batches = 0
            h.taken_at = now
        if old is not None:
            old.held -= 1
            if old.held == 0 and old.items and old.state is ShapeState.ACTIVE:
                ms = self._models_of.get(old.model)
                if ms is not None:
                    self.index(ms, old)

    def take(self, ms: ModelState, pick: Pick, now: float, slot: Slot | None) -> None:
        """Give a consumer (or the model) the picked shape: a staged one activates, an
        active one a consumer left is joined."""
        if pick.shape.state is ShapeState.STAGED:
            self.activate(ms, pick.shape, now, pick.why, slot)
        elif slot is not None:
            self.join(ms, slot, pick.shape, now)
        else:
            self._count_switch(ms, None)
            self.hold(ms, pick.shape, now)

    def preempt(self, ms: ModelState, slot: Slot, now: float, live: Container[str]) -> bool:
        """At a batch boundary, apply the switch `Preemption.decide` finds (a shape worth
        more than the one this consumer serves); True when it switched."""
        switch = self.preemption.decide(ms, slot, now, live)
        cur = slot.current
        if switch is None or cur is None:
            return False
        pick = switch.pick
        self.switch_event(ms, slot, cur, pick.shape, now, pick.why)
        self.hold(slot, None, now)
        if switch.warmed:
            self.activate(ms, pick.shape, now, pick.why, slot)
        else:
            self.take(ms, pick, now, slot)
        return True

    def switch_event(self, ms: ModelState, slot: Slot, cur: Shape, to: Shape, now: float,
                      why: str) -> None:
        ms.preemptions += 1
        self.log.emit(now, EventKind.SWITCH, model=ms.name, signature=cur.signature,
                      label=cur.label, value=to.signature,
                      reason=f"{slot.consumer} left after {slot.batches} batches: {why}")

    def activate(self, ms: ModelState, shape: Shape, now: float, why: str,
                 slot: Slot | None = None) -> None:
        h: Holder = ms if slot is None else slot
        self._count_switch(ms, slot)
        if shape.state is not ShapeState.WARMING or not shape.epoch:
            ms.epoch += 1
            shape.epoch = ms.epoch
        # else it keeps the epoch its pre-warm reserved, which the pre-warm built under
        shape.activated_at = now
        shape.stats = shape.lengths.copy()
        self._transition(ms, shape, ShapeState.ACTIVE, now, why)
        self.hold(h, shape, now)
        if h.warming is shape:
            h.warming = None

    def unwarm(self, ms: ModelState, slot: Slot, now: float, why: str) -> None:
        """The slot's consumer will not take the shape warming for it (it left this model
        for another of its names): the shape is staged again and waits for whoever comes."""
        shape = slot.warming
        if shape is None:
            return
        slot.warming = None
        if shape.state is ShapeState.WARMING:
            self._transition(ms, shape, ShapeState.STAGED, now, why)
        self.index(ms, shape)

    def _count_switch(self, ms: ModelState, slot: Slot | None) -> None:
        h: Holder = ms if slot is None else slot
        previous_had_work = h.current is not None and not h.current.idle()
        if (ms.epoch or ms.switches or ms.current is not None) if slot is None else slot.runs:
            ms.switches += 1
            if previous_had_work:
                ms.midstream_switches += 1
        if slot is not None:
            slot.runs += 1

    def join(self, ms: ModelState, slot: Slot, shape: Shape, now: float = 0.0) -> None:
        """A consumer takes a shape another consumer activated (same epoch, no transition)."""
        self._count_switch(ms, slot)
        self.hold(slot, shape, now)

    def finish(self, ms: ModelState, shape: Shape, now: float) -> None:
        shape.finished_at = now
        self._transition(ms, shape, ShapeState.FINISHED, now, "lanes returned")
        again = ms.open.get(shape.signature)  # its prefix's items staged since it drained
        shape.thrash = thrash_reason(shape.batches, self.cfg.thrash_batches,
                                     0 if again is None or again is shape else again.items)
        self.histogram.add(shape.batches, bool(shape.thrash))
        if shape.thrash:
            self.log.emit(
                now, EventKind.THRASH, model=ms.name, signature=shape.signature,
                label=shape.label, value=shape.batches, critical=True, reason=shape.thrash,
            )
        if ms.current is shape:
            self.hold(ms, None, now)
        for slot in ms.slots.values():
            if slot.current is shape:
                self.hold(slot, None, now)
        self.finished.append(shape)
        self.finished_out.append(shape)
        if len(self.finished) > 200:
            del self.finished[:100]

    def advance(self, ms: ModelState, now: float, hungry: bool = False,
                slot: Slot | None = None, live: Container[str] = ()) -> list[Prewarm]:
        """Apply every transition that is due (for `slot`, in "consumer" scope); returns
        pre-warm signals to send. `live` names the connected consumers (to adopt from the
        slots of the others)."""
        signals: list[Prewarm] = []
        for _ in range(4):  # a switch can cascade: drain, finish, activate, pick the next
            if not self._step(ms, now, hungry, signals, slot, live):
                break
        return signals

    def _step(self, ms: ModelState, now: float, hungry: bool, signals: list[Prewarm],
              slot: Slot | None = None, live: Container[str] = ()) -> bool:
        cfg = self.cfg
        h: Holder = ms if slot is None else slot
        cur = h.current
        if cur is not None and cur.state is ShapeState.FINISHED:  # another holder finished it
            self.hold(h, None, now)
            cur = None
        if cur is not None and cur.state is ShapeState.DRAINING:
            # A lane returns its slot when its last item is dispatched: batches still in flight
            # settle into the finished shape, so no GPU waits for another's tail.
            if cur.items:
                return False
            cur.lanes.release_idle()
            self.finish(ms, cur, now)
            cur = None
        if cur is None:
            if h.warming is not None:
                cut = None if slot is None else self.preemption.worth_leaving_for(
                    ms, h.warming, now, live, amortised=False)
                if cut is None and slot is not None and ms.waiting.levels and (
                        self.chooser.windows()):  # an earlier window due since it warmed
                    cut = self.chooser.earlier_due(
                        ms.waiting, self.context(ms, now, hungry, live), h.warming)
                if cut is not None:  # the warmed shape stays next, after the new job's
                    self.take(ms, cut, now, slot)
                    return True
                self.activate(ms, h.warming, now, "warmed", slot)
                return True
            if slot is not None and self._adopt(ms, slot, now, live):
                return True
            pick = self.choose(ms, now, hungry, live if slot is not None else None, slot)
            if pick is not None:
                self.take(ms, pick, now, slot)
                return True
            if slot is not None and (busy := steal_target(ms, slot)) is not None:
                shape, busy.warming = busy.warming, None  # idle here, still busy there
                assert shape is not None
                self.activate(ms, shape, now, "taken while idle", slot)
                return True
            other = join_target(ms, slot, self.cfg.join_multiple) if slot is not None else None
            if slot is not None and other is not None:
                self.join(ms, slot, other, now)
                return True
            return False
        # cur is active
        exhausted = cur.items == 0
        if h.warming is None and cur.tokens < cfg.prewarm_multiple * ms.budget:
            pick = self.choose(ms, now, hungry and exhausted, live if slot is not None else None,
                               slot)
            if pick is not None and pick.shape is cur:  # loose shapes were swept into it
                pick, exhausted = None, False
            if pick is not None and slot is not None and exhausted and (
                    pick.shape.state is ShapeState.ACTIVE):
                self._leave(ms, slot, cur, now)  # a shape another consumer left waits
                self.take(ms, pick, now, slot)
                return True
            if pick is not None and pick.shape.state is ShapeState.STAGED:
                shape = pick.shape
                ms.epoch += 1  # reserved now: other consumers may activate shapes meanwhile
                shape.epoch = ms.epoch
                self._transition(ms, shape, ShapeState.WARMING, now, pick.why)
                h.warming = shape
                self._prewarm(ms, shape, now, slot, signals)
        if slot is not None and exhausted and h.warming is None and (
            orphaned(ms, live) or steal_target(ms, slot) is not None
            or join_target(ms, slot, self.cfg.join_multiple) is not None
        ):
            self._leave(ms, slot, cur, now)  # nothing staged: help elsewhere
            return True
        if h.warming is not None and cur.tokens < cfg.drain_multiple * ms.budget:
            self._drain(ms, cur, now, "below drain threshold")
            return True
        return False

    def _prewarm(self, ms: ModelState, shape: Shape, now: float, slot: Slot | None,
                 signals: list[Prewarm]) -> None:
        lanes = [(lane.id, lane.target) for lane in shape.lanes.lanes.values()]
        signals.append(Prewarm(ms.name, shape.signature, shape.label, shape.epoch, lanes,
                               consumer=None if slot is None else slot.consumer))
        self.log.emit(now, EventKind.PREWARM, model=ms.name, signature=shape.signature,
                      label=shape.label, value=shape.epoch, reason=f"{len(lanes)} lanes")

    def _drain(self, ms: ModelState, cur: Shape, now: float, why: str) -> None:
        self._transition(ms, cur, ShapeState.DRAINING, now, why)
        if ms.open.get(cur.signature) is cur:
            del ms.open[cur.signature]

    # -- "consumer" scope ----------

    def _leave(self, ms: ModelState, slot: Slot, cur: Shape, now: float) -> None:
        """A consumer leaves its exhausted shape; the last holder drains and finishes it."""
        self.hold(slot, None, now)
        if ms.holders(cur):
            return
        self._drain(ms, cur, now, "left empty")
        cur.lanes.release_idle()
        self.finish(ms, cur, now)

    def _adopt(self, ms: ModelState, slot: Slot, now: float, live: Container[str]) -> bool:
        """Take over a departed consumer's shape: its current (with items) or its warming."""
        for orphan in orphaned(ms, live):
            cur = orphan.current
            if cur is not None and cur.items and cur.state in DISPATCHING:
                self.hold(orphan, None, now)
                self.join(ms, slot, cur, now)
                return True
            if orphan.warming is not None:
                shape, orphan.warming = orphan.warming, None
                self.activate(ms, shape, now, "adopted", slot)
                return True
        return False
