"""Completion: the part of the durable broker that settles batches.

Contract: `complete_steps(done, now)` (the broker's `prepare_complete`) encodes each item's
one result for the batches still in flight and marks them settling (a completion for a batch
no longer in flight, or already settling, is counted as a duplicate and left out: it gets -1
and creates no second result); `settle_steps(txn, plan, ...)` writes, inside the caller's
durable transaction, the results (keyed by entry: a result is what marks its entry
completed), their result sequence numbers, for an item of a job its `jres` row (job, line,
entry key) and its outcome counted on the job (`plan.jobs`: completed, failed when the
result has an error, cancelled for a cancel's rows; and the usage of a successful result,
`core.records.usage_of`, counted only for the result actually stored), and deletes every
segment whose entries all have results (`fabricctl.store.rows.delete_segment_steps`);
`apply_complete_steps(plan, now)`, after the commit, settles the batches in the core (and a
cancel's withdrawn entries, `plan.withdrawn`, in the ledger) and returns the results stored
per batch. `Completion` works on the shared `StoreState` (core, env, segments, in-flight
work, delivery counts, meta) and owns its two counters, `results_stored` and
`duplicate_completions`. Reading results back is `fabricctl.store.reads`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.records import make_record, usage_of
from fabricctl.core.types import ItemResult
from fabricctl.store.faults import fault_point
from fabricctl.store.keys import entry_key_of, jres_key, seg_of
from fabricctl.store.rows import delete_segment_steps, put_sequence, put_steps
from fabricctl.store.steps import STEP_RESULTS, Steps

if TYPE_CHECKING:
    from fabricctl.core.withdrawal import Withdrawn
    from fabricctl.store.state import StoreState

log = logging.getLogger("fabricctl.store")
_result_encoder = msgspec.msgpack.Encoder()

OUT_COMPLETED, OUT_FAILED, OUT_CANCELLED = 0, 1, 2  # a row's outcome, counted on its job
Row = tuple[bytes, bytes, int, int, int, int, int, int, int, int]  # see `CompletePlan.rows`


class _Conflict(Exception):
    """Why: a batched put met a key that already exists: redo the commit one put at a time."""


class CompletePlan:
    """Why: completion is prepared, committed and applied in three steps, so the commit can
    run off the event loop; this is what passes between them."""

    __slots__ = ("epochs", "gone", "jobs", "now", "out", "paces", "per_seg", "rows", "seq",
                 "settled", "stored", "withdrawn")

    def __init__(self, n: int) -> None:
        self.out: list[int] = [-1] * n
        self.settled: list[tuple[int, int]] = []  # (index in the request, batch id)
        # entry key, record, seg, tokens, job, line, outcome (OUT_*), and the usage the
        # result adds to its job (`usage_of`: prompt, cached, completion tokens)
        self.rows: list[Row] = []
        self.withdrawn: list[Withdrawn] = []  # a cancel's entries, taken from their lanes
        # job -> [completed, failed, cancelled, input, cached, output tokens] stored
        self.jobs: dict[int, list[int]] = {}
        self.now = 0.0
        self.epochs: dict[str, int] = {}
        self.paces: dict[str, float] = {}  # model -> pace for the next run (`Broker.paces`)
        self.per_seg: dict[int, int] = {}
        self.gone: list[int] = []
        self.seq = 0
        self.stored: list[bool] = []

    @property
    def writes(self) -> bool:
        """Whether it has anything to commit: settled batches or a cancel's results."""
        return bool(self.settled or self.rows)


