"""A shape — the pair (model, signature) — with its lanes, its state and its statistics.

Contract: every structure of the broker hangs off one `Shape`; nothing is shared across
shapes. `tokens`/`items` count what is queued and dispatchable (or staged), `inflight_*`
what consumers hold. A shape object lives from staged to finished; items arriving for a
draining shape's key start a new staged shape object for the same key.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from fabricctl.core.config import CoreConfig
from fabricctl.core.entry_queue import INF
from fabricctl.core.lanes import Lane, LaneCounters, LaneSet
from fabricctl.core.stats import LengthHistogram
from fabricctl.core.types import Entry


class ShapeState(StrEnum):
    """Why: the lifecycle is a state machine with thresholds, not a heuristic."""

    STAGED = "staged"
    WARMING = "warming"
    ACTIVE = "active"
    DRAINING = "draining"
    FINISHED = "finished"


SHAPE_STATES: tuple[ShapeState, ...] = tuple(ShapeState)


class JobTally:
    """Why: the choice weighs a job's whole queue (shortest first), which spans shapes."""

    __slots__ = ("items", "tokens")

    def __init__(self) -> None:
        self.items: dict[int, int] = {}  # job -> its items queued in every shape
        self.tokens: dict[int, int] = {}  # job -> their input tokens

    def add(self, job: int, items: int, tokens: int) -> None:
        n = self.items.get(job, 0) + items
        if n > 0:
            self.items[job] = n
            self.tokens[job] = self.tokens.get(job, 0) + tokens
        else:
            self.items.pop(job, None)
            self.tokens.pop(job, None)


