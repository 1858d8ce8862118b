"""Completion and results: the half of the durable broker that settles batches.

Contract: `complete_many` writes, in one durable commit, each item's one result (keyed by its
entry: the result is what marks the entry completed) and its result sequence number, and the
ledger, and deletes every segment whose entries all have results (`delete_segment`) in the
same commit; a completion for a batch no longer in flight is dropped (-1) and creates no
second result. `results_since` and `result` read results back. `DurableBroker` inherits
this; it needs its `core`, `env`, `meta`, `segs`, `work` and delivery counts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.types import ItemResult
from fabricctl.faults import fault_point
from fabricctl.formats.results import ResultRecord, make_record
from fabricctl.store.ingest import put_steps
from fabricctl.store.keys import SegHeader, entry_key, rseq_key, seg_key
from fabricctl.store.steps import STEP_DELETES, STEP_RESULTS, Steps, run_steps

if TYPE_CHECKING:
    from fabricctl.core.broker import Broker
    from fabricctl.core.types import Item
    from fabricctl.store.env import StoreEnv
    from fabricctl.store.meta import Meta

log = logging.getLogger("fabricctl.store")
_result_encoder = msgspec.msgpack.Encoder()
_result_decoder = msgspec.msgpack.Decoder(ResultRecord)
_seq_of = int.from_bytes


class _Conflict(Exception):
    """A batched put met a key that already exists: redo the commit one put at a time."""


class CompletePlan:
    """Why: completion is prepared, committed and applied in three steps, so the commit can
    run off the event loop; this is what passes between them."""

    __slots__ = ("epochs", "gone", "out", "per_seg", "rows", "seq", "settled", "stored")

    def __init__(self, n: int) -> None:
        self.out: list[int] = [-1] * n
        self.settled: list[tuple[int, int]] = []  # (index in the request, batch id)
        self.rows: list[tuple[bytes, bytes, int, int]] = []  # entry key, record, seg, tokens
        self.epochs: dict[str, int] = {}
        self.per_seg: dict[int, int] = {}
        self.gone: list[int] = []
        self.seq = 0
        self.stored: list[bool] = []


class Completion:
    """Why: settling batches is half the store's code; it lives apart from ingest and pull."""

    core: Broker
    env: StoreEnv
    meta: Meta
    segs: dict[int, SegHeader]
    work: dict[int, list[Item]]
    results_stored: int
    duplicate_completions: int
    undone: dict[int, tuple[int, str]]  # entry key -> (times back undone, why)

    def fail(self, batch_id: int, now: float, reason: str = "") -> None:
        raise NotImplementedError

    def commit(self, ingest: object = None, complete: CompletePlan | None = None) -> None:
        raise NotImplementedError

    # -- completion ----------

    def complete(
        self, batch_id: int, results: list[ItemResult], now: float, gpu: int | None = None
    ) -> int:
        """Settle one batch durably; returns results stored, or -1 if it is not in flight."""
        return self.complete_many([(batch_id, results, gpu)], now)[0]

    def complete_many(
        self, done: list[tuple[int, list[ItemResult], int | None]], now: float
    ) -> list[int]:
        """Settle several batches in one durable commit (group commit of completions).

        Returns, per batch, the results stored, or -1 for a batch that is not in flight
        (a late or duplicate completion: dropped, it creates no second result).
        """
        plan = self.prepare_complete(done, now)
        if plan.settled:
            try:
                self.commit(complete=plan)
            except BaseException:
                self.abort_complete(plan, now)
                raise
        return self.apply_complete(plan, now)

    def prepare_complete(
        self, done: list[tuple[int, list[ItemResult], int | None]], now: float
    ) -> CompletePlan:
        """Encode the results of the batches still in flight and mark them settling (a
        disconnect leaves them in flight); nothing is written yet."""
        return run_steps(self.complete_steps(done, now))

    def complete_steps(
        self, done: list[tuple[int, list[ItemResult], int | None]], now: float
    ) -> Steps[CompletePlan]:
        """`prepare_complete`, pausing between batches every `STEP_RESULTS` results."""
        inflight, work = self.core.inflight, self.work
        plan = CompletePlan(len(done))
        settling = self.core.settling
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
                    rows.append((e.key.to_bytes(12, "big"), encode(rec), e.key >> 32, e.tokens))
        except BaseException:  # closed at a pause, or failed: these batches are not settling
            settling.difference_update(b for _, b in plan.settled)
            raise
        plan.epochs = {m: self.core.models[m].epoch for m in models}
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
        dbs = self.env.dbs
        segs = self.segs
        rows = plan.rows
        seq = self.meta.rseq
        counts: dict[int, int] = {}
        items_done = tokens_done = 0
        stored: list[bool] = []
        if batched:
            for _, _, seg_id, tok in rows:
                counts[seg_id] = counts.get(seg_id, 0) + 1
                tokens_done += tok
            items_done = n = len(rows)
            if (yield from put_steps(txn, dbs["results"],
                                     sorted([(k, rec) for k, rec, _, _ in rows]))) != n:
                raise _Conflict("results")
            _put_sequence(txn, dbs["rseq"], seq, [k for k, _, _, _ in rows])
            seq += n
            stored = [True] * n
        else:
            res = dbs["results"]
            new: list[bytes] = []
            for k, rec, seg_id, tok in rows:  # each entry settles once (the core's in-flight
                counts[seg_id] = counts.get(seg_id, 0) + 1  # table): it completes here
                items_done += 1
                tokens_done += tok
                ok = txn.put(k, rec, db=res, overwrite=False)
                if ok:
                    new.append(k)
                stored.append(ok)
            _put_sequence(txn, dbs["rseq"], seq, new)
            seq += len(new)
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

    def abort_complete(self, plan: CompletePlan, now: float) -> None:
        """The commit failed: the batches are no longer settling; one whose consumer left
        meanwhile goes back to its lane (nobody else would ever return it)."""
        settling, inflight = self.core.settling, self.core.inflight
        for _, batch_id in plan.settled:
            settling.discard(batch_id)
            f = inflight.get(batch_id)
            if f is not None and f.batch.consumer not in self.core.consumers:
                self.fail(batch_id, now, "its completion could not be stored")

    def apply_complete(self, plan: CompletePlan, now: float) -> list[int]:
        """After the commit: settle the batches in the core; returns results stored per batch."""
        return run_steps(self.apply_complete_steps(plan, now))

    def apply_complete_steps(self, plan: CompletePlan, now: float) -> Steps[list[int]]:
        """`apply_complete`, pausing every `STEP_RESULTS // 8` batches settled."""
        out = plan.out
        if not plan.settled:
            return out
        segs, work = self.segs, self.work
        self.meta.rseq = plan.seq
        self.meta.epochs.update(plan.epochs)
        for seg_id, n_done in plan.per_seg.items():
            segs[seg_id].deleted += n_done
        for seg_id in plan.gone:
            del segs[seg_id]
        stored = plan.stored
        pos = 0
        complete = self.core.complete
        settling = self.core.settling
        undone = self.undone
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
        return out

    # -- results ----------

    def results_since(self, seq: int, limit: int = 1000) -> list[tuple[int, ResultRecord]]:
        """Up to `limit` results stored after sequence number `seq`, oldest first."""
        dbs = self.env.dbs
        start = seq + 1
        with self.env.read() as txn:
            cur = txn.cursor(db=dbs["rseq"])
            order: list[tuple[int, bytes]] = []
            # the run that holds `start` begins at or before it
            at = cur.set_range(rseq_key(start))
            if not at or cur.key() != rseq_key(start):
                at = cur.prev() if at else cur.last()
                if not at:
                    at = cur.first()
            while at and len(order) < limit:
                first, keys = _seq_of(cur.key(), "big"), cur.value()
                for j in range(max(0, start - first), len(keys) // 12):
                    order.append((first + j, keys[12 * j:12 * j + 12]))
                    if len(order) >= limit:
                        break
                at = cur.next()
            found = dict(txn.cursor(db=dbs["results"]).getmulti([k for _, k in order]))
        decode = _result_decoder.decode
        return [(s, decode(found[k])) for s, k in order if k in found]

    def result(self, item_id: str) -> ResultRecord | None:
        """The stored result of an item, or None while it has none."""
        dbs = self.env.dbs
        with self.env.read() as txn:
            key = txn.get(item_id.encode(), db=dbs["ids"])
            raw = txn.get(key, db=dbs["results"]) if key is not None else None
        return _result_decoder.decode(raw) if raw is not None else None


def _put_sequence(txn: lmdb.Transaction, db: object, last: int, keys: list[bytes]) -> None:
    """Number a commit's new results `last + 1`, `last + 2`, ...: one row, keyed by the first
    number, holding their entry keys in order."""
    if keys and not txn.put(rseq_key(last + 1), b"".join(keys), db=db, append=True):
        raise RuntimeError("result sequence out of order: the meta table is stale")


def delete_segment(txn: lmdb.Transaction, dbs: dict[str, object], seg_id: int) -> None:
    """Delete a segment whole: its entries and header (ids and results stay: a completed id
    remains a duplicate, and its result remains readable)."""
    run_steps(delete_segment_steps(txn, dbs, seg_id))


def delete_segment_steps(txn: lmdb.Transaction, dbs: dict[str, object], seg_id: int,
                         budget: list[int] | None = None) -> Steps[None]:
    """`delete_segment`, pausing every `STEP_DELETES` keys, counted across the calls that
    share `budget` (the keys left before the next pause: 0 pauses first), so a commit that
    deletes many small segments does not pause for each one."""
    left = budget if budget is not None else [STEP_DELETES]
    lo, hi = entry_key(seg_id, 0), entry_key(seg_id + 1, 0)
    cur = txn.cursor(db=dbs["data"])
    if cur.set_range(lo):
        while (k := cur.key()) and k < hi:
            if left[0] <= 0:
                left[0] = STEP_DELETES
                yield
            if not cur.delete():
                break
            left[0] -= 1
    txn.delete(seg_key(seg_id), db=dbs["seg"])
