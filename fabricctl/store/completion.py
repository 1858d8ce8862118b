"""Completion and results: the half of the durable broker that settles batches.

Contract: `complete_many` writes, in one durable commit, a tombstone per entry, each item's one
result and its result sequence number, the segments' deleted counts and the ledger, and
deletes every segment whose entries are all tombstoned (`delete_segment`) in the same commit;
a completion for a batch no longer in flight is dropped (-1) and creates no second result.
`results_since` and `result` read results back. `DurableBroker` inherits this; it needs its
`core`, `env`, `meta`, `segs`, `work` and delivery counts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.types import ItemResult
from fabricctl.faults import fault_point
from fabricctl.formats.results import ResultRecord, make_record
from fabricctl.store.keys import (
    TOMBSTONE,
    SegHeader,
    entry_key,
    entry_key_of,
    header_encoder,
    rseq_key,
    seg_key,
)

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


def _putmulti(txn: lmdb.Transaction, db: object, rows: list[tuple[bytes, bytes]],
              append: bool = False) -> int:
    """Put new rows (never overwriting); returns how many went in."""
    if not rows:
        return 0
    return txn.cursor(db=db).putmulti(rows, overwrite=False, append=append)[1]  # type: ignore[arg-type]



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
        dbs = self.env.dbs
        inflight, work = self.core.inflight, self.work
        out: list[int] = [-1] * len(done)
        settled: list[tuple[int, int]] = []  # (index in done, batch id)
        settling: set[int] = set()
        rows: list[tuple[bytes, bytes, int, int]] = []  # entry key, record, seg id, tokens
        models: set[str] = set()
        created = int(now)
        for i, (batch_id, results, gpu) in enumerate(done):
            f = inflight.get(batch_id)
            items = work.get(batch_id)
            if f is None or items is None or batch_id in settling:
                self.duplicate_completions += 1
                continue
            batch = f.batch
            settled.append((i, batch_id))
            settling.add(batch_id)
            models.add(batch.model)
            by_id = {r.id: r for r in results}
            lane, epoch = batch.lane, batch.epoch
            for e, item in zip(batch.entries, items, strict=True):
                r = by_id.get(item.id) or ItemResult(
                    item.id, finish_reason="error",
                    error="the engine returned no result for this item")
                rec = make_record(item, r, source=item.source, lane=lane, epoch=epoch, gpu=gpu,
                                  created=created)
                rows.append((entry_key_of(e.key), _result_encoder.encode(rec), e.key >> 32,
                             e.tokens))
        if not settled:
            return out
        segs = self.segs
        epochs = {m: self.core.models[m].epoch for m in models}
        outcome: dict[str, object] = {}
        # the common case, planned outside the transaction: every entry is new to the
        # tombstones and results; a segment whose last entries these are goes whole, so
        # its tombstones are not even written
        per_seg: dict[int, int] = {}
        tokens = 0
        for _, _, seg_id, tok in rows:
            per_seg[seg_id] = per_seg.get(seg_id, 0) + 1
            tokens += tok
        gone = {s for s, k in per_seg.items() if segs[s].deleted + k >= segs[s].count}
        by_key = sorted(rows)
        result_rows = [(k, rec) for k, rec, _, _ in by_key]
        tomb_rows = [(k, TOMBSTONE) for k, _, seg_id, _ in by_key if seg_id not in gone]

        def batched(txn: lmdb.Transaction) -> None:
            n = len(rows)
            if _putmulti(txn, dbs["results"], result_rows) != n:
                raise _Conflict("results")
            if _putmulti(txn, dbs["tomb"], tomb_rows) != len(tomb_rows):
                raise _Conflict("tomb")
            seq = self.meta.rseq
            seq_rows = [(rseq_key(seq + j + 1), k) for j, (k, _, _, _) in enumerate(rows)]
            if _putmulti(txn, dbs["rseq"], seq_rows, append=True) != n:
                raise RuntimeError("result sequence out of order: the meta table is stale")
            fault_point("complete_tombstone")
            finish(txn, per_seg, n, tokens, seq + n, [True] * n)

        def one_by_one(txn: lmdb.Transaction) -> None:
            """Some entry already has a tombstone or a result: put each, keep the first."""
            tomb, res, rseq = dbs["tomb"], dbs["results"], dbs["rseq"]
            seq = self.meta.rseq
            counts: dict[int, int] = {}
            items_done = tokens_done = 0
            stored: list[bool] = []
            for k, rec, seg_id, tok in rows:
                if txn.put(k, TOMBSTONE, db=tomb, overwrite=False):
                    counts[seg_id] = counts.get(seg_id, 0) + 1
                    items_done += 1
                    tokens_done += tok
                ok = txn.put(k, rec, db=res, overwrite=False)
                if ok:
                    seq += 1
                    txn.put(rseq_key(seq), k, db=rseq)
                stored.append(ok)
            fault_point("complete_tombstone")
            finish(txn, counts, items_done, tokens_done, seq, stored)

        def finish(txn: lmdb.Transaction, counts: dict[int, int], items_done: int,
                   tokens_done: int, seq: int, stored: list[bool]) -> None:
            """Deleted counts (or whole-segment deletes), ledger and sequence, same txn."""
            gone_now = []
            for seg_id, n_done in counts.items():
                hdr = segs[seg_id]
                if hdr.deleted + n_done >= hdr.count:
                    fault_point("segment_delete")
                    delete_segment(txn, dbs, seg_id)
                    gone_now.append(seg_id)
                else:
                    txn.put(seg_key(seg_id), header_encoder.encode(
                        msgspec.structs.replace(hdr, deleted=hdr.deleted + n_done)), db=dbs["seg"])
            ledger = self.meta.ledger_after(completed=(items_done, tokens_done))
            self.meta.write(txn, dbs["meta"], ledger=ledger, rseq=seq)
            for model, epoch in epochs.items():
                self.meta.write(txn, dbs["meta"], epoch=(model, epoch))
            outcome.update(per_seg=counts, gone=gone_now, ledger=ledger, seq=seq, stored=stored)

        try:
            self.env.write(batched, drain=True)
        except _Conflict:
            self.env.write(one_by_one, drain=True)
        fault_point("complete_after_commit")
        self.meta.rseq = outcome["seq"]  # type: ignore[assignment]
        self.meta.ledger = outcome["ledger"]  # type: ignore[assignment]
        self.meta.epochs.update(epochs)
        settled_counts: dict[int, int] = outcome["per_seg"]  # type: ignore[assignment]
        for seg_id, n_done in settled_counts.items():
            segs[seg_id].deleted += n_done
        for seg_id in outcome["gone"]:  # type: ignore[attr-defined]
            del segs[seg_id]
        stored: list[bool] = outcome["stored"]  # type: ignore[assignment]
        pos = 0
        complete = self.core.complete
        undone = self.undone
        for i, batch_id in settled:
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
        with self.env.read() as txn:
            cur = txn.cursor(db=dbs["rseq"])
            order: list[tuple[int, bytes]] = []
            if cur.set_range(rseq_key(seq + 1)):
                for k, key in cur:
                    order.append((_seq_of(k, "big"), key))
                    if len(order) >= limit:
                        break
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


def delete_segment(txn: lmdb.Transaction, dbs: dict[str, object], seg_id: int) -> None:
    """Delete a segment whole: its entries, tombstones and header (ids and results stay: a
    completed id remains a duplicate, and its result remains readable)."""
    lo, hi = entry_key(seg_id, 0), entry_key(seg_id + 1, 0)
    for db_name in ("data", "tomb"):
        cur = txn.cursor(db=dbs[db_name])
        if cur.set_range(lo):
            while (k := cur.key()) and k < hi:
                if not cur.delete():
                    break
    txn.delete(seg_key(seg_id), db=dbs["seg"])
