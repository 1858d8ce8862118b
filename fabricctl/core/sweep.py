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
own shapes from their segments, and are swept again. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

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
