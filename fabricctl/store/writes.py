"""The store's writes in their steps (prepare, commit, apply), for a writer off its event loop.

Contract: a `WriteSteps` (a store's `steps`) is the one route of every write into the store.
`write(now, items, done, ops)` runs one cycle in a row for a caller without a writer (prepare, one
commit if anything is written, apply; a failed commit aborts the completions and job operations)
and returns a `Written`: the ingest's rejects and the indexes already stored (`resume_skip`), the
results stored per batch (-1: not in flight), each job operation's record or refusal.
- prepare, writing nothing: `ingest(items, now, landing, after)` screens, places and encodes a
  chunk; `complete(done, now)` encodes the results of the batches still in flight and marks them
  settling (a disconnect leaves them be); `jobs(ops, now, into)` new records and changes (a
  cancel's or expiry's withdrawn entries, with error results, join `into`, a completion plan of
  the commit, or a new one).
- commit: `stage(ingest, complete, jobs)` writes the plans into a transaction (None: none to
  write); `finish(staged)` commits it, touching LMDB only, so on any thread (False: the map filled
  meanwhile: `grow` on the staging thread, stage again); `committed(staged)` moves the persisted
  counters; `commit(...)` runs the three. With an ingest, a full map past the ceiling raises
  `StoreFullError`; a completion alone may grow the map into the drain headroom.
- apply, once durable: `apply_ingest(plan, now)` makes the entries dispatchable and returns the
  rejects; `apply_complete(plan, now)` settles the batches in the core and returns the results
  stored per batch; `apply_jobs(plan)` the job records (or why each was refused). After a failed
  commit: `abort_complete` (a batch of a consumer gone meanwhile goes back to its lane),
  `abort_jobs`.
The long steps are generators pausing between parts (`fabricctl.store.steps`): run them with
`run_steps` (or the server's `run_steps_async`). Why: ARCHITECTURE.md, "The store on disk".
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass(slots=True)
class Written:
    """Why: one cycle's answers, as a writer's cycle gives them to its senders."""

    rejects: list[Refused] = field(default_factory=list)
    stored: set[int] = field(default_factory=set)  # rejects' indexes already in their job
    settled: list[int] = field(default_factory=list)  # per batch: results stored, or -1
    replies: list[JobRecord | str] = field(default_factory=list)  # per job operation


class WriteSteps:
    """Why: one route for every write: prepare, commit and apply, each a step."""

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

    def write(self, now: float, items: list[Item] | None = None,
              done: list[Completed] | None = None, ops: list[JobOp] | None = None) -> Written:
        """One cycle of the steps in a row, for a caller without a writer."""
        ingest = run_steps(self.ingest(items, now)) if items else None
        complete = run_steps(self.complete(done, now)) if done else None
        jobs = None
        if ops:
            jobs, complete = self.jobs(ops, now, complete)
        try:
            self.commit(ingest, complete, jobs)
        except BaseException:
            if complete is not None:
                self.abort_complete(complete, now)
            if jobs is not None:
                self.abort_jobs(jobs)
            raise
        out = Written()
        if ingest is not None:
            out.rejects = run_steps(self.apply_ingest(ingest, now))
            out.stored = ingest.stored
        if complete is not None:
            out.settled = run_steps(self.apply_complete(complete, now))
        if jobs is not None:
            out.replies = self.apply_jobs(jobs)
        return out

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