class Shape:
    """Why: the unit the GPU's prefix cache pays for, so the unit everything is keyed by."""

    __slots__ = (
        "activated_at",
        "batches",
        "cache_achievable",
        "cache_hits",
        "cache_queries",
        "consumers",
        "created",
        "epoch",
        "fifo_by",
        "finished_at",
        "gpus",
        "held",
        "history",
        "inflight_items",
        "inflight_tokens",
        "items",
        "jobs",
        "label",
        "lanes",
        "lengths",
        "model",
        "padded_tokens",
        "routed_tokens",
        "served_at",
        "served_items",
        "signature",
        "staged_since",
        "state",
        "stats",
        "swept",
        "tally",
        "thrash",
        "tokens",
        "wver",
    )

    def __init__(
        self,
        model: str,
        signature: int,
        label: str,
        cfg: CoreConfig,
        counters: LaneCounters,
        now: float,
        state: ShapeState = ShapeState.STAGED,
        tally: JobTally | None = None,
    ) -> None:
        self.model = model
        self.signature = signature
        self.label = label
        self.state = state
        self.lanes = LaneSet(cfg, counters)
        self.epoch = 0
        self.tokens = 0
        self.items = 0
        self.inflight_tokens = 0
        self.inflight_items = 0
        self.batches = 0
        self.padded_tokens = 0  # batch slots sent (count x pad_to), for the waste figure
        self.routed_tokens = 0  # real input tokens sent
        self.served_items = 0  # items sent in batches (not taken back by a failure)
        self.consumers: set[str] = set()  # every consumer a batch of this shape went to
        self.gpus: set[int] = set()  # every GPU a completed batch reported running it on
        self.cache_queries = 0  # prompt tokens engines looked up for this shape
        self.cache_hits = 0  # of which the engines' prefix caches really held
        self.cache_achievable = 0  # what the declared prefixes allow at the engines' blocks
        self.created = now
        self.staged_since: float | None = None  # arrival of the oldest item since staging
        self.activated_at: float | None = None
        self.finished_at: float | None = None
        self.history: list[tuple[float, str]] = [(now, state.value)]
        self.lengths = LengthHistogram()  # every item ever assigned
        self.stats: LengthHistogram | None = None  # the copy taken at activation
        self.jobs: dict[int, int] = {}  # job -> its items queued here (the choice's terms)
        self.tally = JobTally() if tally is None else tally  # every shape's, per job (shared)
        self.held = 0  # holders (consumer slots, or a model) whose current shape this is
        self.wver = 0  # version of its entries in the waiting index (`core.waiting`)
        self.served_at: float | None = None  # when a batch of it last went out
        self.fifo_by: float | None = None  # when arrival order would have served it (the
        # derived wait bound never calls it overdue before then)
        self.swept = False  # a job's swept shape (`core.sweep`): its batches mix signatures
        self.thrash = ""  # set as it finishes: why it thrashed ("": it did not; `stats`)

    @property
    def key(self) -> tuple[str, int]:
        return (self.model, self.signature)

    def set_state(self, state: ShapeState, now: float) -> None:
        self.state = state
        self.history.append((now, state.value))

    def waste(self) -> float:
        """Padding fraction of everything this shape has dispatched."""
        if self.padded_tokens == 0:
            return 0.0
        return 1.0 - self.routed_tokens / self.padded_tokens

    def audit(self, min_queries: int = 4096, ratio: float = 0.5) -> tuple[float, float, bool]:
        """The cache-truth audit: (real hit rate, achievable rate, flagged).

        Flagged when, over enough lookups, the engines really hit less than `ratio` of what
        the declared prefixes allow: the producer declared components that are not a
        token-identical prefix of its prompts (or something evicts them).
        """
        q = self.cache_queries
        if q == 0:
            return 0.0, 0.0, False
        real, achievable = self.cache_hits / q, self.cache_achievable / q
        flagged = q >= min_queries and achievable > 0.05 and real < ratio * achievable
        return real, achievable, flagged

    def pick_lane(self) -> Lane | None:
        """Quiescing lanes first (force-drain), then the lane with the most queued tokens."""
        best: Lane | None = None
        most = -1
        for lane in self.lanes.lanes.values():
            t = lane.tokens
            if (t > most or lane.quiescing) and lane.queue:  # only then its queue matters
                if lane.quiescing:
                    return lane
                best, most = lane, t
        return best

    def count_jobs(self, entries: Iterable[Entry], sign: int) -> None:
        """Queued entries joined (`sign` 1) or left (-1) this shape: their jobs' counts
        (one `count_job` per job, in order of first appearance)."""
        if isinstance(entries, list) and entries:
            jobs = {e.job for e in entries}
            if len(jobs) == 1:  # the common batch: one job, one update
                tokens = sum([e.tokens for e in entries])
                self.count_job(jobs.pop(), sign * len(entries), sign * tokens)
                return
        by_job: dict[int, list[int]] = {}
        for e in entries:
            c = by_job.get(e.job)
            if c is None:
                by_job[e.job] = [1, e.tokens]
            else:
                c[0] += 1
                c[1] += e.tokens
        for job, (n, tokens) in by_job.items():
            self.count_job(job, sign * n, sign * tokens)

    def count_job(self, job: int, n: int, tokens: int) -> None:
        """`n` queued entries of one job, of `tokens` in all, joined (n > 0) or left (n < 0,
        tokens negative) this shape."""
        jobs = self.jobs
        m = jobs.get(job, 0) + n
        if m > 0:
            jobs[job] = m
        else:
            jobs.pop(job, None)
        self.tally.add(job, n, tokens)

    def oldest_t(self) -> float | None:
        """Arrival of its oldest queued item (lanes queue in arrival order, failed-back
        items in front), None when nothing is queued."""
        oldest = min([la.queue.head for la in self.lanes.lanes.values()], default=INF)
        return None if oldest == INF else oldest

    def waiting_since(self) -> float | None:
        """Since when it waits for a GPU: its oldest queued item's arrival, or the last
        time a batch of it went out when that is later (a shape served a moment ago is not
        starving, however old its queue). None when nothing is queued."""
        oldest = self.staged_since if self.state is ShapeState.STAGED else self.oldest_t()
        if oldest is None or self.served_at is None:
            return oldest
        return max(oldest, self.served_at)

    def idle(self) -> bool:
        """Nothing queued and nothing in flight."""
        return self.items == 0 and self.inflight_items == 0
