"""The durable broker: the core's decisions, with every item kept in LMDB segments.

Contract: `DurableBroker` is the store's one public face; nothing outside `fabricctl.store`
touches the core it owns (reads: `view`, a `CoreView`; changes: the methods here).
- Writes take one route, `steps` (`fabricctl.store.writes.WriteSteps`; in a row: `steps.write`).
  An ingest rejects an id already stored in the item's job (queued or done) or repeated in the
  call (a resume counts those as skipped: `placement.resume_skip`), makes items dispatchable
  once durable, and on a full map or disk raises `StoreFullError`, storing nothing of that
  cycle's ingest. A completion stores each item's one result (a batch no longer in flight: -1)
  and deletes a segment whose entries all have results. Job operations (open, seal, cancel,
  priority, the tick's `jobs_due`) commit their records with every count: exact after kill -9.
- `pull(consumer, now)` returns a batch of the core as `Work` once every segment and entry
  exists with the batch's shape (else the batch goes back untouched); `fail(batch_id, now,
  reason)` puts a batch back at the front of its lane; `disconnect(consumer, now, why, keep)`
  does so for every batch a lost consumer held but those settling or in `keep`.
- An entry handed out `max_deliveries` times without a result is quarantined: `pull` gives it an
  error result ("quarantined after N deliveries without a result; last: <reason>"), committed
  with the caller's next completion (`take_deferred()`).
- Core changes: `register`, `tick`, `record_cache`, `take_signals`; values: `figures()` (a run
  summary's broker side), `counters()` (this run's store counters). Reads, each one short read
  transaction: `entry`, `results_since`, `results_by_key`, `result`, `job_results`,
  `finished_shapes`, `usage`, `stats`; from memory: `job`, `find_jobs`, `attach_to`,
  `live_jobs`, `recent_jobs`, `job_in_flight`. Only `steps.finish` runs off the caller's thread
  (the parts: ARCHITECTURE.md, "store").
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
from fabricctl.core.types import Contract, Item, Prewarm, Work
from fabricctl.store.commit import Commit, StagedCommit
from fabricctl.store.completion import Completion
from fabricctl.store.config import StoreConfig
from fabricctl.store.dispatch import Completed, Dispatch
from fabricctl.store.env import StoreEnv
from fabricctl.store.ingest import Ingest, Refused
from fabricctl.store.jobops import JobOps
from fabricctl.store.jobs import JobOp, JobTable
from fabricctl.store.keys import SegHeader, StoredEntry
from fabricctl.store.meta import Meta, PersistedLedger
from fabricctl.store.reads import Reads
from fabricctl.store.recovery import RecoveryReport, recover
from fabricctl.store.shapes import FinishedShapes
from fabricctl.store.state import StoreState
from fabricctl.store.view import CoreView, Counters, Figures, figures
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
        self._core = core = Broker(cfg)
        self.jobs = JobTable(self.env, core.set_job_terms)  # live jobs' terms: the core's
        self.state = state = StoreState(self.store_cfg, self.env, core, self.jobs)
        self.segs: dict[int, SegHeader] = state.segs
        self.work: dict[int, list[Item]] = state.work  # in-flight batch id -> its items
        self.undone: dict[int, tuple[int, str]] = state.undone  # key -> (times back, why)
        self._ingest = Ingest(state)
        self._completion = Completion(state)
        self._dispatch = Dispatch(state)
        self._finished = FinishedShapes(self.env, core, self.store_cfg.finished_shapes_kept)
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

    # -- the core: read through `view`, changed only here ----------

    @property
    def view(self) -> CoreView:
        """The core's reads (`fabricctl.store.view`): nothing outside the store writes it."""
        return self._core

    def figures(self) -> Figures:
        """The broker's side of a run's summary, as values."""
        return figures(self._core)

    def register(self, name: str, contract: Contract, now: float) -> None:
        """A consumer joins (or re-registers) with its contract."""
        self._core.register(name, contract, now)

    def tick(self, now: float) -> None:
        """The core's maintenance tick (`Broker.tick`)."""
        self._core.tick(now)

    def record_cache(self, batch_id: int, queries: int, hits: int, achievable: int,
                     now: float) -> None:
        """An engine's prefix-cache figures for a batch in flight (the cache-truth audit)."""
        self._core.record_cache(batch_id, queries, hits, achievable, now)

    def take_signals(self) -> list[Prewarm]:
        """The pre-warm signals not yet sent (emptied)."""
        return self._core.take_signals()

    # -- counters ----------

    @property
    def meta(self) -> Meta:
        """The counters persisted beside the segments (ledger, next segment, results, epochs)."""
        return self.state.meta

    @property
    def persisted_ledger(self) -> PersistedLedger:
        """The ledger as the last commit persisted it."""
        return self.state.meta.ledger

    def counters(self) -> Counters:
        """This run's results stored, completions dropped as duplicates, entries quarantined."""
        c = self._completion
        return Counters(c.results_stored, c.duplicate_completions, self._dispatch.quarantined)

    # -- jobs ----------

    def jobs_due(self, now: float) -> list[JobOp]:
        """The operations the tick owes the live jobs (`JobTable.due`)."""
        return self.jobs.due(now, self._jobs.in_flight)

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
