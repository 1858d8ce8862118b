"""The sweep: a job's loose shapes share the batches of its swept shape.

Contract: a shape is *loose* (`loose`) when it is staged, nobody holds or warms it, it is not
itself a swept shape, every job with items in it has ended its input (it can grow no more),
and its queued items fill at most half a batch (tokens <= half the model's batch budget).
Whatever the choice does, such a shape's whole run is one part-empty batch: a GPU that
switches to it alone pays a pull, a completion and a switch for it and buys no cache hit
that a shared batch would not give. (A shape of more than half a batch runs alone: its
batch is mostly its own anyway, and in a shared lane it could straddle two batches, whose
second half, on another GPU or after an eviction, would compute its prefix again.)

Each job has one open *swept shape* per model, keyed by `swept_signature(job)`: an ordinary
shape for the choice (its job's terms, fair share, the bound), whose batches mix signatures
(`Batch.mixed`; the shape guard checks no signature for them, and each item keeps its own
signature and label, its segment's). `move(src, dst, now)` takes every queued entry of `src`
into one lane of `dst` (the lane its longest entry fits), in their order, so its items stay
together and leave in one batch or in adjacent ones (their prefix computed once, as alone);
the counts of both shapes and of their jobs move with them, the ledger's do not (the items
stay queued). After a restart the entries come back to their
own shapes from their segments, and are swept again. `Sweeper.sweep(ms, pick, now)` is the
step the lifecycle's choice takes for a loose pick: that shape and every other loose shape
of its main job at its priority move into the job's swept shape, which is picked instead;
each moved shape finishes (`retire`) without a record or an event of its own, and one
`SWEEP` event names how many it took. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fabricctl.core.choice import Pick, main_job, shape_terms
from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.model_state import ModelState
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.signature import component_hash
from fabricctl.core.terms import NO_TERMS, JobTerms
from fabricctl.core.types import Entry

SWEPT_LABEL = "(swept)"  # the label of every swept shape


def swept_signature(job: int) -> int:
    """The key of a job's swept shape (no prompt's signature: it hashes no prompt text)."""
    return component_hash(f"\x00fabricctl swept shape of job {job}")


def loose(shape: Shape, terms: Mapping[int, JobTerms], budget: int) -> bool:
    """Staged, unheld, not swept, sealed, and at most half a batch of `budget` tokens."""
    return (shape.state is ShapeState.STAGED and shape.held == 0 and not shape.swept
            and 0 < 2 * shape.tokens <= budget and bool(shape.jobs)
            and all(terms.get(j, NO_TERMS).sealed for j in shape.jobs))


def move(src: Shape, dst: Shape, now: float) -> int:
    """Move every queued entry of `src` into one lane of `dst`; returns the tokens moved."""
    entries: list[Entry] = []
    for lane in src.lanes.lanes.values():
        if lane.queue:
            entries.extend(lane.queue)
            lane.queue.clear()
            lane.tokens = 0
    if not entries:
        return 0
    ns = [e.tokens for e in entries]
    tokens = sum(ns)
    lane = dst.lanes.assign(max(ns), now)
    lane.queue.extend(entries)
    lane.tokens += tokens
    src.tokens -= tokens
    src.items -= len(entries)
    src.count_jobs(entries, -1)
    dst.tokens += tokens
    dst.items += len(entries)
    dst.lengths.add_many(ns)
    dst.count_jobs(entries, 1)
    since = src.staged_since
    if since is not None and (dst.staged_since is None or since < dst.staged_since):
        dst.staged_since = since
    return tokens

OpenSwept = Callable[[str, int, float], Shape]  # (model, job, now) -> its open swept shape


class Sweeper:
    """Why: the lifecycle's choice hands a loose pick here; the sweep is its own step, with
    its own event, between the choice and the take."""

    def __init__(self, cfg: CoreConfig, terms: Mapping[int, JobTerms], log: EventLog,
                 open_swept: OpenSwept | None, index: Callable[[ModelState, Shape], None]
                 ) -> None:
        self.cfg, self.terms, self.log = cfg, terms, log
        self.open_swept = open_swept  # a job's open swept shape (the intake's)
        self.index = index  # the lifecycle's: a shape with work waits for a holder

    def loose(self, ms: ModelState, shape: Shape) -> bool:
        """Loose, with the sweep on and a swept shape to open."""
        return (self.cfg.sweep and self.open_swept is not None
                and loose(shape, self.terms, ms.budget))

    def sweep(self, ms: ModelState, pick: Pick, now: float) -> Pick:
        """The picked shape is loose (`core.sweep`): rather than switch a GPU to it alone,
        move it and every other loose shape of its main job at its priority into the job's
        swept shape, and pick that instead (not while it is warming for a consumer)."""
        assert self.open_swept is not None
        job = main_job(pick.shape)
        dst = self.open_swept(ms.name, job, now)
        if dst.state not in (ShapeState.STAGED, ShapeState.ACTIVE):
            return pick
        prio = shape_terms(pick.shape, self.terms)[0]
        level = ms.waiting.levels.get(prio)
        heap = None if level is None else level.by_job.get(job)
        # one pass over the job's candidates: it leaves none of them loose at this priority,
        # so the next sweep of this job needs shapes that became loose since (amortised)
        others = [] if heap is None else [
            s for s in heap.shapes() if s is not pick.shape and self.loose(ms, s)
            and shape_terms(s, self.terms)[0] == prio]
        moved = 0
        for src in (pick.shape, *others):
            moved += move(src, dst, now)
            self.retire(ms, src, now)
        swept = 1 + len(others)
        self.index(ms, dst)
        self.log.emit(now, EventKind.SWEEP, model=ms.name, signature=dst.signature,
                      label=dst.label, value=swept,
                      reason=f"job {job}: {swept} loose shapes, {moved} tokens")
        return Pick(dst, f"{pick.why}; {swept} loose shapes swept")

    def retire(self, ms: ModelState, shape: Shape, now: float) -> None:
        """A staged shape whose items were all swept finishes without running. It leaves no
        record and no event of its own (its items run and are counted in its job's swept
        shape; the sweep's one event names how many shapes it took)."""
        if ms.open.get(shape.signature) is shape:
            del ms.open[shape.signature]
        shape.lanes.release_idle()
        shape.finished_at = now
        shape.set_state(ShapeState.FINISHED, now)
