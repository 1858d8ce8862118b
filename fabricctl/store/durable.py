"""The durable broker: the core's decisions, with every item kept in LMDB segments.

Contract:
- `ingest(items, now)` validates, de-duplicates (an id already queued or completed is a
  reject), assigns each item to its lane (assigned first), writes the entries, segment
  headers and ledger in one durable commit (written second) and only then makes them
  dispatchable; it returns per-item rejects. A full map or disk raises `StoreFullError` and
  stores nothing of that call.
- `pull(consumer, now)` takes a batch from the core, verifies every segment and entry exists
  and carries the batch's shape (the hard guard) before returning its `Work`; a failed
  check puts the batch back untouched. Pending entries live in memory only.
- `complete(batch_id, results, now)` writes a tombstone per entry (a duplicate is a no-op),
  the segment's deleted count, the ledger and each item's first result in one commit, and
  deletes a segment whose entries are all tombstoned. A completion for a batch that is no
  longer in flight is dropped.
- `fail(batch_id, now)` puts a batch back at the front of its lane.
Everything runs on the caller's thread; the server calls it from its event loop only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import lmdb
import msgspec

from fabricctl.core.broker import Broker, Placement, ShapeGuardError, guard_signature
from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Entry, Item, ItemResult, Work
from fabricctl.faults import fault_point
from fabricctl.formats.results import ResultRecord, make_record
from fabricctl.store.env import MiB, StoreEnv
from fabricctl.store.errors import SegmentMissingError, StoreFullError
from fabricctl.store.keys import (
    TOMBSTONE,
    SegHeader,
    StoredEntry,
    entry_decoder,
    entry_encoder,
    entry_key,
    entry_key_of,
    header_encoder,
    ref,
    rseq_key,
    seg_key,
)
from fabricctl.store.meta import Meta
from fabricctl.store.recovery import RecoveryReport, recover

MAX_ID_CHARS = 256
_result_encoder = msgspec.msgpack.Encoder()
_result_decoder = msgspec.msgpack.Decoder(ResultRecord)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Why: the storage knobs an operator may need to turn, with safe defaults."""

    map_size: int = 256 * MiB
    map_ceiling: int = 64 * 1024 * MiB
    segment_entries: int = 4096  # a segment rolls over after this many entries
    disk_reserve: int = 4 * MiB  # refuse ingest below this much free disk (room to complete)


class Reject(msgspec.Struct, array_like=True):
    """One item a submit did not take, by its index in the chunk."""

    index: int
    reason: str


def validate(item: Item) -> str | None:
    """Why an item cannot be stored, or None."""
    if not item.id:
        return "id must be a non-empty string"
    if len(item.id) > MAX_ID_CHARS:
        return f"id is longer than {MAX_ID_CHARS} characters"
    if not item.model:
        return "model must be a non-empty string"
    if item.input_tokens < 1:
        return "input_tokens must be at least 1"
    if item.max_tokens < 1:
        return "max_tokens must be at least 1"
    if not 0 <= item.signature < 1 << 64:
        return "signature must be an unsigned 64-bit integer"
    return None


