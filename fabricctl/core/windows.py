"""The deadlines' side of the broker: the fleet's measured rate and the windows it can meet.

Contract:
- `serving(model)`: the consumers serving a model; `paces(now)`: each model's pace to keep
  for the next run (`core.pace`, where the measured rates are);
- `verdict(now)`: the windows that cannot be met even served first (`choice.hopeless`), a
  read; `judge(now)` applies it: such a job's deadline stops counting in the shape choice,
  a critical `JOB_HOPELESS` event says so once, and it counts again if the fleet catches
  up; `judged` is when that last ran (the broker judges at the tick and at completions
  `JUDGE_S` apart);
- `job_views(now)`: each job with queued items, its holders, share and predicted finish
  (`core.forecast`, with the windows out of reach as of `now`); `risk` says once each job
  newly predicted to miss its deadline.
Pure: time is always an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fabricctl.core.choice import hopeless
from fabricctl.core.config import CoreConfig
from fabricctl.core.context import held_jobs
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.forecast import JobView, RiskWatch, job_views
from fabricctl.core.intake import Intake
from fabricctl.core.lifecycle import Lifecycle
from fabricctl.core.model_state import ModelState
from fabricctl.core.pace import forecast_rate, known_rate, pace
from fabricctl.core.serving import serves
from fabricctl.core.shape import Shape
from fabricctl.core.terms import JobTerms
from fabricctl.core.tracking import ConsumerState


@dataclass
class Verdict:
    """Why: which windows are out of reach, judged once, read by the judge and the forecast."""

    hopeless: set[int]  # the jobs whose window cannot be met even served first
    rate: float | None  # the fleet's known rate (tokens/s) it was judged on
    need: dict[int, float] = field(default_factory=dict)  # a hopeless job's seconds to finish


@dataclass(eq=False)
class Windows:
    """Why: the rate the fleet shows and the deadlines it can still meet, judged in one place."""

    cfg: CoreConfig
    models: Mapping[str, ModelState]
    consumers: Mapping[str, ConsumerState]
    terms: Mapping[int, JobTerms]
    intake: Intake
    lifecycle: Lifecycle
    events: EventLog
    shapes: Callable[[], list[Shape]]
    risk: RiskWatch = field(init=False)  # jobs predicted to miss their deadline (said once)
    judged: float = float("-inf")  # when the windows were last judged (`judge`)

    def __post_init__(self) -> None:
        self.risk = RiskWatch(self.events)

    def serving(self, model: str) -> int:
        """Consumers serving `model` (at least one counted by the rates)."""
        return sum(1 for c in self.consumers.values() if serves(c, model))

    def paces(self, now: float) -> dict[str, float]:
        """Each model's pace to keep for the next run (`core.pace.pace`), by model."""
        return {ms.name: p for ms in self.models.values()
                if (p := pace(ms, self.serving(ms.name), now)) is not None}

    def verdict(self, now: float) -> Verdict:
        """The windows that cannot be met even served first (`choice.hopeless`: a job's
        queued tokens at the fleet's rate, one switch counted unless a GPU serves it, end
        after its deadline), on a known rate (`core.pace.known_rate`: settled, or the pace
        of the last run; the best whole second the meters saw lately, `RateMeter.peak`, when
        higher). Without a rate, the last judgement stands. A read: nothing changes."""
        rates = [(ms, r, self.serving(ms.name)) for ms in self.models.values()
                 if (r := known_rate(ms, self.serving(ms.name), now)) is not None]
        rate = sum(r for _, r, _ in rates) if rates else None
        if rate is not None:  # the best the fleet has shown lately, if better (optimistic:
            # a rate measured while inputs are still read, or behind a pipeline, is low)
            rate = max(rate, sum(p for ms in self.models.values()
                                 if (p := ms.meter.peak(now)) is not None))
        # a switch costs about a batch: the new shape's prefix is prefilled
        switch_s = max((ms.budget * max(1, n) / r for ms, r, n in rates), default=0.0)
        tokens = self.intake.tally.tokens  # each job's queued tokens, over every shape
        served = {job for ms in self.models.values()  # no switch to a job some GPU serves
                  for job in held_jobs(self.cfg, ms, self.consumers)}
        out = Verdict(set(), rate)
        for job, t in self.terms.items():
            if t.deadline is None or job not in tokens:
                continue  # (a window already past stays given up while work is queued)
            switch = 0.0 if job in served else switch_s
            if rate is None:
                if job in self.lifecycle.chooser.hopeless:
                    out.hopeless.add(job)
            elif hopeless(tokens[job], t.deadline, rate, switch, now):
                out.hopeless.add(job)
                out.need[job] = switch + tokens[job] / rate
        return out

    def judge(self, now: float) -> None:
        """Apply `verdict(now)`: a window out of reach stops counting in the shape choice
        (it is served after the windows that still can be met, by its priority), a critical
        `JOB_HOPELESS` event says so once, and it counts again if the fleet catches up."""
        chooser = self.lifecycle.chooser
        self.judged = now
        v = self.verdict(now)
        for job in v.hopeless - chooser.hopeless:
            deadline = self.terms[job].deadline
            assert deadline is not None
            self.events.emit(
                now, EventKind.JOB_HOPELESS, value=job, critical=True,
                reason=f"job {job} cannot finish by its deadline even served first: it needs "
                f"{v.need.get(job, 0.0):.1f}s at the fleet's rate, {deadline - now:.1f}s are "
                f"left; it is served after the windows that can still be met")
        changed = v.hopeless ^ chooser.hopeless
        chooser.hopeless = v.hopeless
        for job in changed:
            for ms in self.models.values():
                for shape in ms.waiting.with_job(job):
                    self.lifecycle.index(ms, shape)

    def job_views(self, now: float) -> list[JobView]:
        """Each job with queued items: its oldest wait, holders and share of the fleet, and
        its predicted finish at the measured rate (`core.forecast`)."""
        held: dict[int, int] = {}
        for ms in self.models.values():
            for job, n in held_jobs(self.cfg, ms, self.consumers).items():
                held[job] = held.get(job, 0) + n
        rate, trusted = forecast_rate(self.models.values(), self.serving, now)
        # the windows out of reach as of now, not as of the last judgement: a job's forecast
        # never counts one ahead of it that will be served after it
        return job_views(self.shapes(), held, len(self.consumers), self.terms,
                         rate, now, self.verdict(now).hopeless, trusted)
