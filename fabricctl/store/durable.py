"""The durable broker: the core's decisions, with every item kept in LMDB segments.

Contract:
- `ingest(items, now)` validates, de-duplicates (an id already stored, queued or completed,
  or repeated within the call is a reject), assigns each item to its lane (assigned first),
  writes the entries (which extend their segments' boundaries), their id index, new segment
  headers and the ledger in one durable commit (written second) and only then makes them
  dispatchable; it returns per-item rejects in index order. A full map or disk raises
  `StoreFullError` and stores nothing of that call.
- `pull(consumer, now)` takes a batch from the core, verifies every segment and entry exists
  and carries the batch's shape (the hard guard) before returning its `Work`; a failed
  check puts the batch back untouched. Pending entries live in memory only.
- `complete(batch_id, results, now)` writes each item's one result (keyed by its entry: it
  marks the entry completed) and its result sequence number and the ledger in one commit,
  and deletes a segment whose entries all have results in the same commit. A completion
  for a batch that is no longer in flight (settled, failed, or from before a restart) is
  dropped and returns -1: it creates no second result.
- `fail(batch_id, now, reason)` puts a batch back at the front of its lane;
  `disconnect(consumer, now, why, keep)` does so for every batch a lost consumer held,
  except those whose completion is settling or was received (`keep`).
- Each write is three steps, so a server can commit off its event loop: `prepare_ingest` /
  `prepare_complete` (on the caller's thread), `commit(ingest, complete)` (one durable
  transaction for either or both: `stage_commit`, then `finish`, which touches LMDB only,
  so it may run on a writer thread, `grow` when the map filled meanwhile, `committed`),
  then `apply_ingest` / `apply_complete` (on the caller's thread). Batches being settled
  are in `core.settling` from prepare to apply: a fail or disconnect leaves them alone. `ingest`
  and `complete_many` run the three steps in a row. The long ones also come as generators
  that pause between parts (`ingest_steps`, `complete_steps`, `stage_steps`,
  `apply_ingest_steps`, `apply_complete_steps`; see `fabricctl.store.steps`): the server's
  writer lets its event loop serve sockets at each pause.
- Crash loops are bounded: every entry that comes back undone (failed, or held by a lost
  consumer) is counted in memory; one that was handed out `max_deliveries` times without a
  result is not handed out again: `pull` completes it with an error result ("quarantined
  after N deliveries without a result; last: <reason>") and sends the rest of its batch
  (after `defer_results()`, those error results wait for the server's next commit:
  `take_deferred()`).
- Jobs (`fabricctl.store.jobs`): every item may belong to a job (`Item.job`; `submit(items,
  now, job, resume)`); its id is scoped to the job (two jobs may share ids; a resumed submit
  counts an id already stored in its job as skipped). A job's record is written in the same
  transaction as every count it holds: its items' ingest (total), their results (completed,
  failed: a result with an error) and a cancel (cancelled), so it is exact after kill -9.
  `prepare_jobs(ops, now, into)` / `apply_jobs` / `abort_jobs` carry the job operations
  (open, seal, cancel, priority, the tick's expiry and finalize) through the same commit;
  `job_ops`, `open_job`, `seal_job`, `cancel_job`, `set_job_priority` and `tick_jobs` run
  them in a row (the four single operations raise `JobRefused`, with the store's reason,
  for a job that does not exist or has ended). Every live job's priority, deadline and sealed
  flag reach the core's shape choice (`Broker.set_job_terms`) from the job table: when its
  record is loaded at start (before recovery restores any entry) and when a commit changes
  them; an ended job's are dropped. A cancel (or an expiry) withdraws the job's queued
  entries from the core's lanes and writes an error result for each ("cancelled" /
  "expired") in one commit; in-flight items finish. A job's results read back in input-line
  order (`job_results`), also after its segments are gone.
- Every shape that finishes leaves its record (`finished_view`) in the `shapes` table in the
  next commit (or on `close`); the last `finished_shapes_kept` are kept (shapes.py).
- Reads for the server, each in one short read transaction: `entry(key)`,
  `results_since(seq)`, `results_by_key(after)`, `result(item_id)`, `finished_shapes()`,
  `usage()`, `stats()`.
Everything but `finish` runs on the caller's thread; the server calls it from its event loop.

Structure: `DurableBroker` composes parts that share one explicit `StoreState` (settings,
env, core, meta, segments, in-flight work, delivery counts): `Ingest` (ingest.py), `Dispatch`
(dispatch.py: pull, fail, disconnect, quarantine), `Completion` (completion.py), `Commit`
(commit.py: the transaction that carries them) and `Reads` (reads.py); `recover`
(recovery.py) fills the state at start. Its methods delegate to them; no part imports this
module. Why the writes are shaped as they are (the cost model): `fabricctl.store.keys`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import ResultRecord
from fabricctl.core.snapshot import ShapeView
from fabricctl.core.types import Item, ItemResult, Work
from fabricctl.errors import JobRefused
from fabricctl.store.commit import Commit, StagedCommit
from fabricctl.store.completion import CompletePlan, Completion
from fabricctl.store.config import StoreConfig
from fabricctl.store.dispatch import Completed, Dispatch
from fabricctl.store.env import StoreEnv
from fabricctl.store.ingest import Ingest, IngestPlan, Refused
from fabricctl.store.jobops import JobOps
from fabricctl.store.jobs import CancelOp, JobOp, JobPlan, JobTable, OpenOp, PriorityOp, SealOp
from fabricctl.store.keys import SegHeader, StoredEntry
from fabricctl.store.meta import Meta, PersistedLedger
from fabricctl.store.reads import Reads
from fabricctl.store.recovery import RecoveryReport, recover
from fabricctl.store.shapes import FinishedShapes
from fabricctl.store.state import StoreState
from fabricctl.store.steps import Steps, run_steps

__all__ = ["DurableBroker", "Refused", "StagedCommit", "StoreConfig"]


class DurableBroker:
    """Why: the broker that loses no acknowledged item, whatever kills it."""

    def __init__(
        self, data_dir: Path, now: float, cfg: CoreConfig | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        self.store_cfg = store or StoreConfig()
        self._closed = False
        self.env = StoreEnv(Path(data_dir), self.store_cfg.map_size, self.store_cfg.map_ceiling)
        self.core = Broker(cfg)
        self.jobs = JobTable(self.env, self.core.set_job_terms)  # live jobs' terms: the core's
        self.state = state = StoreState(self.store_cfg, self.env, self.core, self.jobs)
        self.segs: dict[int, SegHeader] = state.segs
        self.work: dict[int, list[Item]] = state.work  # in-flight batch id -> its items
        self.undone: dict[int, tuple[int, str]] = state.undone  # key -> (times back, why)
        self._ingest = Ingest(state)
        self._completion = Completion(state)
        self._dispatch = Dispatch(state, self.complete_many)
        self._finished = FinishedShapes(self.env, self.core, self.store_cfg.finished_shapes_kept)
        self._commit = Commit(state, self._ingest, self._completion, self._finished)
        self._jobs = JobOps(state)
        self._reads = Reads(self.env)
        try:
            self.recovery: RecoveryReport = recover(state, now)
        except BaseException:
            self.env.close()
            raise

    # -- counters ----------

    @property
    def meta(self) -> Meta:
        """The counters persisted beside the segments (ledger, next segment, results, epochs)."""
        return self.state.meta

    @property
    def persisted_ledger(self) -> PersistedLedger:
        """The ledger as the last commit persisted it."""
        return self.state.meta.ledger

    @property
    def results_stored(self) -> int:
        return self._completion.results_stored

    @property
    def duplicate_completions(self) -> int:
        return self._completion.duplicate_completions

    @property
    def quarantined(self) -> int:
        return self._dispatch.quarantined

    # -- ingest ----------

    def ingest(self, items: list[Item], now: float) -> list[Refused]:
        """Store a chunk durably and make it dispatchable; returns the rejects."""
        plan = self.prepare_ingest(items, now)
        if plan.admits:
            self.commit(ingest=plan)
        return self.apply_ingest(plan, now)

    def submit(self, items: list[Item], now: float, job: int = 0, resume: bool = False
               ) -> tuple[list[Refused], int]:
        """`ingest` for the items of one job (each item's `job` is set to it); with `resume`
        an id already stored in the job is skipped, not a reject. Returns (rejects, skipped)."""
        for it in items:
            it.job = job
        plan = self.prepare_ingest(items, now)
        if plan.admits:
            self.commit(ingest=plan)
        rejects = self.apply_ingest(plan, now)
        if not resume or not plan.stored:
            return rejects, 0
        keep = [r for r in rejects if r.index not in plan.stored]
        return keep, len(rejects) - len(keep)

    def prepare_ingest(self, items: list[Item], now: float) -> IngestPlan:
        """Screen, place and encode a chunk (nothing is written yet)."""
        return run_steps(self.ingest_steps(items, now))

    def ingest_steps(self, items: list[Item], now: float, landing: bool = False,
                     after: IngestPlan | None = None) -> Steps[IngestPlan]:
        """`prepare_ingest` in steps (`Ingest.ingest_steps`: `landing` and `after`)."""
        return self._ingest.ingest_steps(items, now, landing, after)

    def apply_ingest(self, plan: IngestPlan, now: float) -> list[Refused]:
        """After the commit: the new entries become dispatchable; returns the rejects."""
        return run_steps(self.apply_ingest_steps(plan, now))

    def apply_ingest_steps(self, plan: IngestPlan, now: float) -> Steps[list[Refused]]:
        """`apply_ingest` in steps (every part admitted is dispatchable at once)."""
        return self._ingest.apply_ingest_steps(plan, now)

    # -- completion ----------

    def complete(
        self, batch_id: int, results: list[ItemResult], now: float, gpu: int | None = None
    ) -> int:
        """Settle one batch durably; returns results stored, or -1 if it is not in flight."""
        return self.complete_many([(batch_id, results, gpu)], now)[0]

    def complete_many(self, done: list[Completed], now: float) -> list[int]:
        """Settle several batches in one durable commit (group commit of completions).

        Returns, per batch, the results stored, or -1 for a batch that is not in flight
        (a late or duplicate completion: dropped, it creates no second result).
        """
        plan = self.prepare_complete(done, now)
        if plan.writes:
            try:
                self.commit(complete=plan)
            except BaseException:
                self.abort_complete(plan, now)
                raise
        return self.apply_complete(plan, now)

    def prepare_complete(self, done: list[Completed], now: float) -> CompletePlan:
        """Encode the results of the batches still in flight and mark them settling (a
        disconnect leaves them in flight); nothing is written yet."""
        return run_steps(self.complete_steps(done, now))

    def complete_steps(self, done: list[Completed], now: float) -> Steps[CompletePlan]:
        """`prepare_complete` in steps (between batches, every `STEP_RESULTS` results)."""
        return self._completion.complete_steps(done, now)

    def abort_complete(self, plan: CompletePlan, now: float) -> None:
        """The commit failed: the batches are no longer settling; one whose consumer left
        meanwhile goes back to its lane (nobody else would ever return it)."""
        self._dispatch.abort_complete(plan, now)

    def apply_complete(self, plan: CompletePlan, now: float) -> list[int]:
        """After the commit: settle the batches in the core; returns results stored per batch."""
        return run_steps(self.apply_complete_steps(plan, now))

    def apply_complete_steps(self, plan: CompletePlan, now: float) -> Steps[list[int]]:
        """`apply_complete` in steps (every `STEP_RESULTS // 8` batches settled)."""
        return self._completion.apply_complete_steps(plan, now)

    # -- jobs ----------

    def prepare_jobs(self, ops: list[JobOp], now: float, into: CompletePlan | None = None
                     ) -> tuple[JobPlan, CompletePlan | None]:
        """Prepare job operations (nothing is written yet): new records, changes, and for a
        cancel or an expiry the job's queued entries withdrawn from their lanes with their
        error results, added to `into` (a completion plan of the same commit) or a new
        plan; commit both, then `apply_complete` and `apply_jobs` (or `abort_complete` and
        `abort_jobs`)."""
        return self._jobs.prepare(ops, now, into)

    def apply_jobs(self, plan: JobPlan) -> list[JobRecord | str]:
        """After the commit: per operation, the job's record, or why it was refused."""
        self.jobs.release(plan)
        return self.jobs.replies(plan)

    def abort_jobs(self, plan: JobPlan) -> None:
        """The commit failed: the plan's jobs may get tick operations again."""
        self.jobs.release(plan)

    def job_ops(self, ops: list[JobOp], now: float) -> list[JobRecord | str]:
        """Prepare, commit and apply job operations in a row (a store without a writer)."""
        plan, cp = self.prepare_jobs(ops, now)
        if plan.writes() or (cp is not None and cp.writes):
            try:
                self.commit(complete=cp, jobs=plan)
            except BaseException:
                if cp is not None:
                    self.abort_complete(cp, now)
                self.abort_jobs(plan)
                raise
        if cp is not None:
            self.apply_complete(cp, now)
        return self.apply_jobs(plan)

    def _one(self, op: JobOp, now: float) -> JobRecord:
        got = self.job_ops([op], now)[0]
        if isinstance(got, str):
            raise JobRefused(got)
        return got

    def open_job(self, kind: str, now: float, **fields: Any) -> JobRecord:
        """A new job, durable when this returns (fields: those of `OpenOp`)."""
        return self._one(OpenOp(kind, **fields), now)

    def seal_job(self, job: int, lines: int, now: float, errors: list[str] | None = None,
                 failed: bool = False, sha256: str = "") -> JobRecord:
        return self._one(SealOp(job, lines, errors or [], failed, sha256), now)

    def cancel_job(self, job: int, now: float, expired: bool = False) -> JobRecord:
        """Cancel: queued items get an error result ("cancelled"), in-flight ones finish."""
        return self._one(CancelOp(job, expired), now)

    def set_job_priority(self, job: int, priority: int, now: float) -> JobRecord:
        """A live job's new priority (checked: `core.terms.check_priority`); `JobRefused`
        with the reason for a job that ended or does not exist."""
        return self._one(PriorityOp(job, priority), now)

    def jobs_due(self, now: float) -> list[JobOp]:
        """The operations the tick owes the live jobs (`JobTable.due`)."""
        return self.jobs.due(now, self._jobs.in_flight)

    def tick_jobs(self, now: float) -> list[JobRecord | str]:
        """The tick's job operations, committed at once (a store without a writer)."""
        ops = self.jobs_due(now)
        return self.job_ops(ops, now) if ops else []

    def finished_waiting(self) -> bool:
        """Records of finished shapes wait for a commit (the tick then sends a `FlushOp`)."""
        return self._finished.waiting()

    def job_in_flight(self) -> dict[int, int]:
        """Job -> its items an engine holds now."""
        return self._jobs.in_flight()

    def job(self, number: int) -> JobRecord | None:
        """A job's record as last committed."""
        return self.jobs.get(number)

    def find_jobs(self, ref: str) -> list[int]:
        """The jobs an id or id prefix names, newest first."""
        return self.jobs.find(ref)

    def attach_to(self, kind: str, name: str, sha256: str) -> int | None:
        """The newest job of this input a rerun may join (`JobTable.attach_to`)."""
        return self.jobs.attach_to(kind, name, sha256)

    def live_jobs(self) -> list[JobRecord]:
        """The jobs not ended, newest first (from memory: no read)."""
        return sorted(self.jobs.live.values(), key=lambda r: r.number, reverse=True)

    def recent_jobs(self, limit: int = 1000, before: int = 0, kind: str = ""
                    ) -> list[JobRecord]:
        """The newest `limit` jobs numbered below `before` (0: any) of `kind` ("": any),
        newest first."""
        return self.jobs.recent(limit, before, kind)

    def job_results(self, job: int, after_line: int = 0, limit: int = 1000
                    ) -> list[ResultRecord]:
        """A job's results in input-line order, of lines after `after_line`."""
        return self._reads.job_results(job, after_line, limit)

    # -- the commit ----------

    def commit(self, ingest: IngestPlan | None = None,
               complete: CompletePlan | None = None, jobs: JobPlan | None = None) -> None:
        """One durable transaction for a prepared ingest and/or completion, with the meta
        counters they move: `stage_commit`, then `finish` (growing a map that filled
        while committing), then `committed`. Apply the ingest first, then the completion.
        With an ingest in it, a full map past the ceiling is refused (`StoreFullError`); a
        completion alone may grow the map into the drain headroom."""
        while (staged := self.stage_commit(ingest, complete, jobs)) is not None:
            if self.finish(staged):
                self.committed(staged)
                return
            self.grow(staged)

    def stage_commit(self, ingest: IngestPlan | None, complete: CompletePlan | None,
                     jobs: JobPlan | None = None) -> StagedCommit | None:
        """Write the plans into a new transaction, not committed yet (None: nothing to
        write). Its `finish` may run on a writer thread, while this thread goes on
        dispatching; nothing else may write until `committed` (or a failed finish)."""
        return run_steps(self.stage_steps(ingest, complete, jobs))

    def stage_steps(self, ingest: IngestPlan | None, complete: CompletePlan | None,
                    jobs: JobPlan | None = None) -> Steps[StagedCommit | None]:
        """`stage_commit` in steps: it pauses after the ingest's rows, after the results and
        between parts of segment deletes, its transaction open meanwhile."""
        return self._commit.stage_steps(ingest, complete, jobs)

    def finish(self, staged: StagedCommit) -> bool:
        """Commit a staged transaction (any thread: LMDB lets go of the GIL); False: the map
        filled while committing: `grow`, then stage again."""
        return self._commit.finish(staged)

    def grow(self, staged: StagedCommit) -> None:
        """Grow the map after a `finish` that found it full (on the thread that stages)."""
        self._commit.grow(staged)

    def committed(self, staged: StagedCommit) -> None:
        """The staged transaction is durable: the persisted counters move."""
        self._commit.committed(staged)

    # -- dispatch ----------

    def pull(self, consumer: str, now: float) -> Work | None:
        """A batch for `consumer`, every entry checked on disk, or None (see dispatch)."""
        return self._dispatch.pull(consumer, now)

    def fail(self, batch_id: int, now: float, reason: str = "") -> None:
        """A batch came back undone (not one whose completion is settling: it stays)."""
        self._dispatch.fail(batch_id, now, reason)

    def disconnect(self, consumer: str, now: float, why: str,
                   keep: frozenset[int] | set[int] = frozenset()) -> int:
        """A consumer is gone: every batch it held goes back (counted as undone), except
        those settling or whose completion was received (`keep`)."""
        return self._dispatch.disconnect(consumer, now, why, keep)

    def defer_results(self) -> None:
        """Quarantine results wait for the caller's next completion commit (`take_deferred`)
        instead of being committed on the spot: for a server that commits on a writer."""
        self._dispatch.defer()

    def take_deferred(self) -> list[Completed]:
        """The quarantine results waiting for a commit, as completions (emptied)."""
        return self._dispatch.take_deferred()

    # -- reads ----------

    def entry(self, key: int) -> StoredEntry | None:
        """The stored entry of an in-memory entry key, or None when it is not on disk."""
        return self._reads.entry(key)

    def results_since(self, seq: int, limit: int = 1000) -> list[tuple[int, ResultRecord]]:
        """Up to `limit` results stored after sequence number `seq`, oldest first."""
        return self._reads.results_since(seq, limit)

    def results_by_key(self, after: str, limit: int) -> list[tuple[str, Any]]:
        """Up to `limit` results in entry-key order after the entry key `after` (24 hex
        digits; "" from the first), each as (key, its msgpack record as stored)."""
        return self._reads.results_by_key(after, limit)

    def result(self, item_id: str, job: int = 0) -> ResultRecord | None:
        """The stored result of an item (of `job`), or None while it has none."""
        return self._reads.result(item_id, job)

    def finished_shapes(self, limit: int = 1000) -> list[ShapeView]:
        """The records of the newest `limit` finished shapes, newest first (those not yet
        committed too), as kept across restarts."""
        return self._finished.recent(limit)

    def usage(self) -> dict[str, Any]:
        """The data dir, the map's used and current size, the disk's free space."""
        return self._reads.usage()

    def stats(self) -> dict[str, Any]:
        """`usage`, the results stored so far (the last sequence number) and the recovery
        report of this start."""
        return {**self.usage(), "results": self.state.meta.rseq,
                "recovery": msgspec.to_builtins(self.recovery)}

    def close(self) -> None:
        """Write the finished shapes' records still pending, then close the environment (a
        second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._finished.flush()
        finally:
            self.env.close()
