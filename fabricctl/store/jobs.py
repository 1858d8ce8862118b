"""Jobs in the store: the `jobs` table, the live jobs in memory, and the job operations.

Contract: a job's record (`fabricctl.core.jobs.JobRecord`) is written in the transaction of every
change to it, so after any crash its counts agree with the entries and results on disk.
- `write(txn, plan, now, totals, shapes, outcomes)`, called by the commit inside its transaction
  with what its ingest and completion count per job, takes the current record of every job the
  commit touches and adds the ingest's totals (the shapes its items joined; the first item's model
  when the job has none; items per endpoint into `endpoints`) and the completion's outcomes
  (completed, failed, cancelled; input, cached and output tokens, each item's once), applies the
  plan's operations in order, settles it once (in_progress to finalizing, cancelling to cancelled,
  an expired window to expired, once every item has an outcome; finalizing to completed is the
  tick's `FinalizeOp`) and puts it. `committed()` makes them current (a restaged transaction
  rewrites them from the same base).
- Operations: `OpenOp`, `SealOp`, `CancelOp` (expired: the window's cancel), `PriorityOp` (a live
  job's new priority), `FinalizeOp`; a `JobPlan` carries them from `JobOps.prepare` (jobops.py; it
  also withdraws a cancelled job's queued entries) to the commit and to `replies(plan)`: per
  operation the record after it, or why it was refused.
- Memory: `live` the jobs not ended, `ids` every job's id -> number (by id or unique prefix),
  `by_input` (kind, name, sha256) -> numbers (attach); ended records are read from the table.
  `due(now, in_flight)`: the operations the tick owes (an expired window, a finalizing job, a
  cancelled job whose items came back to a lane).
- Terms: the `terms` hook given to the table (`Broker.set_job_terms`) gets each live job's
  `core.terms.JobTerms` (`core.jobs.terms_of`) at `load` (every live job, before recovery restores
  an entry) and at `committed` (each record whose terms moved; None once it ended), nowhere else.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.jobs import (
    JobRecord,
    JobShape,
    JobState,
    add_errors,
    add_shapes,
    add_usage,
    expire_due,
    fail_validation,
    job_id_of,
    mark_expired,
    new_job,
    request_cancel,
    seal,
    set_priority,
    settle,
    start,
    terms_of,
)
from fabricctl.core.mix import add_endpoints
from fabricctl.store.jobplan import (
    CancelOp,
    Change,
    FinalizeOp,
    FlushOp,
    JobOp,
    JobPlan,
    OpenOp,
    PriorityOp,
    SealOp,
    TermsHook,
)
from fabricctl.store.keys import job_key

if TYPE_CHECKING:
    from fabricctl.store.env import StoreEnv

__all__ = ["CancelOp", "FinalizeOp", "FlushOp", "JobOp", "JobPlan", "JobTable", "OpenOp",
           "PriorityOp", "SealOp"]  # the operations live in jobplan.py

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(JobRecord).decode


class JobTable:
    """Why: a job's counts change in the commits of its items; one place keeps them exact."""

    def __init__(self, env: StoreEnv, terms: TermsHook | None = None) -> None:
        self.env = env
        self._terms = terms  # where each live job's terms go (the core broker's)
        self.live: dict[int, JobRecord] = {}
        self.ids: dict[str, int] = {}
        self.by_input: dict[tuple[str, str, str], list[int]] = {}
        self.next = 1
        self.busy: set[int] = set()  # jobs with a tick operation on its way
        self._staged: dict[int, JobRecord] = {}

    # -- start ----------

    def load(self, txn: lmdb.Transaction) -> None:
        """Read every job from the table (recovery)."""
        for k, v in txn.cursor(db=self.env.dbs["jobs"]):
            rec = _decode(v)
            self._index(rec)
            if not rec.ended:
                self.live[rec.number] = rec
                if self._terms is not None:
                    self._terms(rec.number, terms_of(rec))
            self.next = max(self.next, int.from_bytes(k, "big") + 1)

    def _index(self, rec: JobRecord) -> None:
        self.ids[rec.id] = rec.number
        if rec.sha256:
            self.by_input.setdefault((rec.kind, rec.name, rec.sha256), []).append(rec.number)

    # -- reads ----------

    def get(self, number: int) -> JobRecord | None:
        """A job's record as last committed (a live one from memory)."""
        rec = self.live.get(number)
        if rec is not None or not 0 < number < self.next:
            return rec
        with self.env.read() as txn:
            raw = txn.get(job_key(number), db=self.env.dbs["jobs"])
        return _decode(raw) if raw is not None else None

    def find(self, ref: str) -> list[int]:
        """The jobs `ref` names: its exact id, else every id it is a prefix of, newest first."""
        if ref in self.ids:
            return [self.ids[ref]]
        if not ref:
            return []
        return sorted((n for i, n in self.ids.items() if i.startswith(ref)), reverse=True)

    def attach_to(self, kind: str, name: str, sha256: str) -> int | None:
        """The newest job of this input that a rerun may join (not cancelled, failed or
        expired), or None."""
        if not sha256:
            return None
        for n in reversed(self.by_input.get((kind, name, sha256), [])):
            rec = self.get(n)
            if rec is not None and rec.state not in (
                    JobState.CANCELLED, JobState.CANCELLING, JobState.FAILED,
                    JobState.EXPIRED) and not rec.expired:
                return n
        return None

    def refuses_items(self, number: int) -> str | None:
        """Why new items may not join this job, or None."""
        rec = self.live.get(number)
        if rec is not None and not rec.sealed:
            return None
        if rec is None and self.get(number) is None:
            return f"no job {number}"
        shown = rec.id if rec is not None else str(number)
        return f"job {shown} is sealed: no more items join it"

    def recent(self, limit: int, before: int = 0, kind: str = "") -> list[JobRecord]:
        """The newest `limit` jobs numbered below `before` (0: any) of `kind` ("": any),
        newest first: a page of a listing that goes on from the last job of the page. A job
        whose commit is durable but not yet applied (`committed`) is not listed yet, so every
        job listed is one `find` and `get` answer for."""
        out: list[JobRecord] = []
        with self.env.read() as txn:
            cur = txn.cursor(db=self.env.dbs["jobs"])
            if before:
                at = cur.prev() if cur.set_range(job_key(before)) else cur.last()
            else:
                at = cur.last()
            while at and len(out) < limit:
                rec = _decode(cur.value())
                if (not kind or rec.kind == kind) and rec.id in self.ids:
                    out.append(rec)
                at = cur.prev()
        return out

    # -- operations ----------

    def open(self, op: OpenOp, now: float, plan: JobPlan) -> int:
        """Make a new job's record in `plan`; returns its number."""
        number = self.next
        self.next += 1
        salt = op.salt or secrets.token_hex(3)
        rec = new_job(number, job_id_of(number, salt), op.kind, now, validating=op.validating,
                      window_s=op.window_s or None, priority=op.priority, name=op.name,
                      sha256=op.sha256, size=op.size, endpoint=op.endpoint,
                      metadata=dict(op.metadata), output_expires_s=op.output_expires_s)
        plan.new[number] = rec
        return number

    @staticmethod
    def seal_change(op: SealOp, now: float) -> Change:
        def change(rec: JobRecord) -> None:
            if op.sha256 and not rec.sha256:
                rec.sha256 = op.sha256
            if op.failed:
                fail_validation(rec, op.errors, now)
                return
            start(rec, now)
            add_errors(rec, op.errors)
            rec.rejected += max(0, op.refused)
            seal(rec, op.lines, now)
        return change

    @staticmethod
    def priority_change(priority: int) -> Change:
        def change(rec: JobRecord) -> None:
            set_priority(rec, priority)
        return change

    @staticmethod
    def cancel_change(expired: bool, now: float) -> Change:
        def change(rec: JobRecord) -> None:
            if expired:
                if expire_due(rec, now):
                    mark_expired(rec)
            else:
                request_cancel(rec, now)
        return change

    @staticmethod
    def finalize_change(in_flight: int, now: float) -> Change:
        def change(rec: JobRecord) -> None:
            if rec.state is JobState.FINALIZING:
                settle(rec, in_flight, now)
        return change

    def due(self, now: float, in_flight: Callable[[], dict[int, int]]) -> list[JobOp]:
        """The operations the tick owes the live jobs (none for a job with one on its way):
        an expired window, finalizing -> completed, and a cancelled or expired job whose
        items came back to a lane (a lost consumer's batch, a restart) withdrawn again.
        `in_flight` (job -> items an engine holds) is computed only when needed."""
        ops: list[JobOp] = []
        flying: dict[int, int] | None = None
        for n, rec in self.live.items():
            if n in self.busy or rec.state is JobState.VALIDATING:
                continue  # one on its way; a validating job's window counts once it runs
            if expire_due(rec, now):
                ops.append(CancelOp(n, expired=True))
            elif rec.state is JobState.FINALIZING:
                ops.append(FinalizeOp(n))
            elif (rec.state is JobState.CANCELLING or rec.expired) and rec.queued:
                if flying is None:
                    flying = in_flight()
                if rec.queued > flying.get(n, 0):
                    ops.append(CancelOp(n, expired=rec.expired))
            else:
                continue
            self.busy.add(n)
        return ops

    # -- the commit ----------

    def write(self, txn: lmdb.Transaction, plan: JobPlan | None, now: float,
              totals: dict[int, int] | None = None,
              shapes: dict[int, set[JobShape]] | None = None,
              outcomes: dict[int, list[int]] | None = None,
              models: dict[int, tuple[int, str]] | None = None,
              endpoints: dict[int, Counter[int]] | None = None) -> int:
        """Put the record of every job this transaction changes; returns how many.
        `totals`: items an ingest adds per job (`shapes`: the shapes they joined; `models`:
        (line, model) of its first item, kept as the job's model when it has none yet;
        `endpoints`: how many go to each endpoint, `core.mix`);
        `outcomes`: per job, [completed, failed, cancelled, input tokens, cached tokens,
        output tokens] a completion adds."""
        staged: dict[int, JobRecord] = {}
        db = self.env.dbs["jobs"]

        def rec(n: int) -> JobRecord | None:
            r = staged.get(n)
            if r is None:
                base = (plan.new.get(n) if plan is not None else None) or self.live.get(n)
                if base is None:
                    raw = txn.get(job_key(n), db=db)
                    if raw is None:
                        return None
                    base = _decode(raw)
                r = staged[n] = msgspec.structs.replace(base)
            return r

        if plan is not None:
            for n in plan.new:
                rec(n)
        for n, k in (totals or {}).items():
            if (r := rec(n)) is not None:
                r.total += k
                add_shapes(r, (shapes or {}).get(n, set()))
                first = (models or {}).get(n)
                if first is not None and not r.model:
                    r.model = first[1]
                add_endpoints(r, (endpoints or {}).get(n, {}))
        if outcomes:
            for n, (done, failed, cancelled, used_in, used_cached, used_out) in outcomes.items():
                if (r := rec(n)) is not None:
                    r.completed += done
                    r.failed += failed
                    r.cancelled += cancelled
                    add_usage(r, used_in, used_cached, used_out)
        if plan is not None:
            for n, change in plan.changes:
                if (r := rec(n)) is not None:
                    change(r)
        for n, r in staged.items():
            if r.state is not JobState.FINALIZING:
                settle(r, 0, now)  # every item has an outcome: it moves on (in flight is
            txn.put(job_key(n), _encode(r), db=db)  # part of queued: 0 once queued is 0)
        self._staged = staged
        return len(staged)

    def committed(self) -> None:
        """The transaction `write` filled is durable: its records are current."""
        hook = self._terms
        for n, r in self._staged.items():
            if r.id not in self.ids:
                self._index(r)
            was = self.live.get(n)
            if r.ended:
                self.live.pop(n, None)
            else:
                self.live[n] = r
            if hook is not None:
                now_terms = terms_of(r)
                if was is None or terms_of(was) != now_terms:
                    hook(n, now_terms)
        self._staged = {}

    def release(self, plan: JobPlan) -> None:
        """The plan is over (committed or failed): its jobs may get tick operations again."""
        self.busy.difference_update(plan.busy)

    def replies(self, plan: JobPlan) -> list[JobRecord | str]:
        """Per operation of a committed plan: the job's record now, or why it was refused."""
        out: list[JobRecord | str] = []
        for a in plan.answers:
            if isinstance(a, str):
                out.append(a)
                continue
            r = self.get(a)
            out.append(r if r is not None else f"no job {a}")
        return out