class Completion:
    """Why: settling batches is half the store's code; it lives apart from ingest and pull."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self.results_stored = 0
        self.duplicate_completions = 0

    def complete_steps(
        self, done: list[tuple[int, list[ItemResult], int | None]], now: float
    ) -> Steps[CompletePlan]:
        """Encode the results of the batches still in flight and mark them settling (a
        disconnect leaves them in flight); nothing is written yet. It pauses between
        batches every `STEP_RESULTS` results."""
        inflight, work = self.state.core.inflight, self.state.work
        plan = CompletePlan(len(done))
        plan.now = now
        settling = self.state.core.settling
        rows = plan.rows
        models: set[str] = set()
        created = int(now)
        encode = _result_encoder.encode
        mark = STEP_RESULTS
        try:
            for i, (batch_id, results, gpu) in enumerate(done):
                if len(rows) >= mark:
                    mark = len(rows) + STEP_RESULTS
                    yield
                f = inflight.get(batch_id)
                items = work.get(batch_id)
                if f is None or items is None or batch_id in settling:
                    self.duplicate_completions += 1
                    continue
                batch = f.batch
                if gpu is not None:
                    f.shape.gpus.add(gpu)  # for the shape's record (`finished_view`)
                plan.settled.append((i, batch_id))
                settling.add(batch_id)
                models.add(batch.model)
                by_id = {r.id: r for r in results}
                lane, epoch = batch.lane, batch.epoch
                for e, item in zip(batch.entries, items, strict=True):
                    r = by_id.get(item.id) or ItemResult(
                        item.id, finish_reason="error",
                        error="the engine returned no result for this item")
                    rec = make_record(item, r, lane=lane, epoch=epoch, gpu=gpu, created=created)
                    key = e.key
                    used_in, used_cached, used_out = usage_of(rec)
                    rows.append((entry_key_of(key), encode(rec), seg_of(key), e.tokens,
                                 item.job, item.line,
                                 OUT_COMPLETED if r.error is None else OUT_FAILED,
                                 used_in, used_cached, used_out))
        except BaseException:  # closed at a pause, or failed: these batches are not settling
            settling.difference_update(b for _, b in plan.settled)
            raise
        plan.epochs = {m: self.state.core.models[m].epoch for m in models}
        plan.paces = self.state.core.paces(now)
        return plan

    def settle_steps(self, txn: lmdb.Transaction, plan: CompletePlan, batched: bool,
                     grown: dict[int, int]) -> Steps[tuple[int, int]]:
        """Write a prepared completion inside the caller's transaction: results, result
        sequence, whole-segment deletes; returns (items, tokens) completed. `batched` assumes
        every entry is new to the results (and raises `_Conflict` when one is not: redo with
        `batched=False`, one put at a time, the first result kept; such an entry, which the
        id check should make impossible, still completes). `grown`: segments an ingest in
        the same transaction appends to, with their new counts (never deleted whole here).
        A segment's deleted count is kept in memory only: recovery counts its results."""
        dbs = self.state.env.dbs
        segs = self.state.segs
        rows = plan.rows
        seq = self.state.meta.rseq
        counts: dict[int, int] = {}
        items_done = tokens_done = 0
        stored: list[bool] = []
        jobs: dict[int, list[int]] = {}
        jres: list[tuple[bytes, bytes]] = []
        if batched:
            for k, _, seg_id, tok, job, line, outcome, u_in, u_cached, u_out in rows:
                counts[seg_id] = counts.get(seg_id, 0) + 1
                tokens_done += tok
                if job:
                    c = jobs.get(job)
                    if c is None:
                        c = jobs[job] = [0, 0, 0, 0, 0, 0]
                    c[outcome] += 1
                    c[3] += u_in
                    c[4] += u_cached
                    c[5] += u_out
                    jres.append((jres_key(job, line, k), b""))
            items_done = n = len(rows)
            if (yield from put_steps(txn, dbs["results"],
                                     sorted([(r[0], r[1]) for r in rows]))) != n:
                raise _Conflict("results")
            put_sequence(txn, dbs["rseq"], seq, [r[0] for r in rows])
            seq += n
            stored = [True] * n
        else:
            res = dbs["results"]
            new: list[bytes] = []
            for (k, rec, seg_id, tok, job, line, outcome, u_in, u_cached,
                 u_out) in rows:  # each entry settles once
                counts[seg_id] = counts.get(seg_id, 0) + 1  # (the core's in-flight table):
                items_done += 1  # it completes here
                tokens_done += tok
                ok = txn.put(k, rec, db=res, overwrite=False)
                if ok:
                    new.append(k)
                    if job:  # the first result kept: its usage, counted once
                        c = jobs.setdefault(job, [0, 0, 0, 0, 0, 0])
                        c[outcome] += 1
                        c[3] += u_in
                        c[4] += u_cached
                        c[5] += u_out
                        jres.append((jres_key(job, line, k), b""))
                stored.append(ok)
            put_sequence(txn, dbs["rseq"], seq, new)
            seq += len(new)
        if jres:
            jres.sort()
            yield from put_steps(txn, dbs["jres"], jres)
        plan.jobs = jobs
        fault_point("complete_results")
        gone_now = []
        budget = [0]  # keys left to delete before the next pause: pause before the first
        for seg_id, n_done in counts.items():
            hdr = segs[seg_id]
            if hdr.deleted + n_done >= grown.get(seg_id, hdr.count):
                fault_point("segment_delete")
                yield from delete_segment_steps(txn, dbs, seg_id, budget)
                gone_now.append(seg_id)
        plan.per_seg, plan.gone, plan.seq, plan.stored = counts, gone_now, seq, stored
        return items_done, tokens_done

    def apply_complete_steps(self, plan: CompletePlan, now: float) -> Steps[list[int]]:
        """After the commit: settle the batches in the core; returns results stored per
        batch. It pauses every `STEP_RESULTS // 8` batches settled."""
        out = plan.out
        if not plan.writes:
            return out
        segs, work = self.state.segs, self.state.work
        meta = self.state.meta
        meta.rseq = plan.seq
        meta.epochs.update(plan.epochs)
        meta.keep_paces(plan.paces)
        for seg_id, n_done in plan.per_seg.items():
            segs[seg_id].deleted += n_done
        for seg_id in plan.gone:
            del segs[seg_id]
        stored = plan.stored
        pos = 0
        complete = self.state.core.complete
        settling = self.state.core.settling
        undone = self.state.undone
        for j, (i, batch_id) in enumerate(plan.settled):
            if j and j % (STEP_RESULTS // 8) == 0:
                yield
            settling.discard(batch_id)
            n = len(work.pop(batch_id))
            out[i] = sum(stored[pos:pos + n])
            pos += n
            b = complete(batch_id, now)
            if undone:
                for e in b.entries:
                    undone.pop(e.key, None)
            self.results_stored += out[i]
        if plan.withdrawn:  # a cancel's entries: their error results are durable
            self.state.core.settle_withdrawn(plan.withdrawn)
            self.results_stored += len(plan.withdrawn)
            if undone:
                for _, _, e in plan.withdrawn:
                    undone.pop(e.key, None)
        return out
