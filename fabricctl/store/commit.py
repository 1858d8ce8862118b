"""The commit: one durable transaction for a prepared ingest, a prepared completion, or both.

Contract: `stage_steps(ingest, complete)` writes the plans into a new write transaction and
leaves it uncommitted (None: nothing to write): the ingest's rows, then the results and the
whole-segment deletes, then the meta counters they move (ledger, next segment, result
sequence, epochs), the records of the jobs whose counts or state moved (`JobTable.write`:
a job plan's operations too) and the records of the shapes finished since the last commit
(`FinishedShapes`). A completion whose batched result put meets an existing result is written
again one put at a time (the first result kept). `finish(staged)` commits it, on any thread
(False: the map filled while committing: `grow(staged)` on the staging thread, then stage
again); `committed(staged)`, once it is durable, moves the persisted ledger. With an ingest
in it, a full map past the ceiling is refused (`StoreFullError`); a completion alone may
grow the map into the drain headroom. Nothing else may write between staging and
`committed` (or a failed finish): one transaction at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmdb

from fabricctl.store.completion import _Conflict
from fabricctl.store.env import Staged
from fabricctl.store.faults import fault_point
from fabricctl.store.meta import PersistedLedger
from fabricctl.store.steps import Steps

if TYPE_CHECKING:
    from fabricctl.store.completion import CompletePlan, Completion
    from fabricctl.store.ingest import Ingest, IngestPlan
    from fabricctl.store.jobs import JobPlan
    from fabricctl.store.shapes import FinishedShapes
    from fabricctl.store.state import StoreState


@dataclass(slots=True)
class StagedCommit:
    """Why: the writer thread commits what the event loop staged; this is the handle."""

    txn_staged: Staged
    ingest: bool
    complete: bool
    drain: bool


class Commit:
    """Why: an ingest and a completion share one transaction; one place writes it whole."""

    def __init__(self, state: StoreState, ingest: Ingest, completion: Completion,
                 finished: FinishedShapes) -> None:
        self.state = state
        self.ingest = ingest
        self.completion = completion
        self.finished = finished

    def stage_steps(self, ingest: IngestPlan | None, complete: CompletePlan | None,
                    jobs: JobPlan | None = None) -> Steps[StagedCommit | None]:
        """Stage the plans, pausing after the ingest's rows, after the results and between
        parts of segment deletes, its transaction open meanwhile."""
        ing = ingest if ingest is not None and ingest.admits else None
        com = complete if complete is not None and complete.writes else None
        jp = jobs if jobs is not None and jobs.writes() else None
        if ing is None and com is None and jp is None and not (
                jobs is not None and self.finished.waiting()):
            return None  # nothing to write (a flush writes the finished shapes' records)
        now = max(ing.now if ing is not None else 0.0, com.now if com is not None else 0.0,
                  jp.now if jp is not None else 0.0)
        dbs = self.state.env.dbs
        meta = self.state.meta
        grown = ing.grown() if ing is not None and com is not None else {}

        def write(txn: lmdb.Transaction, batched: bool) -> Steps[PersistedLedger]:
            received = completed = (0, 0)
            if ing is not None:
                yield from self.ingest.ingest_rows(txn, ing)
                received = ing.received
                if com is not None:
                    yield
            if com is not None:
                completed = yield from self.completion.settle_steps(txn, com, batched, grown)
            self.state.jobs.write(  # the jobs whose counts or state moved
                txn, jp, now, ing.jobs if ing is not None else None,
                ing.job_shapes if ing is not None else None,
                com.jobs if com is not None else None,
                ing.job_models if ing is not None else None,
                ing.job_endpoints if ing is not None else None)
            self.finished.write(txn)  # the records of shapes finished since the last commit
            ledger = meta.ledger_after(received, completed)
            meta.write(txn, dbs["meta"], ledger=ledger,
                       next_seg=ing.next_seg if ing is not None else None,
                       rseq=com.seq if com is not None else None)
            for model, epoch in com.epochs.items() if com is not None else ():
                meta.write(txn, dbs["meta"], epoch=(model, epoch))
            for model, pace in com.paces.items() if com is not None else ():
                meta.write(txn, dbs["meta"], pace=(model, pace))
            return ledger

        drain = ing is None
        try:
            staged = yield from self.state.env.stage_steps(lambda txn: write(txn, True), drain)
        except _Conflict:  # an entry already has a result: one put at a time, first one kept
            staged = yield from self.state.env.stage_steps(lambda txn: write(txn, False), drain)
        return StagedCommit(staged, ing is not None, com is not None, drain)

    def finish(self, staged: StagedCommit) -> bool:
        """Commit the staged transaction (any thread); False: the map filled meanwhile."""
        return self.state.env.finish(staged.txn_staged, staged.drain)

    def grow(self, staged: StagedCommit) -> None:
        """Grow the map after a `finish` that found it full (on the thread that stages)."""
        self.state.env.grow(staged.drain)

    def committed(self, staged: StagedCommit) -> None:
        """The staged transaction is durable: the persisted counters move."""
        self.state.meta.ledger = staged.txn_staged.result  # type: ignore[assignment]
        self.finished.committed()
        self.state.jobs.committed()
        if staged.ingest:
            fault_point("ingest_after_commit")
        if staged.complete:
            fault_point("complete_after_commit")
