"""One group commit's work as the writer carries it: taken, prepared, staged, committed,
applied, answered.

Contract: a `Cycle` holds the submits, completions and job operations it took (each with the
future its sender waits on), their prepared plans, the staged transaction and the running
commit. A refused ingest (`refuse_ingest`) leaves the completions and job operations to
commit alone. `answer_chunks` splits the rejects of the flattened submits back into each
chunk's own indexes; `fail_all` fails futures nobody may be waiting on any more without
leaving them unretrieved."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fabricctl.core.types import Item
from fabricctl.store.dispatch import Completed
from fabricctl.wire.protocol import Reject

if TYPE_CHECKING:
    from fabricctl.core.jobs import JobRecord
    from fabricctl.store.commit import StagedCommit
    from fabricctl.store.completion import CompletePlan
    from fabricctl.store.ingest import IngestPlan
    from fabricctl.store.jobs import JobOp, JobPlan


@dataclass(eq=False)
class Cycle:
    """Why: the next cycle is prepared while this one commits, so its state travels."""

    chunks: list[tuple[list[Item], asyncio.Future[list[Reject]]]]
    done: list[tuple[Completed, asyncio.Future[int]]]
    ops: list[tuple[JobOp, asyncio.Future[JobRecord | str]]] = field(default_factory=list)
    ingest_plan: IngestPlan | None = None
    complete_plan: CompletePlan | None = None
    jobs_plan: JobPlan | None = None
    refused: BaseException | None = None  # why the store refused the ingest
    staged: StagedCommit | None = None
    commit: asyncio.Future[bool] | None = field(default=None, repr=False)
    failed: bool = False
    ingested: bool = False  # its ingest was committed and applied

    def refuse_ingest(self, e: BaseException) -> bool:
        """The store refused the ingest: go on with the completions alone; False when there
        are none to go on with (the cycle fails)."""
        rest = (self.complete_plan is not None and self.complete_plan.writes) or (
            self.jobs_plan is not None and self.jobs_plan.writes())
        if self.ingest_plan is None or not rest:
            return False
        self.refused, self.ingest_plan = e, None
        return True

    def answer_done(self, stored: list[int]) -> None:
        for (_, fut), n in zip(self.done, stored, strict=True):
            if not fut.done():
                fut.set_result(n)

    def answer_ops(self, replies: list[JobRecord | str]) -> None:
        for (_, fut), r in zip(self.ops, replies, strict=True):
            if not fut.done():
                fut.set_result(r)


def answer_chunks(chunks: list[tuple[list[Item], Any]], rejects: list[Any],
                  stored: set[int] | frozenset[int] = frozenset()) -> None:
    """Split the rejects of the flattened chunks back into each chunk's own indexes (those
    whose flattened index is in `stored` are marked `stored`)."""
    out: list[list[Reject]] = [[] for _ in chunks]
    starts, pos = [], 0
    for c, _ in chunks:
        starts.append(pos)
        pos += len(c)
    ci = 0
    for r in rejects:
        while ci + 1 < len(starts) and r.index >= starts[ci + 1]:
            ci += 1
        out[ci].append(Reject(r.index - starts[ci], r.reason, r.index in stored))
    for (_, fut), rs in zip(chunks, out, strict=True):
        if not fut.done():
            fut.set_result(rs)


def fail_all(futs: list[asyncio.Future[Any]], e: BaseException) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(e)
            fut.exception()  # a waiter that went away must not leave it unretrieved
