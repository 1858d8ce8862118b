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
- Each write has one public form here (`ingest`, `submit`, `complete`, `complete_many`, the
  job operations), committed when it returns. A server that commits off its event loop
  takes the same writes in their prepare/commit/apply steps from `steps`
  (`fabricctl.store.writes.WriteSteps`). Batches being settled are in `core.settling` from
  prepare to apply: a fail or disconnect leaves them alone.
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
  the job operations (open, seal, cancel, priority, the tick's expiry and finalize) go
  through the same commit (`steps.jobs`, `apply_jobs`, `abort_jobs`); `job_ops`, `open_job`,
  `seal_job`, `cancel_job`, `set_job_priority` and `tick_jobs` run
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
Everything but `steps.finish` runs on the caller's thread; the server calls it from its
event loop.

Structure: `DurableBroker` composes parts that share one explicit `StoreState` (settings,
env, core, meta, segments, in-flight work, delivery counts): `Ingest` (ingest.py), `Dispatch`
(dispatch.py: pull, fail, disconnect, quarantine), `Completion` (completion.py), `Commit`
(commit.py: the transaction that carries them), `Reads` (reads.py) and the writes' steps
over them (`WriteSteps`, writes.py); `recover` (recovery.py) fills the state at start. Its
methods delegate to them; no part imports this module. Why the writes are shaped as they are
(the cost model): `fabricctl.store.keys`.
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
from fabricctl.store.completion import Completion
from fabricctl.store.config import StoreConfig
from fabricctl.store.dispatch import Completed, Dispatch
from fabricctl.store.env import StoreEnv
from fabricctl.store.ingest import Ingest, IngestPlan, Refused
from fabricctl.store.jobops import JobOps
from fabricctl.store.jobs import CancelOp, JobOp, JobTable, OpenOp, PriorityOp, SealOp
from fabricctl.store.keys import SegHeader, StoredEntry
from fabricctl.store.meta import Meta, PersistedLedger
from fabricctl.store.reads import Reads
from fabricctl.store.recovery import RecoveryReport, recover
from fabricctl.store.shapes import FinishedShapes
from fabricctl.store.state import StoreState
from fabricctl.store.steps import run_steps
from fabricctl.store.writes import WriteSteps

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
        # the writes in their prepare/commit/apply steps, for the server's writer
        self.steps = WriteSteps(self._ingest, self._completion, self._dispatch, self._jobs,
                                self.jobs, self._commit)
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
        return self._ingest_now(items, now)[0]

    def submit(self, items: list[Item], now: float, job: int = 0, resume: bool = False
               ) -> tuple[list[Refused], int]:
        """`ingest` for the items of one job (each item's `job` is set to it); with `resume`
        an id already stored in the job is skipped, not a reject. Returns (rejects, skipped)."""
        for it in items:
            it.job = job
        rejects, plan = self._ingest_now(items, now)
        if not resume or not plan.stored:
            return rejects, 0
        keep = [r for r in rejects if r.index not in plan.stored]
        return keep, len(rejects) - len(keep)

    def _ingest_now(self, items: list[Item], now: float) -> tuple[list[Refused], IngestPlan]:
        steps = self.steps
        plan = run_steps(steps.ingest(items, now))
        if plan.admits:
            steps.commit(ingest=plan)
        return run_steps(steps.apply_ingest(plan, now)), plan

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
        steps = self.steps
        plan = run_steps(steps.complete(done, now))
        if plan.writes:
            try:
                steps.commit(complete=plan)
            except BaseException:
                steps.abort_complete(plan, now)
                raise
        return run_steps(steps.apply_complete(plan, now))

    # -- jobs ----------

    def job_ops(self, ops: list[JobOp], now: float) -> list[JobRecord | str]:
        """Prepare, commit and apply job operations in a row (a store without a writer)."""
        steps = self.steps
        plan, cp = steps.jobs(ops, now)
        if plan.writes() or (cp is not None and cp.writes):
            try:
                steps.commit(complete=cp, jobs=plan)
            except BaseException:
                if cp is not None:
                    steps.abort_complete(cp, now)
                steps.abort_jobs(plan)
                raise
        if cp is not None:
            run_steps(steps.apply_complete(cp, now))
        return steps.apply_jobs(plan)

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
