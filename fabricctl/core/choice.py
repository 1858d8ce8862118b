"""The shape choice: which waiting shape a consumer takes next, and when it leaves its own.

Contract (the rules and why: ARCHITECTURE.md, "The shape choice"). Candidates are the model's
waiting shapes (`core.waiting`). A shape of any priority that has waited `aging_s` goes
first; then priority is strict, and within a level, in order:
1. **deadlines**: the earliest-deadline shape when it is due (it falls before the model could
   drain everything queued at its measured rate, `horizon`; before a rate is known every
   deadline is due). A consumer serving a due window keeps it against rules 2-4; a
   `hopeless` job's deadline does not count (`shape_terms`);
2. **fair share**: a job holding fewer consumers than the most served job: its biggest
   eligible shape, the job with the fewest holders first;
3. **the bound**: a shape waiting `bound` seconds or more (`Shape.waiting_since`);
4. **tokens**: the biggest eligible shape of the job with the fewest holders (with
   `fair_share` off: of any job).
Eligible: a staged shape at the activation threshold, `stage_timeout_s` old, whose jobs are
all sealed, or with consumers idle; an active shape a consumer left, always.
`choose(..., against=None)` picks for a consumer with no current shape; with `against` (its
amortised current shape) it returns the shape worth leaving for, or None. With fair share, a
job never served goes before served jobs of equal holders and takes a consumer at its next
batch boundary even before its run amortised (`choose(..., amortised=False)`, which answers
that rule and an earlier due window, `earlier_due`, alone) unless the consumer's own job is
`short_ratio` times shorter, due earlier or of a higher priority. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from fabricctl.core.config import CoreConfig
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.terms import NO_TERMS, JobTerms
from fabricctl.core.waiting import Level, Waiting


@dataclass(frozen=True, slots=True)
class Pick:
    """Why: the log and the dashboard say why a consumer took the shape it took."""

    shape: Shape
    why: str


@dataclass(frozen=True, slots=True)
class Context:
    """Why: one choice reads the clock, the fleet's state and the jobs' terms together."""

    now: float
    hungry: bool  # the consumer has nothing else to run
    bound: float  # seconds an oldest item may wait while a GPU serves an amortised shape
    horizon: float  # seconds the model needs to drain what it has queued (inf: unknown)
    held: Mapping[int, int]  # job -> consumers whose current shape holds its items
    threshold: float  # tokens at which a staged shape is worth a switch


def shape_terms(shape: Shape, terms: Mapping[int, JobTerms],
                hopeless: Container[int] = ()) -> tuple[int, float | None]:
    """(priority, deadline) of a shape: its jobs' highest priority and earliest deadline
    (the deadlines of `hopeless` jobs, which cannot be met, not counted)."""
    prio = 0
    deadline: float | None = None
    for job in shape.jobs:
        t = terms.get(job, NO_TERMS)
        if t.priority > prio:
            prio = t.priority
        if t.deadline is not None and (deadline is None or t.deadline < deadline) and (
                job not in hopeless):
            deadline = t.deadline
    return prio, deadline


HOPELESS_MARGIN = 1.25  # a window is given up only if the fleet this much faster would miss it


def hopeless(tokens: float, deadline: float, rate: float | None, switch_s: float,
             now: float) -> bool:
    """A job with `tokens` queued cannot finish by `deadline` even served first, by the
    whole fleet at `HOPELESS_MARGIN` times its measured `rate` (tokens per second: the
    margin absorbs a rate measured low, as while the input is still being read), after a
    switch of `switch_s` seconds. False while no rate is known: a window is given up only
    on evidence."""
    return (rate is not None and rate > 0
            and now + switch_s + tokens / (rate * HOPELESS_MARGIN) > deadline)


def sealed(shape: Shape, terms: Mapping[int, JobTerms]) -> bool:
    """Every job with items here has ended its input: the shape can gain no more items."""
    return bool(shape.jobs) and all(terms.get(j, NO_TERMS).sealed for j in shape.jobs)


def main_job(shape: Shape) -> int:
    """The job with the most items queued in a shape (0 when none)."""
    return max(shape.jobs.items(), key=lambda kv: kv[1], default=(0, 0))[0]


class Chooser:
    """Why: one rule for the next shape, used on activation, pre-warm and preemption alike."""

    def __init__(self, cfg: CoreConfig, terms: Mapping[int, JobTerms]) -> None:
        self.cfg = cfg
        self.terms = terms  # the broker's job terms, read live
        self.served: set[int] = set()  # jobs some consumer has taken a shape of (not job 0)
        # jobs whose window cannot be met even served first (`hopeless`): their deadline
        # does not count here, so they are served after the windows that still can be met
        self.hopeless: set[int] = set()
        self.has_windows = False  # some job has a deadline (`terms_changed`)
        self.terms_changed()

    def terms_of(self, shape: Shape) -> tuple[int, float | None]:
        """(priority, deadline) of a shape as the choice reads them (`shape_terms`)."""
        return shape_terms(shape, self.terms, self.hopeless)

    def windows(self) -> bool:
        """Some job has a window (`terms_changed` keeps it)."""
        return self.has_windows

    def terms_changed(self) -> None:
        """The jobs' terms changed: whether some job has a window, again."""
        self.has_windows = any(t.deadline is not None for t in self.terms.values())

    def due(self, shape: Shape, ctx: Context) -> bool:
        """The shape holds a window that would be missed if it were served last: its
        deadline falls before the model could drain everything queued (`horizon`)."""
        deadline = self.terms_of(shape)[1]
        return deadline is not None and deadline - ctx.now < ctx.horizon

    def taken(self, shape: Shape) -> None:
        """A consumer (or the model) took `shape`: its jobs are served from now on."""
        self.served.update(shape.jobs)

    def forget(self, job: int) -> None:
        """A job ended: nothing of it waits any more."""
        self.served.discard(job)
        self.hopeless.discard(job)

    def _fresh(self, job: int) -> bool:
        return job != 0 and job not in self.served

    def fresh_waiting(self, waiting: Waiting) -> bool:
        """Some level holds a job no consumer has served yet (cheap: dictionary keys)."""
        return self.cfg.fair_share and any(
            self._fresh(job) for level in waiting.levels.values() for job in level.by_job)

    def eligible(self, shape: Shape, ctx: Context) -> str | None:
        """Why a candidate may be taken without a bound or a deadline forcing it, or None."""
        if shape.state is ShapeState.ACTIVE:
            return "resumed"
        if shape.tokens >= ctx.threshold:
            return "threshold"
        since = shape.staged_since
        if since is not None and ctx.now - since >= self.cfg.stage_timeout_s:
            return "timeout"
        if sealed(shape, self.terms):
            return "input ended"
        if ctx.hungry and self.cfg.activate_when_idle:
            return "idle"
        return None

    def _overdue(self, level: Level, ctx: Context) -> Shape | None:
        s = level.by_age.top()
        if s is None:
            return None
        since = s.waiting_since()
        if since is not None and ctx.now - since >= ctx.bound and (
                s.fifo_by is None or ctx.now >= s.fifo_by):
            return s
        return None

    def _due(self, level: Level, ctx: Context) -> tuple[Shape, float] | None:
        s = level.by_deadline.top()
        if s is None:
            return None
        deadline = self.terms_of(s)[1]
        if deadline is not None and deadline - ctx.now < ctx.horizon:
            return s, deadline
        return None

    def _fair(self, level: Level, ctx: Context) -> tuple[Shape, int, str] | None:
        """Each job's biggest eligible shape at a level, the job with the fewest holders
        first, then the most tokens: (shape, its job, why)."""
        best: tuple[Shape, int, str] | None = None
        best_key: tuple[int, bool, int] | None = None
        for job, s in level.job_tops():
            why = self.eligible(s, ctx)
            if why is None:
                continue
            key = ((ctx.held.get(job, 0), not self._fresh(job), -s.tokens)
                   if self.cfg.fair_share else (0, False, -s.tokens))
            if best_key is None or key < best_key:
                best, best_key = (s, job, why), key
        return best

    def _short(self, shape: Shape, job: int, other: int) -> bool:
        """`job` has `short_ratio` times fewer tokens queued than `other`: fair share does
        not take a consumer from it for `other` (shortest first; the bound still does)."""
        tokens = shape.tally.tokens
        return tokens.get(job, 0) * self.cfg.short_ratio <= tokens.get(other, 0)

    def _starved(self, fair: tuple[Shape, int, str] | None, ctx: Context) -> bool:
        """The fair pick's job holds fewer consumers than the most served job does."""
        return (fair is not None and self.cfg.fair_share
                and ctx.held.get(fair[1], 0) < max(ctx.held.values(), default=0))

    def _aged(self, waiting: Waiting, ctx: Context) -> Shape | None:
        """A shape of any priority that has waited `aging_s` or more (the oldest of the
        levels' oldest), so strict priority never starves a job for good."""
        best: Shape | None = None
        best_since = ctx.now - self.cfg.aging_s
        for _prio, level in waiting.ordered():
            s = level.by_age.top()
            since = None if s is None else s.waiting_since()
            if since is not None and since <= best_since:
                best, best_since = s, since
        return best

    def cuts_in(self, shape: Shape, against: Shape) -> bool:
        """`shape` holds a job nobody has served that may take a consumer from `against`
        before its run amortised: at a higher priority; at the same, unless `against`'s own
        job is `short_ratio` times shorter or has an earlier deadline (the new-jobs rule)."""
        fresh = [job for job in shape.jobs if self._fresh(job) and job not in against.jobs]
        if not fresh or not self.cfg.fair_share:  # (checked at every pull: the cheap test first)
            return False
        prio, deadline = self.terms_of(shape)
        a_prio, a_deadline = self.terms_of(against)
        if prio < a_prio:
            return False
        own = main_job(against)
        for job in fresh:
            if prio > a_prio:
                return True
            if self._short(against, own, job) or (a_deadline is not None and (
                    deadline is None or a_deadline <= deadline)):
                continue
            return True
        return False

    def _new_job(self, waiting: Waiting, ctx: Context, against: Shape, a_prio: int
                 ) -> Pick | None:
        """An eligible candidate that `cuts_in` before `against` (the new-jobs rule): of the
        highest priority, the earliest deadline first."""
        for prio, level in waiting.ordered():
            if prio < a_prio:
                return None
            best: Shape | None = None
            best_deadline = float("inf")
            for job, s in level.job_tops():
                if (self._fresh(job) and self.eligible(s, ctx) is not None
                        and self.cuts_in(s, against)):
                    deadline = self.terms_of(s)[1]
                    deadline = float("inf") if deadline is None else deadline
                    if best is None or deadline < best_deadline:
                        best, best_deadline = s, deadline
            if best is not None:
                return Pick(best, "new job")
        return None

    def earlier_due(self, waiting: Waiting, ctx: Context, than: Shape) -> Pick | None:
        """A waiting shape with a due window earlier than `than`'s due one (any due window
        when `than` has none), at `than`'s priority or above: what takes a consumer from
        `than` before its run amortised, or before it activates `than`, pre-warmed (a
        switch is worth a window that would otherwise be missed)."""
        prio, deadline = self.terms_of(than)
        if deadline is not None and not self.due(than, ctx):
            deadline = None
        for p, level in waiting.ordered():
            if p < prio:
                return None
            due = self._due(level, ctx)
            if due is not None and (p > prio or deadline is None or due[1] < deadline):
                return Pick(due[0], "deadline")
        return None

    def choose(self, waiting: Waiting, ctx: Context, against: Shape | None = None,
               amortised: bool = True) -> Pick | None:
        """The next shape for a consumer (see the module's contract)."""
        aged = self._aged(waiting, ctx)
        if aged is not None:
            return Pick(aged, "waited past aging_s")
        if against is None:
            return self._free(waiting, ctx)
        a_prio, a_deadline = self.terms_of(against)
        if not amortised:
            if self.has_windows:
                pick = self.earlier_due(waiting, ctx, against)
                if pick is not None:
                    return pick
            return self._new_job(waiting, ctx, against, a_prio) if self.cfg.fair_share else None
        a_held = ctx.held.get(main_job(against), 0)
        for prio, level in waiting.ordered():
            if prio < a_prio:
                return None
            if prio > a_prio:  # strict priority: any shape of a higher level worth a switch
                due = self._due(level, ctx)
                if due is not None:
                    return Pick(due[0], "priority")
                fair = self._fair(level, ctx)
                if fair is not None:
                    return Pick(fair[0], "priority")
                s = self._overdue(level, ctx)
                if s is not None:
                    return Pick(s, "priority")
                continue
            due = self._due(level, ctx)
            if due is not None and (a_deadline is None or due[1] < a_deadline):
                return Pick(due[0], "deadline")
            if a_deadline is not None and a_deadline - ctx.now < ctx.horizon:
                return None  # a window that would otherwise be missed keeps its consumer
            fair = self._fair(level, ctx)
            if (fair is not None and self.cfg.fair_share and fair[1] not in against.jobs
                    and ctx.held.get(fair[1], 0) < a_held
                    and not self._short(against, main_job(against), fair[1])):
                return Pick(fair[0], "fair share")
            s = self._overdue(level, ctx)
            if s is not None:
                return Pick(s, "waited past the bound")
            return None
        return None

    def _free(self, waiting: Waiting, ctx: Context) -> Pick | None:
        """For a consumer with no shape: the first level with a shape to give."""
        for _prio, level in waiting.ordered():
            due = self._due(level, ctx)
            if due is not None:
                return Pick(due[0], "deadline")
            fair = self._fair(level, ctx)
            if self._starved(fair, ctx):
                assert fair is not None
                return Pick(fair[0], "fair share")
            s = self._overdue(level, ctx)
            if s is not None:
                return Pick(s, "waited past the bound")
            if fair is not None:
                return Pick(fair[0], fair[2])
        return None
