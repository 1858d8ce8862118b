"""Job operations prepared: what a job's open, seal, cancel or tick changes, before the commit.

Contract: `JobOps.prepare(ops, now, into)` turns job operations (`fabricctl.store.jobs`) into a
`JobPlan` (new records, changes applied to the record inside the commit) and, for a cancel or
an expiry, withdraws the job's queued entries from the core's lanes (`Broker.withdraw`; the
entries of its segments: each segment is job-pure) and adds an error result for each
("cancelled" / "expired", finish_reason the same) to `into`, the completion plan of the same
commit (a new one when None), counted as cancelled on the job. A `PriorityOp` changes a live
job's priority in the commit; for a job that ended (or none) its answer is the message of
why not (`ended_message`). Nothing is written here.
`in_flight()` is, per job, the items of it an engine holds (the core's in-flight batches:
entry key -> segment -> job).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from fabricctl.core.jobs import (
    MAX_SHAPES,
    JobRecord,
    JobState,
    expire_due,
    mark_expired,
    request_cancel,
)
from fabricctl.core.records import ResultRecord, Source
from fabricctl.core.types import Entry
from fabricctl.store import jobplan
from fabricctl.store.completion import OUT_CANCELLED, CompletePlan
from fabricctl.store.keys import entry_decoder, entry_key_of, ref_of, seg_of

if TYPE_CHECKING:
    from fabricctl.store.state import StoreState

_result_encode = msgspec.msgpack.Encoder().encode


def ended_message(rec: JobRecord | None, n: int) -> str:
    """Why a priority change of a job that is not live was refused."""
    if rec is None:
        return f"no job {n}"
    return f"job {rec.id} has ended ({rec.state.value}): its priority can no longer change"


class JobOps:
    """Why: a job operation reaches into the core (a cancel withdraws queued entries) and the
    segments; this part does that and hands the commit a plan."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self.table = state.jobs

    def in_flight(self) -> dict[int, int]:
        """Job -> items of it an engine holds now (from the core's in-flight batches)."""
        segs = self.state.segs
        out: dict[int, int] = {}
        last_seg, job = -1, 0
        for f in self.state.core.inflight.values():
            for e in f.batch.entries:
                sid = seg_of(e.key)
                if sid != last_seg:
                    last_seg = sid
                    h = segs.get(sid)
                    job = h.job if h is not None else 0
                if job:
                    out[job] = out.get(job, 0) + 1
        return out

    def prepare(self, ops: list[jobplan.JobOp], now: float, into: CompletePlan | None
                ) -> tuple[jobplan.JobPlan, CompletePlan | None]:
        """Prepare `ops` (nothing is written yet): new records, changes, and for a cancel the
        error results of the job's queued entries (withdrawn from their lanes), added to
        `into` (the cycle's completion; a new plan when None and there are any)."""
        plan = jobplan.JobPlan(now)
        table = self.table
        for op in ops:
            if isinstance(op, jobplan.FlushOp):  # no job changes: the commit writes what is pending
                plan.answers.append("flushed")
                continue
            if isinstance(op, jobplan.OpenOp):
                plan.answers.append(table.open(op, now, plan))
                continue
            n = op.job
            if n not in table.live and n not in plan.new:
                if isinstance(op, jobplan.PriorityOp):
                    plan.answers.append(ended_message(table.get(n), n))
                    continue
                if isinstance(op, jobplan.FinalizeOp | jobplan.CancelOp):
                    plan.busy.add(n)
                plan.answers.append(n if table.get(n) is not None else f"no job {n}")
                continue
            if isinstance(op, jobplan.SealOp):
                plan.changes.append((n, table.seal_change(op, now)))
            elif isinstance(op, jobplan.PriorityOp):
                plan.changes.append((n, table.priority_change(op.priority)))
            elif isinstance(op, jobplan.FinalizeOp):
                plan.busy.add(n)
                plan.changes.append((n, table.finalize_change(op.in_flight, now)))
            else:
                plan.busy.add(n)
                into = self._cancel(n, op.expired, now, plan, into)
            plan.answers.append(n)
        return plan, into

    def _cancel(self, n: int, expired: bool, now: float, plan: jobplan.JobPlan,
                into: CompletePlan | None) -> CompletePlan | None:
        rec = self.table.live[n]
        probe = msgspec.structs.replace(rec)
        if expired:
            if expire_due(probe, now):
                mark_expired(probe)
        else:
            request_cancel(probe, now)
        if not (probe.state is JobState.CANCELLING or probe.expired):
            return into  # ended meanwhile, or nothing to expire: the record as it is
        plan.changes.append((n, self.table.cancel_change(expired, now)))
        st = self.state
        segs = st.segs

        def pick(e: Entry) -> bool:
            h = segs.get(seg_of(e.key))
            return h is not None and h.job == n

        models = None if len(rec.shapes) >= MAX_SHAPES else {s.model for s in rec.shapes}
        picked = st.core.withdraw(pick, models)
        if not picked:
            return into
        plan_c = into if into is not None else CompletePlan(0)
        plan_c.withdrawn.extend(picked)
        plan_c.now = max(plan_c.now, now)
        why = "expired" if expired else "cancelled"
        keys = sorted(entry_key_of(e.key) for _, _, e in picked)
        with st.env.read() as txn:
            found = txn.cursor(db=st.env.dbs["data"]).getmulti(keys)
        created = int(now)
        tokens = {entry_key_of(e.key): e.tokens for _, _, e in picked}
        for raw_k, v in found:
            k = bytes(raw_k)
            s = entry_decoder.decode(v)
            seg = seg_of(ref_of(k))
            h = segs[seg]
            ms = st.core.models.get(h.model)
            rec_r = ResultRecord(
                s.id, h.model, "", why, s.tokens, 0, None, h.signature, s.lane,
                ms.epoch if ms is not None else 0, None, why, Source(s.source), created,
                b"", 0, n, s.line)
            plan_c.rows.append((k, _result_encode(rec_r), seg, tokens[k], n, s.line,
                                OUT_CANCELLED, 0, 0, 0))
        return plan_c
