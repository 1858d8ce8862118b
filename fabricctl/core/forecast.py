"""Each job's place in the fleet: its oldest wait, its share, its predicted finish.

Contract: `job_views(shapes, held, consumers, terms, rate, now, hopeless)` gives one
`JobView` per job with queued items in the live `shapes`: queued items and tokens (a
shape's tokens split between its jobs by their items), the oldest wait among the shapes
holding its items, its holders (`held`: consumers whose current shape holds its items) and
share of the `consumers`, and a predicted finish at the fleet's measured `rate` (tokens per
second; None while unmeasured). The prediction follows the shape choice: every job of a
higher priority, or of the same priority and an earlier deadline, goes first; jobs of one
class share the fleet, so a job finishes after each peer's tokens up to its own (processor
sharing); a `hopeless` job (its window cannot be met even served first:
`Broker.judge_windows`) goes as one without a deadline. A job whose predicted finish at a
`trusted` rate (`core.pace.forecast_rate`: settled, or the last run's pace; not the first
seconds' floored measurement) is after its deadline, or that is hopeless, is `at_risk`; a
`RiskWatch` announces each job that becomes at risk once (a critical `JOB_AT_RISK` event
naming the predicted finish).
This is the one forecast of a job's finish: `finish_in(place, now)` (seconds to go, None
without a prediction) is what `top`'s job lines, `jobs show` (and its JSON `eta_s`) and the
`jobs` list show, so no reader prints a second, disagreeing figure. A job whose file is
still being read (`JobTerms.reading`), or that waits for such a job, has no predicted finish
until that input is whole.
Pure: `now` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping

import msgspec

from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.terms import NO_TERMS, JobTerms


class JobView(msgspec.Struct, omit_defaults=True):
    """Why: `jobs`, `top` and the metrics say where a job stands, not only what it is."""

    job: int
    priority: int = 0
    deadline: float | None = None
    queued_items: int = 0
    queued_tokens: int = 0
    oldest_wait_s: float = 0.0
    holders: int = 0
    share: float = 0.0  # holders / consumers of its model(s)
    predicted_finish: float | None = None  # unix seconds at the measured rate
    at_risk: bool = False  # predicted to finish after its deadline


def job_views(shapes: Iterable[Shape], held: Mapping[int, int], consumers: int,
              terms: Mapping[int, JobTerms], rate: float | None, now: float,
              hopeless: Container[int] = (), trusted: bool = True) -> list[JobView]:
    """One view per job with queued items, by job number."""
    # One pass over the shapes (thousands at scale, most of one job): per job its queued
    # items, tokens and oldest arrival. The oldest wait is taken once per job from the
    # oldest arrival: `round(max(0, now - t), 3)` only grows as `t` falls, so it is the
    # largest of the shapes' waits.
    acc: dict[int, list[float]] = {}  # job -> [items, tokens, oldest arrival]
    staged = ShapeState.STAGED
    inf = math.inf
    for shape in shapes:
        items = shape.items
        jobs = shape.jobs
        if not items or not jobs:
            continue
        oldest = shape.staged_since if shape.state is staged else shape.oldest_t()
        t = inf if oldest is None else oldest
        st = shape.tokens
        for job, n in jobs.items():
            a = acc.get(job)
            if a is None:
                acc[job] = [n, st * n / items, t]
            else:
                a[0] += n
                a[1] += st * n / items
                if t < a[2]:
                    a[2] = t
    views: dict[int, JobView] = {}
    for job, (count, tok, first) in acc.items():
        terms_ = terms.get(job, NO_TERMS)
        v = views[job] = JobView(job, terms_.priority, terms_.deadline)
        v.queued_items = int(count)
        v.oldest_wait_s = 0.0 if first == inf else round(max(0.0, now - first), 3)
        v.queued_tokens = round(tok)
        v.holders = held.get(job, 0)
        v.share = round(v.holders / consumers, 3) if consumers else 0.0
    if rate:
        reading = {job for job in views if terms.get(job, NO_TERMS).reading}
        for v in views.values():
            v.at_risk = v.deadline is not None and v.job in hopeless
            klass = _klass(v, hopeless)
            ahead = 0.0
            for o in views.values():
                ok = _klass(o, hopeless)
                if ok < klass:
                    ahead += o.queued_tokens
                elif ok == klass:
                    ahead += min(o.queued_tokens, v.queued_tokens)
                else:
                    continue
                if o.job in reading:  # a job it waits for (or itself) is not whole yet
                    break
            else:
                v.predicted_finish = round(now + ahead / rate, 3)
                v.at_risk = v.deadline is not None and (
                    (trusted and v.predicted_finish > v.deadline) or v.job in hopeless)
    return [views[j] for j in sorted(views)]


def _klass(v: JobView, hopeless: Container[int]) -> tuple[int, float]:
    """The order the shape choice serves a job in: priority, then deadline (none, or one
    that cannot be met: last)."""
    return -v.priority, math.inf if v.deadline is None or v.job in hopeless else v.deadline


def finish_in(place: JobView | None, now: float) -> float | None:
    """Seconds from `now` to the job's predicted finish (never below 0), or None while it
    has none (nothing queued, or no rate measured yet)."""
    if place is None or place.predicted_finish is None:
        return None
    return max(0.0, place.predicted_finish - now)


class RiskWatch:
    """Why: a job predicted to miss its deadline says so once, with a critical event, when
    it becomes at risk, not at every tick while it stays so."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.jobs: set[int] = set()  # the jobs at risk at the last update

    def update(self, views: list[JobView], now: float) -> None:
        risky = {v.job: v for v in views if v.at_risk}
        said = set()  # at risk and said (a job at risk before it has a finish: once it has)
        for job, v in risky.items():
            if job in self.jobs:
                said.add(job)
            elif v.deadline is not None and v.predicted_finish is not None:
                said.add(job)
                self.events.emit(
                    now, EventKind.JOB_AT_RISK, value=job, critical=True,
                    reason=f"job {job} is predicted to finish at {v.predicted_finish:.0f}, "
                    f"{v.predicted_finish - v.deadline:.0f}s after its deadline "
                    f"({v.queued_items} items queued)")
        self.jobs = said