class DurableBroker:
    """Why: the broker that loses no acknowledged item, whatever kills it."""

    def __init__(
        self, data_dir: Path, now: float, cfg: CoreConfig | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        self.store_cfg = store or StoreConfig()
        self.env = StoreEnv(Path(data_dir), self.store_cfg.map_size, self.store_cfg.map_ceiling)
        self.core = Broker(cfg)
        self.segs: dict[int, SegHeader] = {}
        self.open_segs: dict[tuple[str, int, int], int] = {}  # (model, sig, lane) -> seg id
        self.work: dict[int, list[Item]] = {}  # in-flight batch id -> its items (ids, source)
        self.meta = Meta()
        self.results_stored = 0
        self.duplicate_completions = 0
        self.recovery: RecoveryReport = recover(self, now)

    # -- ingest ------------------------------------------------------------------------------

    def ingest(self, items: list[Item], now: float) -> list[Reject]:
        env, dbs = self.env, self.env.dbs
        if env.free_disk() < self.store_cfg.disk_reserve:
            raise StoreFullError(env.full_message("the disk is nearly full"))
        rejects: list[Reject] = []
        good: list[Item] = []
        seen: set[str] = set()
        with env.read() as txn:
            for i, item in enumerate(items):
                why = validate(item)
                if why is None:
                    key = item.id.encode()
                    if item.id in seen or txn.get(key, db=dbs["ids"]) is not None or (
                        txn.get(key, db=dbs["results"]) is not None
                    ):
                        why = f"duplicate id {item.id!r}"
                if why is not None:
                    rejects.append(Reject(i, why))
                    continue
                seen.add(item.id)
                good.append(item)
        if not good:
            return rejects
        staged: dict[int, SegHeader] = {}
        new_open: dict[tuple[str, int, int], int] = {}
        next_seg = self.meta.next_seg
        rows: list[tuple[bytes, bytes, bytes]] = []
        admits: list[tuple[Placement, Entry]] = []
        tokens = 0
        for item in good:
            p = self.core.place(item.model, item.signature, item.label, item.input_tokens, now)
            lkey = (item.model, item.signature, p.lane.id)
            seg_id = new_open.get(lkey, self.open_segs.get(lkey))
            hdr = staged.get(seg_id) if seg_id is not None else None
            if seg_id is not None and hdr is None:
                hdr = msgspec.structs.replace(self.segs[seg_id])
                staged[seg_id] = hdr
            if hdr is None or hdr.count >= self.store_cfg.segment_entries:
                seg_no = hdr.seg_no + 1 if hdr is not None else 0
                seg_id, next_seg = next_seg, next_seg + 1
                hdr = SegHeader(item.model, item.signature, p.shape.label, p.lane.id, seg_no,
                                p.lane.target, 0, 0, now)
                staged[seg_id] = hdr
                new_open[lkey] = seg_id
            offset = hdr.count
            hdr.count += 1
            if p.lane.target > hdr.target:
                hdr.target = p.lane.target
            value = entry_encoder.encode(StoredEntry(item.id, item.input_tokens, item.max_tokens,
                                                     now, item.payload, item.source))
            rows.append((entry_key(seg_id, offset), value, item.id.encode()))
            admits.append((p, Entry(ref(seg_id, offset), item.input_tokens, item.max_tokens, now)))
            tokens += item.input_tokens
        ledger = self.meta.ledger_after(received=(len(good), tokens))

        def write(txn: lmdb.Transaction) -> None:
            data, ids = dbs["data"], dbs["ids"]
            for key, value, id_key in rows:
                if not txn.put(key, value, db=data, overwrite=False):
                    raise RuntimeError(f"entry key {key.hex()} already exists")
                txn.put(id_key, key, db=ids)
            for seg_id, hdr in staged.items():
                txn.put(seg_key(seg_id), header_encoder.encode(hdr), db=dbs["seg"])
            self.meta.write(txn, dbs["meta"], next_seg=next_seg, ledger=ledger)
            fault_point("ingest_before_commit")

        env.write(write)
        fault_point("ingest_after_commit")
        self.meta.next_seg = next_seg
        self.meta.ledger = ledger
        self.segs.update(staged)
        self.open_segs.update(new_open)
        for p, entry in admits:
            self.core.admit(p, entry)
        return rejects

    # -- dispatch -----------------------------------------------------------------------------

    def pull(self, consumer: str, now: float) -> Work | None:
        batch = self.core.pull(consumer, now)
        if batch is None:
            return None
        try:
            # step 1: every segment and entry exists and is of this shape, before anything moves
            fault_point("dispatch_step1")
            keys = []
            for e in batch.entries:
                hdr = self.segs.get(e.key >> 32)
                if hdr is None:
                    raise SegmentMissingError(f"segment {e.key >> 32} of batch {batch.id} is gone")
                guard_signature(batch.signature, hdr.signature, f"segment {e.key >> 32}")
                keys.append(entry_key_of(e.key))
            data = self.env.dbs["data"]
            with self.env.read() as txn:
                values = [txn.get(k, db=data) for k in keys]
        except ShapeGuardError:
            raise
        except BaseException:
            self.core.fail(batch.id, now)
            raise
        items: list[Item] = []
        for k, v in zip(keys, values, strict=True):
            if v is None:
                self.core.fail(batch.id, now)
                raise SegmentMissingError(f"entry {k.hex()} of batch {batch.id} is gone")
            s = entry_decoder.decode(v)
            items.append(Item(s.id, batch.model, batch.signature, s.tokens, s.max_tokens,
                              s.payload, "", s.source))
        fault_point("dispatch_step2")  # cursors advance: the core popped the lane queue
        fault_point("dispatch_step3")  # pending map: the core's in-flight table
        self.work[batch.id] = items
        return Work(batch.id, batch.model, batch.signature, batch.lane, batch.epoch,
                    batch.pad_to, batch.max_tokens, batch.max_input_len, items)

    def fail(self, batch_id: int, now: float) -> None:
        if batch_id in self.core.inflight:
            self.core.fail(batch_id, now)
        self.work.pop(batch_id, None)

    # -- completion ---------------------------------------------------------------------------

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
        plan: list[tuple[int, list[tuple[Entry, bytes, bytes]]]] = []
        out: list[int] = []
        for batch_id, results, gpu in done:
            f = self.core.inflight.get(batch_id)
            items = self.work.get(batch_id)
            if f is None or items is None or any(p[0] == batch_id for p in plan):
                self.duplicate_completions += 1
                out.append(-1)
                continue
            batch = f.batch
            by_id = {r.id: r for r in results}
            rows = []
            for e, item in zip(batch.entries, items, strict=True):
                r = by_id.get(item.id) or ItemResult(
                    item.id, finish_reason="error",
                    error="the engine returned no result for this item")
                rec = make_record(item, r, source=item.source, lane=batch.lane,
                                  epoch=batch.epoch, gpu=gpu, created=int(now))
                rows.append((e, item.id.encode(), _result_encoder.encode(rec)))
            plan.append((batch_id, rows))
            out.append(0)
        if not plan:
            return out
        epochs = {self.core.inflight[b].batch.model for b, _ in plan}
        outcome: dict[str, object] = {}

        def write(txn: lmdb.Transaction) -> None:
            changed: dict[int, SegHeader] = {}
            done_items = done_tokens = 0
            seq = self.meta.rseq
            stored: list[int] = []
            tomb, res, rseq = dbs["tomb"], dbs["results"], dbs["rseq"]
            for _, rows in plan:
                n = 0
                for e, id_key, rec in rows:
                    if txn.put(entry_key_of(e.key), TOMBSTONE, db=tomb, overwrite=False):
                        seg_id = e.key >> 32
                        hdr = changed.get(seg_id)
                        if hdr is None:
                            hdr = changed[seg_id] = msgspec.structs.replace(self.segs[seg_id])
                        hdr.deleted += 1
                        done_items += 1
                        done_tokens += e.tokens
                    if txn.put(id_key, rec, db=res, overwrite=False):
                        seq += 1
                        n += 1
                        txn.put(rseq_key(seq), id_key, db=rseq)
                stored.append(n)
            fault_point("complete_tombstone")
            gone = []
            for seg_id, hdr in changed.items():
                if hdr.deleted >= hdr.count:
                    fault_point("segment_delete")
                    delete_segment(txn, dbs, seg_id)
                    gone.append(seg_id)
                else:
                    txn.put(seg_key(seg_id), header_encoder.encode(hdr), db=dbs["seg"])
            ledger = self.meta.ledger_after(completed=(done_items, done_tokens))
            self.meta.write(txn, dbs["meta"], ledger=ledger, rseq=seq)
            for model in epochs:
                self.meta.write(txn, dbs["meta"], epoch=(model, self.core.models[model].epoch))
            outcome.update(changed=changed, gone=gone, ledger=ledger, seq=seq, stored=stored)

        self.env.write(write)
        fault_point("complete_after_commit")
        self.meta.rseq = outcome["seq"]  # type: ignore[assignment]
        self.meta.ledger = outcome["ledger"]  # type: ignore[assignment]
        for model in epochs:
            self.meta.epochs[model] = self.core.models[model].epoch
        self.segs.update(outcome["changed"])  # type: ignore[arg-type]
        for seg_id in outcome["gone"]:  # type: ignore[attr-defined]
            hdr = self.segs.pop(seg_id)
            lkey = (hdr.model, hdr.signature, hdr.lane)
            if self.open_segs.get(lkey) == seg_id:
                del self.open_segs[lkey]
        stored_iter = iter(outcome["stored"])  # type: ignore[call-overload]
        for i, (batch_id, _, _) in enumerate(done):
            if out[i] == -1:
                continue
            out[i] = next(stored_iter)
            self.work.pop(batch_id, None)
            self.core.complete(batch_id, now)
            self.results_stored += out[i]
        return out

    # -- results --------------------------------------------------------------------------------

    def results_since(self, seq: int, limit: int = 1000) -> list[tuple[int, ResultRecord]]:
        dbs = self.env.dbs
        out: list[tuple[int, ResultRecord]] = []
        with self.env.read() as txn:
            cur = txn.cursor(db=dbs["rseq"])
            if not cur.set_range(rseq_key(seq + 1)):
                return out
            for k, id_key in cur:
                raw = txn.get(id_key, db=dbs["results"])
                if raw is not None:
                    out.append((struct.unpack(">Q", k)[0], _result_decoder.decode(raw)))
                if len(out) >= limit:
                    break
        return out

    def result(self, item_id: str) -> ResultRecord | None:
        with self.env.read() as txn:
            raw = txn.get(item_id.encode(), db=self.env.dbs["results"])
        return _result_decoder.decode(raw) if raw is not None else None

    def close(self) -> None:
        self.env.close()


def delete_segment(txn: lmdb.Transaction, dbs: dict[str, object], seg_id: int) -> None:
    """Delete a segment whole: its entries (and their id index), tombstones and header."""
    lo, hi = entry_key(seg_id, 0), entry_key(seg_id + 1, 0)
    for db_name in ("data", "tomb"):
        cur = txn.cursor(db=dbs[db_name])
        if cur.set_range(lo):
            while cur.key() and cur.key() < hi:
                if db_name == "data":
                    txn.delete(entry_decoder.decode(cur.value()).id.encode(), db=dbs["ids"])
                if not cur.delete():
                    break
    txn.delete(seg_key(seg_id), db=dbs["seg"])
