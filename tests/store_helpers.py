"""Tests drive the durable store through its one route: `SyncStore` names a cycle of the
store's write steps (`DurableBroker.steps.write`) per operation, as a writer-less caller;
and `pull` commits a quarantine's error results at once, as the server's next completion
commit does. `store(path)` is a store for job tests: LMDB under `path/data`, the lifecycle
off (shapes dispatch as they fill), 16-entry segments, and one consumer "gpu0" of model
`MODEL` registered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabricctl.core.config import CoreConfig
from fabricctl.core.jobs import JobRecord
from fabricctl.core.types import Contract, Item, ItemResult, Work
from fabricctl.errors import JobRefused
from fabricctl.store.dispatch import Completed
from fabricctl.store.durable import DurableBroker, Refused, StoreConfig
from fabricctl.store.jobs import CancelOp, JobOp, OpenOp, PriorityOp, SealOp
from fabricctl.store.placement import resume_skip

MODEL = "m"
CORE = CoreConfig(lifecycle=False)


class SyncStore(DurableBroker):
    """Why: tests name each write; every one is a cycle of the store's own steps."""

    def pull(self, consumer: str, now: float) -> Work | None:
        work = super().pull(consumer, now)
        if deferred := self.take_deferred():
            self.complete_many(deferred, now)
        return work

    def ingest(self, items: list[Item], now: float) -> list[Refused]:
        return self.steps.write(now, items=items).rejects

    def submit(self, items: list[Item], now: float, job: int = 0, resume: bool = False
               ) -> tuple[list[Refused], int]:
        for it in items:
            it.job = job
        w = self.steps.write(now, items=items)
        if not resume:
            return w.rejects, 0
        return resume_skip(w.rejects, lambda r: r.index in w.stored)

    def complete(self, batch_id: int, results: list[ItemResult], now: float,
                 gpu: int | None = None) -> int:
        return self.complete_many([(batch_id, results, gpu)], now)[0]

    def complete_many(self, done: list[Completed], now: float) -> list[int]:
        return self.steps.write(now, done=done).settled

    def job_ops(self, ops: list[JobOp], now: float) -> list[JobRecord | str]:
        return self.steps.write(now, ops=ops).replies

    def _one(self, op: JobOp, now: float) -> JobRecord:
        got = self.job_ops([op], now)[0]
        if isinstance(got, str):
            raise JobRefused(got)
        return got

    def open_job(self, kind: str, now: float, **fields: Any) -> JobRecord:
        return self._one(OpenOp(kind, **fields), now)

    def seal_job(self, job: int, lines: int, now: float, errors: list[str] | None = None,
                 failed: bool = False, sha256: str = "") -> JobRecord:
        return self._one(SealOp(job, lines, errors or [], failed, sha256), now)

    def cancel_job(self, job: int, now: float, expired: bool = False) -> JobRecord:
        return self._one(CancelOp(job, expired), now)

    def set_job_priority(self, job: int, priority: int, now: float) -> JobRecord:
        return self._one(PriorityOp(job, priority), now)

    def tick_jobs(self, now: float) -> list[JobRecord | str]:
        ops = self.jobs_due(now)
        return self.job_ops(ops, now) if ops else []


def store(path: Path, now: float = 100.0) -> SyncStore:
    s = SyncStore(path / "data", now, CORE, StoreConfig(segment_entries=16))
    s.register("gpu0", Contract(MODEL, 8, 100_000, 4096), now)
    return s


def keep_pace(data: Path, model: str, pace: float) -> None:
    """A last run that kept `pace` (tokens per second per consumer) for `model`, written to
    the meta table as a completion's commit writes it: the next store's forecast prior."""
    s = DurableBroker(data, 0.0, CORE)
    with s.env.env.begin(write=True) as txn:
        s.meta.write(txn, s.env.dbs["meta"], pace=(model, pace))
    s.close()
