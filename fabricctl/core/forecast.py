"""Each job's place in the fleet: its oldest wait, its share, its predicted finish.

Contract: `job_views(shapes, held, consumers, terms, rate, now)` gives one `JobView` per job
with queued items in the live `shapes`: queued items and tokens (a shape's tokens split
between its jobs by their items), the oldest wait among the shapes holding its items, its
holders (`held`: consumers whose current shape holds its items) and share of the
`consumers`, and a predicted finish at the fleet's measured `rate` (tokens per second; None
while unmeasured). The prediction follows the shape choice: every job of a higher priority,
or of the same priority and an earlier deadline, goes first; jobs of one class share the
fleet, so a job finishes after each peer's tokens up to its own (processor sharing). A job
whose predicted finish is after its deadline is `at_risk`. Pure: `now` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import msgspec

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


def _oldest(shape: Shape) -> float | None:
    return shape.staged_since if shape.state is ShapeState.STAGED else shape.oldest_t()


def job_views(shapes: Iterable[Shape], held: Mapping[int, int], consumers: int,
              terms: Mapping[int, JobTerms], rate: float | None, now: float
              ) -> list[JobView]:
    """One view per job with queued items, by job number."""
    views: dict[int, JobView] = {}
    tokens: dict[int, float] = {}
    for shape in shapes:
        if not shape.items or not shape.jobs:
            continue
        oldest = _oldest(shape)
        wait = 0.0 if oldest is None else max(0.0, now - oldest)
        for job, n in shape.jobs.items():
            v = views.get(job)
            if v is None:
                t = terms.get(job, NO_TERMS)
                v = views[job] = JobView(job, t.priority, t.deadline)
            v.queued_items += n
            tokens[job] = tokens.get(job, 0.0) + shape.tokens * n / shape.items
            v.oldest_wait_s = max(v.oldest_wait_s, round(wait, 3))
    for job, v in views.items():
        v.queued_tokens = round(tokens[job])
        v.holders = held.get(job, 0)
        v.share = round(v.holders / consumers, 3) if consumers else 0.0
    if rate:
        for v in views.values():
            klass = (-v.priority, math.inf if v.deadline is None else v.deadline)
            ahead = 0.0
            for o in views.values():
                ok = (-o.priority, math.inf if o.deadline is None else o.deadline)
                if ok < klass:
                    ahead += o.queued_tokens
                elif ok == klass:
                    ahead += min(o.queued_tokens, v.queued_tokens)
            v.predicted_finish = round(now + ahead / rate, 3)
            v.at_risk = v.deadline is not None and v.predicted_finish > v.deadline
    return [views[j] for j in sorted(views)]
