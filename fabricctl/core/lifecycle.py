"""The shape lifecycle of one model: staged -> (warming) -> active -> draining -> finished.

Contract:
- a new shape is staged: its items are assigned and stored, nothing dispatches;
- a staged shape is eligible to activate when its staged tokens reach activate_multiple x B,
  when its oldest staged item is older than stage_timeout_s, or (activate_when_idle) when
  the model's consumers are idle with nothing else to run;
- with no current shape, the warming shape (or else the best eligible one) activates at once;
  activation bumps the model's epoch and copies the length histogram onto the shape;
- when the active shape's queued tokens fall below prewarm_multiple x B, the eligible staged
  shape with the most tokens above its threshold becomes warming (one at a time) and a
  `Prewarm` signal goes to the model's consumers;
- the active shape drains when its queued tokens fall below drain_multiple x B and a warming
  shape waits; a draining shape is closed to new items;
- a draining shape finishes when every lane has returned its slot, i.e. dispatched its last
  item (its batches in flight settle afterwards, so no GPU waits on another's tail); the
  warming shape then activates at once; a shape finishing after fewer than thrash_batches
  batches is thrashing.
With the lifecycle off (an ablation), shapes dispatch as soon as they exist and the current
shape is sticky: kept while it has queued tokens, then the shape with the most tokens.

Scope (`shape_scope`): "model" keeps one current and one warming shape per model, so every
consumer of the model drains the same shape (the seed's rule, now an ablation). "consumer"
(the default of up, run and replay) keeps them per consumer (a `Slot`): each GPU stays
shape-pure and sticky, but two GPUs may run two shapes, so a shape too small to amortise its
prefix on every GPU is prefilled on one. The consumers holding one shape are its group. A
consumer whose shape is exhausted and that has no warming shape of its own takes, in order:
a shape a departed consumer left (adopted), a staged shape, a shape warming for a consumer
that still has queued work (taken while idle), else it joins the live shape with the most
queued tokens if that is at least join_multiple x B (worth one more prefill of its prefix).
A consumer leaving an exhausted shape nobody else holds drains and finishes it at once (late
arrivals stage a new one). A join bumps no epoch. A pre-warm signal is for the consumer the
shape warms for (`Broker.prewarm_targets`; the signal names it in `consumer`). Every shape
that finishes also joins `finished_out` (bounded), which the store takes to keep its record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Mapping

from fabricctl.core.choice import Chooser, Context, Pick, main_job, shape_terms
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
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.stats import BatchesHistogram
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
        rather than a waiting shape of a lower priority, a live shape of a higher one that
        has a batch budget to share (joined: priority first at every choice)."""
        pick = None
        if ms.waiting.levels:
            pick = self.chooser.choose(ms.waiting, self.context(ms, now, hungry, live))
            if pick is not None and self.sweeper.loose(ms, pick.shape):
                pick = self.sweeper.sweep(ms, pick, now)
        if slot is None or live is None:
            return pick
        # nothing waits: priority 0 joins only by the join rule (`_join_target`)
        floor = 0 if pick is None else shape_terms(pick.shape, self.terms)[0]
        return self._higher_held(ms, floor, slot, live) or pick

    def _higher_held(self, ms: ModelState, floor: int, slot: Slot, live: Container[str]
                     ) -> Pick | None:
        """Another live consumer's shape of a priority above `floor` with at least a batch
        budget queued (the highest priority, then the most tokens), to join."""
        best: Shape | None = None
        best_key = (floor, 0)
        for consumer, other in ms.slots.items():
            s = other.current
            if (s is None or other is slot or s is slot.current or consumer not in live
                    or s.state is not ShapeState.ACTIVE or s.tokens < ms.budget):
                continue
            key = (shape_terms(s, self.terms)[0], s.tokens)
            if key[0] > floor and key > best_key:
                best, best_key = s, key
        return None if best is None else Pick(best, "priority")

    def index(self, ms: ModelState, shape: Shape) -> None:
        """(Re)enter a shape in the model's waiting index under its current terms (a shape
        with a holder, or nothing queued, is not a candidate and stays out)."""
        if not candidate(shape):
            return
        prio, deadline = shape_terms(shape, self.terms)
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

    def _shortest(self, ms: ModelState, cur: Shape, ctx: Context, live: Container[str]
                  ) -> Pick | None:
        """Fair share's shortest-first half: another consumer's shape whose job has at least
        `short_ratio` times fewer tokens queued than this consumer's job, holds no more
        consumers, and has a batch budget left to share; the shortest such. A short job then
        runs on more GPUs than its share for a while, which costs the long one little, and
        fair share brings the long one back once the taker's run amortised."""
        if not self.cfg.fair_share:
            return None
        own = main_job(cur)
        tokens = cur.tally.tokens
        own_tokens = tokens.get(own, 0)
        own_held = ctx.held.get(own, 0)
        own_prio = shape_terms(cur, self.terms)[0]
        best: Shape | None = None
        for consumer, other in ms.slots.items():
            s = other.current
            if (s is None or s is cur or consumer not in live or s.state is not ShapeState.ACTIVE
                    or s.tokens < ms.budget):
                continue
            job = main_job(s)
            if (job in cur.jobs or ctx.held.get(job, 0) > own_held
                    or tokens.get(job, 0) * self.cfg.short_ratio > own_tokens
                    or shape_terms(s, self.terms)[0] < own_prio):
                continue
            if best is None or tokens.get(job, 0) < tokens.get(main_job(best), 0):
                best = s
        return None if best is None else Pick(best, "shortest job")

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
        """At a batch boundary: a consumer whose run has amortised its switch leaves a shape
        that still has work when the choice finds a waiting shape worth more (a higher
        priority, one past the bound, a due deadline, a job with fewer holders); before it
        amortised, only for a job nobody has served yet (`core.choice`, new jobs). True when
        it switched."""
        cur = slot.current
        if (cur is None or cur.state is not ShapeState.ACTIVE or not cur.items
                or slot.batches < 1):
            return False
        amortised = slot.batches >= self.cfg.amortise_batches
        warming = slot.warming
        if warming is not None and self.chooser.cuts_in(warming, cur):
            # the next shape it pre-warmed is a new job's: it need not wait for this one
            self.switch_event(ms, slot, cur, warming, now, "new job")
            self.hold(slot, None, now)
            self.activate(ms, warming, now, "new job", slot)
            return True
        if not ms.waiting.levels or (
                not amortised and not self.chooser.fresh_waiting(ms.waiting)):
            return False
        ctx = self.context(ms, now, False, live)
        pick = self.chooser.choose(ms.waiting, ctx, against=cur, amortised=amortised)
        if pick is None and amortised:
            pick = self._higher_held(ms, shape_terms(cur, self.terms)[0], slot, live)
        if pick is None and amortised:
            pick = self._shortest(ms, cur, ctx, live)
        if pick is not None and self.sweeper.loose(ms, pick.shape):
            pick = self.sweeper.sweep(ms, pick, now)
            if pick.shape is cur:  # swept into the shape this consumer serves: stay
                return False
        if pick is None:
            return False
        self.switch_event(ms, slot, cur, pick.shape, now, pick.why)
        self.hold(slot, None, now)
        self.take(ms, pick, now, slot)
        return True

    def switch_event(self, ms: ModelState, slot: Slot, cur: Shape, to: Shape, now: float,
                      why: str) -> None:
        ms.preemptions += 1
        self.log.emit(now, EventKind.SWITCH, model=ms.name, signature=cur.signature,
                      label=cur.label, value=to.signature,
                      reason=f"{slot.consumer} left after {slot.batches} batches: {why}")

    def worth_leaving_for(self, ms: ModelState, against: Shape, now: float,
                          live: Container[str], amortised: bool) -> Pick | None:
        """A waiting shape of `ms` that the shape choice puts before `against` (a consumer's
        current shape, or the one it is about to take), swept if loose; before `against`'s
        run has amortised, only a job nobody has served (`core.choice`, new jobs)."""
        if not ms.waiting.levels or (not amortised and not self.chooser.fresh_waiting(
                ms.waiting)):
            return None
        ctx = self.context(ms, now, False, live)
        pick = self.chooser.choose(ms.waiting, ctx, against=against, amortised=amortised)
        if pick is not None and self.sweeper.loose(ms, pick.shape):
            pick = self.sweeper.sweep(ms, pick, now)
        return pick

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
        self.histogram.add(shape.batches)
        if shape.batches < self.cfg.thrash_batches:
            self.log.emit(
                now, EventKind.THRASH, model=ms.name, signature=shape.signature,
                label=shape.label, value=shape.batches, critical=True,
                reason=f"finished after {shape.batches} batches (< {self.cfg.thrash_batches})",
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
                cut = None if slot is None else self.worth_leaving_for(
                    ms, h.warming, now, live, amortised=False)
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
