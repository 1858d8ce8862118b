"""Preemption: what a consumer leaves its shape for at a batch boundary, decided, not applied.

Contract:
- `Preemption.held_first`: another live consumer's active shape with a batch budget queued
  that goes before `than` (the shape this consumer would take, or serves): a higher
  priority (the highest, then the most tokens), else the same priority with a due window
  earlier than `than`'s due one: earliest deadline first takes the whole fleet;
- `Preemption.shortest`: fair share's shortest-first half (another consumer's shape whose
  job has `short_ratio` times fewer tokens queued and no more holders);
- `Preemption.decide`: at a batch boundary, the `Switch` a consumer makes, or None to stay:
  its pre-warmed shape when that is a new job's or an earlier due window; once its run has
  amortised (`amortise_batches`), the choice's pick, a live shape before it, or the
  shortest job; before that, only for a job nobody has served yet;
- `Preemption.worth_leaving_for`: the waiting shape the choice puts before another one.
Loose picks are swept (`core.sweep`). The lifecycle (`core.lifecycle`) applies a switch:
the SWITCH event, letting go of the shape, taking the new one. Pure: `now` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from fabricctl.core.choice import Chooser, Context, Pick, main_job, shape_terms
from fabricctl.core.config import CoreConfig
from fabricctl.core.model_state import ModelState, Slot
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.sweep import Sweeper
from fabricctl.core.terms import JobTerms

ContextOf = Callable[[ModelState, float, bool, Container[str] | None], Context]


@dataclass(frozen=True, slots=True)
class Switch:
    """Why: a preemption decided here and applied by the lifecycle, so choosing stays apart."""

    pick: Pick
    warmed: bool  # the consumer's own pre-warmed shape (activated, not taken)


class Preemption:
    """Why: the rules that let a consumer leave a shape with work left, in one place."""

    def __init__(self, cfg: CoreConfig, terms: Mapping[int, JobTerms], chooser: Chooser,
                 sweeper: Sweeper, context: ContextOf) -> None:
        self.cfg = cfg
        self.terms = terms
        self.chooser = chooser
        self.sweeper = sweeper
        self.context = context

    def due_before(self, shape: Shape, than: Shape, ctx: Context) -> bool:
        """`shape` holds a due window (`Chooser.due`) earlier than any due one of `than`."""
        chooser = self.chooser
        if not chooser.due(shape, ctx):
            return False
        deadline = chooser.terms_of(shape)[1]
        other = chooser.terms_of(than)[1] if chooser.due(than, ctx) else None
        return deadline is not None and (other is None or deadline < other)

    def held_first(self, ms: ModelState, than: Shape | None, slot: Slot,
                   live: Container[str], ctx: Context) -> Pick | None:
        """Another live consumer's shape to join before `than` (None: nothing)."""
        chooser = self.chooser
        floor, deadline = (0, None) if than is None else chooser.terms_of(than)
        if than is not None and not chooser.due(than, ctx):
            deadline = None
        best: Shape | None = None
        best_key: tuple[int, float, int] = (floor, -math.inf, 0)
        for consumer, other in ms.slots.items():
            s = other.current
            if (s is None or other is slot or s is slot.current or consumer not in live
                    or s.state is not ShapeState.ACTIVE or s.tokens < ms.budget):
                continue
            prio, due = chooser.terms_of(s)
            if prio > floor:
                key = (prio, math.inf, s.tokens)
            elif (prio == floor and due is not None and chooser.due(s, ctx)
                  and (deadline is None or due < deadline)):
                key = (prio, -due, 0)
            else:
                continue
            if key > best_key:
                best, best_key = s, key
        if best is None:
            return None
        return Pick(best, "priority" if best_key[0] > floor else "deadline")

    def shortest(self, ms: ModelState, cur: Shape, ctx: Context, live: Container[str]
                 ) -> Pick | None:
        """The shortest other job's shape with a batch budget left to share. A short job
        then runs on more GPUs than its share for a while, which costs the long one little,
        and fair share brings the long one back once the taker's run amortised."""
        if not self.cfg.fair_share or self.chooser.due(cur, ctx):
            return None  # (a window that would otherwise be missed keeps its consumer)
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

    def decide(self, ms: ModelState, slot: Slot, now: float, live: Container[str]
               ) -> Switch | None:
        """The switch `slot`'s consumer makes at this batch boundary; None: it stays."""
        cur = slot.current
        if (cur is None or cur.state is not ShapeState.ACTIVE or not cur.items
                or slot.batches < 1):
            return None
        amortised = slot.batches >= self.cfg.amortise_batches
        warming = slot.warming
        if warming is not None:
            if self.chooser.cuts_in(warming, cur):
                # the next shape it pre-warmed is a new job's: it need not wait for this one
                return Switch(Pick(warming, "new job"), warmed=True)
            if self.chooser.windows() and self.due_before(
                    warming, cur, self.context(ms, now, False, live)):
                return Switch(Pick(warming, "deadline"), warmed=True)  # an earlier window
        if not amortised and (not ms.waiting.levels or not (
                self.chooser.windows() or self.chooser.fresh_waiting(ms.waiting))):
            return None
        if not ms.waiting.levels and not self.chooser.windows():
            return None  # (with windows, a due one another consumer serves may be joined)
        ctx = self.context(ms, now, False, live)
        pick = (self.chooser.choose(ms.waiting, ctx, against=cur, amortised=amortised)
                if ms.waiting.levels else None)
        if amortised:  # a live shape before the pick (or this one): joined
            pick = self.held_first(ms, cur if pick is None else pick.shape, slot, live,
                                   ctx) or pick
        if pick is None and amortised:
            pick = self.shortest(ms, cur, ctx, live)
        if pick is not None and self.sweeper.loose(ms, pick.shape):
            pick = self.sweeper.sweep(ms, pick, now)
            if pick.shape is cur:  # swept into the shape this consumer serves: stay
                return None
        return None if pick is None else Switch(pick, warmed=False)

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
