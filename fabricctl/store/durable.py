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
- `complete(batch_id, results, now)` writes a tombstone per entry, each item's one result
  and its result sequence number, the segments' deleted counts and the ledger in one commit,
  and deletes a segment whose entries are all tombstoned in the same commit. A completion
  for a batch that is no longer in flight (settled, failed, or from before a restart) is
  dropped and returns -1: it creates no second result.
- `fail(batch_id, now, reason)` puts a batch back at the front of its lane;
  `disconnect(consumer, now, why)` does so for every batch a lost consumer held.
- Crash loops are bounded: every entry that comes back undone (failed, or held by a lost
  consumer) is counted in memory; one that was handed out `max_deliveries` times without a
  result is not handed out again: `pull` completes it with an error result ("quarantined
  after N deliveries without a result; last: <reason>") and sends the rest of its batch.
Everything runs on the caller's thread; the server calls it from its event loop only.

Cost model: an LMDB commit costs about one page write per page it dirties, so every write
here is shaped to touch few pages. A segment holds one shape's entries of consecutive
commits (each entry records its lane), and only the newest segment takes more entries, so an
ingest's entry keys all lie above every stored key: it appends them (`putmulti` in append
mode, return counts checked) onto fresh, full pages at the end of the table, whatever the
number of lanes it feeds. Lane-keyed segments cost one dirty leaf per lane an ingest fed:
about 600 scattered page writes per 1,024-item commit, a third of the ingest rate. Results
are keyed by entry key (a batch's results are neighbours when its lane filled in order),
result sequence numbers are appended, and segment headers are rewritten only when a segment
is created or its deleted count moves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import lmdb
import msgspec

from fabricctl.core.broker import Broker, Placement, ShapeGuardError, guard_signature
from fabricctl.core.config import CoreConfig
from fabricctl.core.shape import Shape
from fabricctl.core.types import Batch, Entry, Item, ItemResult, Work
from fabricctl.faults import fault_point
from fabricctl.store.completion import Completion, _putmulti
from fabricctl.store.env import MiB, StoreEnv
from fabricctl.store.errors import SegmentMissingError, StoreFullError
from fabricctl.store.keys import (
    _ENTRY,
    SegHeader,
    StoredEntry,
    entry_decoder,
    entry_encoder,
    entry_key_of,
    header_encoder,
    seg_key,
)
from fabricctl.store.meta import Meta
from fabricctl.store.recovery import RecoveryReport, recover

log = logging.getLogger("fabricctl.store")
MAX_ID_CHARS = 256
MAX_ID_BYTES = 511  # LMDB's key size limit: the id is the key of the id index


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Why: the storage knobs an operator may need to turn, with safe defaults."""

    map_size: int = 256 * MiB
    map_ceiling: int = 64 * 1024 * MiB
    segment_entries: int = 4096  # a segment rolls over after this many entries
    disk_reserve: int = 4 * MiB  # refuse ingest below this much free disk (room to complete)
    max_deliveries: int = 5  # an entry handed out this often without a result is quarantined


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


def _valid(item: Item) -> bool:
    """The common case of `validate` in one expression (the hot path of ingest)."""
    return (0 < len(item.id) <= MAX_ID_CHARS and bool(item.model) and item.input_tokens >= 1
            and item.max_tokens >= 1 and 0 <= item.signature < 1 << 64)


class _Run:
    """What one ingest appends to one segment (one shape's entries of this commit)."""

    __slots__ = ("base", "end", "hdr", "new", "rows", "seg_id")

    def __init__(self, seg_id: int, hdr: SegHeader, new: bool) -> None:
        self.seg_id = seg_id
        self.base = seg_id << 32
        self.hdr = hdr
        self.new = new
        self.end = hdr.count  # the next offset
        self.rows: list[tuple[bytes, bytes]] = []


class DurableBroker(Completion):
    """Why: the broker that loses no acknowledged item, whatever kills it."""

    def __init__(
        self, data_dir: Path, now: float, cfg: CoreConfig | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        self.store_cfg = store or StoreConfig()
        self.env = StoreEnv(Path(data_dir), self.store_cfg.map_size, self.store_cfg.map_ceiling)
        self.core = Broker(cfg)
        self.segs: dict[int, SegHeader] = {}
        self.tail_seg = 0  # the newest segment: the only one that may take more entries
        self.work: dict[int, list[Item]] = {}  # in-flight batch id -> its items (ids, source)
        self.meta = Meta()
        self.results_stored = 0
        self.duplicate_completions = 0
        self.undone: dict[int, tuple[int, str]] = {}  # entry key -> (times back undone, why)
        self.quarantined = 0
        try:
            self.recovery: RecoveryReport = recover(self, now)
        except BaseException:
            self.env.close()
            raise

    # -- ingest ----------

    def _screen(self, items: list[Item]) -> tuple[list[Reject], list[tuple[int, Item, bytes]]]:
        """Split a chunk into rejects and the items to store (index, item, UTF-8 id)."""
        rejects: list[Reject] = []
        good: list[tuple[int, Item, bytes]] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            why = None if _valid(item) else validate(item)
            if why is None:
                ident = item.id
                idb = ident.encode()
                if len(idb) > MAX_ID_BYTES:
                    why = f"id is longer than {MAX_ID_BYTES} bytes in UTF-8"
                elif ident in seen:
                    why = f"duplicate id {ident!r}"
                else:
                    seen.add(ident)
                    good.append((i, item, idb))
                    continue
            rejects.append(Reject(i, why))
        if good:
            with self.env.read() as txn:
                found = txn.cursor(db=self.env.dbs["ids"]).getmulti([g[2] for g in good])
            if found:
                stored = {k for k, _ in found}
                rejects.extend(Reject(i, f"duplicate id {item.id!r}")
                               for i, item, idb in good if idb in stored)
                rejects.sort(key=lambda r: r.index)
                good = [g for g in good if g[2] not in stored]
        return rejects, good

    def ingest(self, items: list[Item], now: float) -> list[Reject]:
        env, dbs = self.env, self.env.dbs
        if env.free_disk() < self.store_cfg.disk_reserve:
            raise StoreFullError(env.full_message("the disk is nearly full"))
        rejects, good = self._screen(items)
        if not good:
            return rejects
        place = self.core.place
        segs = self.segs
        limit = self.store_cfg.segment_entries
        runs: dict[Shape, _Run] = {}  # the open run of each shape this call touches
        every: list[_Run] = []
        next_seg = self.meta.next_seg
        tail = segs.get(self.tail_seg)
        id_rows: list[tuple[bytes, bytes]] = []
        admits: list[tuple[Placement, Entry]] = []
        tokens = 0
        encode, pack = entry_encoder.encode, _ENTRY.pack
        for _, item, idb in good:
            n = item.input_tokens
            p = place(item.model, item.signature, item.label, n, now)
            run = runs.get(p.shape)
            if run is None or run.end >= limit:  # first item of this shape here, or a full run
                if (run is None and tail is not None and tail.count < limit
                        and tail.signature == item.signature and tail.model == item.model):
                    run = _Run(self.tail_seg, tail, False)  # the newest segment grows
                    tail = None
                else:
                    hdr = SegHeader(item.model, item.signature, p.shape.label, 0, 0, now)
                    run = _Run(next_seg, hdr, True)
                    next_seg += 1
                runs[p.shape] = run
                every.append(run)
            lane = p.lane
            off = run.end
            run.end = off + 1
            key = pack(run.seg_id, off)
            run.rows.append((key, encode(StoredEntry(
                n, item.max_tokens, now, lane.id, lane.target, item.id, item.payload,
                item.source))))
            id_rows.append((idb, key))
            admits.append((p, Entry(run.base | off, n, item.max_tokens, now)))
            tokens += n
        every.sort(key=lambda r: r.seg_id)  # then their rows are in key order
        data_rows = [row for r in every for row in r.rows]
        seg_rows = [(seg_key(r.seg_id), header_encoder.encode(
            msgspec.structs.replace(r.hdr, count=r.end))) for r in every if r.new]
        ledger = self.meta.ledger_after(received=(len(good), tokens))
        id_rows.sort()

        def write(txn: lmdb.Transaction) -> None:
            # every new key is above every stored one: append (return counts checked)
            for db, rows, append in (("data", data_rows, True), ("seg", seg_rows, True),
                                     ("ids", id_rows, False)):
                added = _putmulti(txn, dbs[db], rows, append=append)
                if added != len(rows):  # the screen ran just before, and we are the only writer
                    raise RuntimeError(f"ingest: {len(rows) - added} {db} keys were not "
                                       "stored (already there, or out of order)")
            self.meta.write(txn, dbs["meta"], next_seg=next_seg, ledger=ledger)
            fault_point("ingest_before_commit")

        env.write(write)
        fault_point("ingest_after_commit")
        self.meta.next_seg = next_seg
        self.meta.ledger = ledger
        for r in every:
            r.hdr.count = r.end
            if r.new:
                segs[r.seg_id] = r.hdr
        self.tail_seg = every[-1].seg_id
        admit = self.core.admit
        for p, entry in admits:
            admit(p, entry)
        return rejects

    # -- dispatch ----------

    def pull(self, consumer: str, now: float) -> Work | None:
        batch = self.core.pull(consumer, now)
        if batch is None:
            return None
        label = ""
        try:
            # step 1: every segment and entry exists and is of this shape, before anything moves
            fault_point("dispatch_step1")
            keys = []
            last = -1
            segs = self.segs
            for e in batch.entries:
                seg_id = e.key >> 32
                if seg_id != last:
                    hdr = segs.get(seg_id)
                    if hdr is None:
                        raise SegmentMissingError(f"segment {seg_id} of batch {batch.id} is gone")
                    guard_signature(batch.signature, hdr.signature, f"segment {seg_id}")
                    label = hdr.label
                    last = seg_id
                keys.append(entry_key_of(e.key))
            with self.env.read() as txn:
                found = txn.cursor(db=self.env.dbs["data"]).getmulti(keys)
            if len(found) != len(keys):
                have = {k for k, _ in found}
                gone = next(k for k in keys if k not in have)
                raise SegmentMissingError(f"entry {gone.hex()} of batch {batch.id} is gone")
        except ShapeGuardError:
            raise
        except BaseException:
            self.core.fail(batch.id, now)
            raise
        decode = entry_decoder.decode
        model, sig = batch.model, batch.signature
        items = []
        for _, v in found:
            s = decode(v)
            items.append(Item(s.id, model, sig, s.tokens, s.max_tokens, s.payload, label,
                              s.source))
        fault_point("dispatch_step2")  # cursors advance: the core popped the lane queue
        fault_point("dispatch_step3")  # pending map: the core's in-flight table
        if self.undone:
            items = self._quarantine(batch, items, now)
            if not items:
                return self.pull(consumer, now)  # the whole batch was quarantined
        self.work[batch.id] = items
        return Work(batch.id, model, sig, batch.lane, batch.epoch, batch.pad_to,
                    batch.max_tokens, batch.max_input_len, items)

    def _quarantine(self, batch: Batch, items: list[Item], now: float) -> list[Item]:
        """Settle the entries of a fresh batch that were handed out `max_deliveries` times
        without a result, each with an error result; returns the items still to send."""
        limit = self.store_cfg.max_deliveries
        undone = self.undone
        bad = [i for i, e in enumerate(batch.entries)
               if undone.get(e.key, (0, ""))[0] >= limit]
        if not bad:
            return items
        results = []
        for i in bad:
            n, why = undone[batch.entries[i].key]
            results.append(ItemResult(items[i].id, finish_reason="error", error=(
                f"quarantined after {n} deliveries without a result"
                + (f"; last: {why}" if why else ""))))
        skip = set(bad)
        keep = [it for i, it in enumerate(items) if i not in skip]
        qid = batch.id if not keep else self.core.split(batch.id, bad).id
        self.work[qid] = [items[i] for i in bad]
        self.complete_many([(qid, results, None)], now)
        self.quarantined += len(bad)
        log.warning("quarantined %d item(s) of batch %d after %d deliveries without a result "
                    "(%s); they get an error result", len(bad), batch.id, limit,
                    results[0].error)
        return keep

    def _undone(self, batch_id: int, why: str) -> None:
        f = self.core.inflight.get(batch_id)
        if f is None:
            return
        undone = self.undone
        for e in f.batch.entries:
            undone[e.key] = (undone.get(e.key, (0, ""))[0] + 1, why)

    def fail(self, batch_id: int, now: float, reason: str = "") -> None:
        if batch_id in self.core.inflight:
            self._undone(batch_id, reason or "failed back")
            self.core.fail(batch_id, now)
        self.work.pop(batch_id, None)

    def disconnect(self, consumer: str, now: float, why: str) -> int:
        """A consumer is gone: every batch it held goes back (counted as undone)."""
        c = self.core.consumers.get(consumer)
        for batch_id in list(c.batches) if c is not None else []:
            self._undone(batch_id, f"consumer {consumer} lost: {why}")
            self.work.pop(batch_id, None)
        return self.core.disconnect(consumer, now, why)

    def close(self) -> None:
        self.env.close()
