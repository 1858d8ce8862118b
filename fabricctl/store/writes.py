"""The store's writes in their steps, for a writer that commits off its event loop.

Contract: a `WriteSteps` (a store's `steps`) carries each write through prepare, commit and
apply, so the server's writer can prepare on its event loop, commit on a thread of its own,
and serve sockets at each pause; everyone else calls the store's one form per operation
(`DurableBroker.ingest`, `submit`, `complete`, `complete_many`, the job operations), which
runs these steps in a row.
- prepare: `ingest(items, now, landing, after)` (screen, place and encode a chunk),
  `complete(done, now)` (encode the results of the batches still in flight and mark them
  settling: a disconnect leaves them alone until apply or abort), `jobs(ops, now, into)`
  (new records and changes; a cancel's or an expiry's withdrawn entries with their error
  results go into `into`, a completion plan of the same commit, or a new one). Nothing is
  written yet.
- commit: `stage(ingest, complete, jobs)` writes the plans into a new transaction, not
  committed yet (None: nothing to write); `finish(staged)` commits it and touches LMDB only,
  so it may run on any thread (False: the map filled meanwhile: `grow` on the staging
  thread, then stage again); `committed(staged)` moves the persisted counters. `commit(...)`
  runs the three in a row. With an ingest in it, a full map past the ceiling is refused
  (`StoreFullError`); a completion alone may grow the map into the drain headroom.
- apply, once durable: `apply_ingest(plan, now)` makes the new entries dispatchable and
  returns the rejects; `apply_complete(plan, now)` settles the batches in the core and
  returns the results stored per batch; `apply_jobs(plan)` the job records (or why each
  operation was refused). After a failed commit: `abort_complete` (a batch whose consumer
  left meanwhile goes back to its lane) and `abort_jobs`.
The long steps are generators that pause between parts (`fabricctl.store.steps`); run them
with `run_steps` (or the server's `run_steps_async`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabricctl.store.steps import Steps, run_steps

if TYPE_CHECKING:
    from fabricctl.core.jobs import JobRecord
    from fabricctl.core.types import Item
    from fabricctl.store.commit import Commit, StagedCommit
    from fabricctl.store.completion import CompletePlan, Completion
    from fabricctl.store.dispatch import Completed, Dispatch
    from fabricctl.store.ingest import Ingest, IngestPlan, Refused
    from fabricctl.store.jobops import JobOps
    from fabricctl.store.jobs import JobOp, JobPlan, JobTable


class WriteSteps:
    """Why: the prepare/commit/apply split is the writer's business; it lives here, apart
    from the store's one public form per operation."""

    def __init__(self, ingest: Ingest, completion: Completion, dispatch: Dispatch,
                 jobops: JobOps, table: JobTable, commit: Commit) -> None:
        self._ingest, self._completion, self._dispatch = ingest, completion, dispatch
        self._jobops, self._table, self._commit = jobops, table, commit

    # -- prepare ----------

    def ingest(self, items: list[Item], now: float, landing: bool = False,
               after: IngestPlan | None = None) -> Steps[IngestPlan]:
        return self._ingest.ingest_steps(items, now, landing, after)

    def complete(self, done: list[Completed], now: float) -> Steps[CompletePlan]:
        return self._completion.complete_steps(done, now)

    def jobs(self, ops: list[JobOp], now: float, into: CompletePlan | None = None
             ) -> tuple[JobPlan, CompletePlan | None]:
        return self._jobops.prepare(ops, now, into)

    # -- commit ----------

    def stage(self, ingest: IngestPlan | None, complete: CompletePlan | None,
              jobs: JobPlan | None = None) -> Steps[StagedCommit | None]:
        return self._commit.stage_steps(ingest, complete, jobs)

    def finish(self, staged: StagedCommit) -> bool:
        return self._commit.finish(staged)

    def grow(self, staged: StagedCommit) -> None:
        self._commit.grow(staged)

    def committed(self, staged: StagedCommit) -> None:
        self._commit.committed(staged)

    def commit(self, ingest: IngestPlan | None = None, complete: CompletePlan | None = None,
               jobs: JobPlan | None = None) -> None:
        """Stage, finish (growing a map that filled meanwhile) and mark committed, in a row."""
        while (staged := run_steps(self.stage(ingest, complete, jobs))) is not None:
            if self.finish(staged):
                self.committed(staged)
                return
            self.grow(staged)

    # -- apply ----------

    def apply_ingest(self, plan: IngestPlan, now: float) -> Steps[list[Refused]]:
        return self._ingest.apply_ingest_steps(plan, now)

    def apply_complete(self, plan: CompletePlan, now: float) -> Steps[list[int]]:
        return self._completion.apply_complete_steps(plan, now)

    def abort_complete(self, plan: CompletePlan, now: float) -> None:
        self._dispatch.abort_complete(plan, now)

    def apply_jobs(self, plan: JobPlan) -> list[JobRecord | str]:
        self._table.release(plan)
        return self._table.replies(plan)

    def abort_jobs(self, plan: JobPlan) -> None:
        self._table.release(plan)
