"""Recovery at start: rebuild shapes, lanes and cursors from segments and results.

Contract: every entry of a segment (all of them are below its boundary: LMDB commits are
atomic) that has no result is queued again, in the lane it records, in arrival order
(segments by id, entries by offset); entries that were pending at the crash are simply
available again (at-least-once; an entry has one result at most, so results stay one per
item). Recovery decodes only each entry's scheduling head (counts, arrival, lane), never its
payload, in one pass over the entries and one over the result keys of the live segments
(the results of deleted segments are not read). Every shape comes back staged, with its
lanes' ids and targets (the largest target its live entries recorded); each model keeps its
epoch. Segments found fully completed (none should be: completion deletes them in its own
commit) are deleted; the persisted ledger must then equal completed + queued, and the report
says whether it does. Afterwards the process lets go of the map pages the scan touched. A
data dir of layout 3 (whose tombstones duplicate its results) is taken over: its tombstone
table is dropped. A data dir written in another layout version is refused with a
`StoreError` that says so.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.broker import Placement
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.types import Entry
from fabricctl.store.errors import StoreError
from fabricctl.store.keys import FORMAT, TOMB_FORMAT, entry_key, head_decoder, header_decoder
from fabricctl.store.meta import Meta

if TYPE_CHECKING:
    from fabricctl.store.durable import DurableBroker

log = logging.getLogger("fabricctl.store")


class RecoveryReport(msgspec.Struct):
    """What a start found on disk, for the log and for `fabricctl status`."""

    boot: int
    items: int
    tokens: int
    segments: int
    segments_deleted: int
    seconds: float
    ledger_ok: bool
    ledger_difference: tuple[int, int]


def recover(db: DurableBroker, now: float) -> RecoveryReport:
    t0 = time.perf_counter()
    env, dbs, core = db.env, db.env.dbs, db.core
    with env.read() as txn:
        meta = Meta.load(txn, dbs["meta"])
        used = meta.next_seg > 1 or txn.stat(dbs["ids"])["entries"] > 0
        if meta.fmt not in (FORMAT, TOMB_FORMAT) and (meta.fmt or used):
            raise StoreError(
                f"{env.data_dir} holds a store in layout version {meta.fmt or 1}, and this "
                f"fabricctl reads version {FORMAT}: drain it with the fabricctl that wrote it, "
                "or move it aside and start with an empty data dir")
        headers = {int.from_bytes(k, "big"): header_decoder.decode(v)
                   for k, v in txn.cursor(db=dbs["seg"])}
        answered: dict[int, set[int]] = {}  # live segment -> offsets that have a result
        results = txn.cursor(db=dbs["results"])
        for sid in headers:
            hi = entry_key(sid + 1, 0)
            if results.set_range(entry_key(sid, 0)):
                for k in results.iternext(keys=True, values=False):
                    if k >= hi:
                        break
                    answered.setdefault(sid, set()).add(int.from_bytes(k[8:], "big"))
        # (model, signature) -> (label, lane id -> [target, its live entries in arrival order])
        shapes: dict[tuple[str, int], tuple[str, dict[int, list]]] = {}
        live: set[int] = set()
        small: dict[int, int] = {}  # one int object per distinct count: less memory per entry
        intern = small.setdefault
        t_last = -1.0  # entries of one commit share their arrival time: share the float too
        decode = head_decoder.decode
        seg_id = -1
        dead: set[int] = set()
        lanes: dict[int, list] = {}
        with env.read(buffers=True) as btxn:
            for k, v in btxn.cursor(db=dbs["data"]):
                sid = int.from_bytes(k[:8], "big")
                if sid != seg_id:
                    seg_id = sid
                    hdr = headers.get(sid)
                    if hdr is None:  # cannot happen (a header is written with its first entry)
                        raise StoreError(f"{env.data_dir}: entries of segment {sid} have no header")
                    hdr.count = 0
                    dead = answered.get(sid, set())
                    lanes = shapes.setdefault((hdr.model, hdr.signature), (hdr.label, {}))[1]
                    base = sid << 32
                off = int.from_bytes(k[8:], "big")
                hdr.count = off + 1
                if off in dead:
                    continue
                h = decode(v)
                live.add(sid)
                slot = lanes.get(h.lane)
                if slot is None:
                    slot = lanes[h.lane] = [h.target, []]
                elif h.target > slot[0]:
                    slot[0] = h.target
                if h.t != t_last:
                    t_last = h.t
                slot[1].append(Entry(base | off, intern(h.tokens, h.tokens),
                                     intern(h.max_tokens, h.max_tokens), t_last))
        done: set[int] = set()
        for sid, hdr in headers.items():
            hdr.deleted = len(answered.get(sid, ()))
            if sid not in live:
                done.add(sid)
    meta.boot += 1
    from fabricctl.store.completion import delete_segment

    def write(txn: lmdb.Transaction) -> None:
        if meta.fmt == TOMB_FORMAT:
            txn.drop(env.env.open_db(b"tomb", txn=txn), delete=True)
        for seg_id in done:
            delete_segment(txn, dbs, seg_id)  # type: ignore[arg-type]
        meta.write(txn, dbs["meta"], boot=meta.boot, fmt=FORMAT)  # type: ignore[arg-type]

    env.write(write, drain=True)
    env.drop_mapped_pages()  # the scan's page mappings: clean page cache, not queue memory
    meta.fmt = FORMAT
    db.meta = meta
    items = tokens = 0
    admit = core.admit
    for (model, sig), (label, lanes) in shapes.items():
        ms = core.model(model)
        shape = ms.open.get(sig)
        if shape is None:
            shape = Shape(model, sig, label, core.cfg, core.lane_counters, now,
                          ShapeState.STAGED if core.cfg.lifecycle else ShapeState.ACTIVE)
            ms.open[sig] = shape
        for lane_id, (target, entries) in lanes.items():
            p = Placement(shape, shape.lanes.open_lane(lane_id, target, now))
            for e in entries:
                admit(p, e)
                tokens += e.tokens
            items += len(entries)
    for sid in live:
        db.segs[sid] = headers[sid]
    for model, epoch in meta.epochs.items():
        core.model(model).epoch = epoch
    lg, pl = core.ledger, meta.ledger
    lg.items_received, lg.tokens_received = pl.items_received, pl.tokens_received
    lg.items_routed = lg.items_completed = pl.items_completed
    lg.tokens_routed = lg.tokens_completed = pl.tokens_completed
    diff = lg.difference()
    report = RecoveryReport(meta.boot, items, tokens, len(live), len(done),
                            round(time.perf_counter() - t0, 4), diff == (0, 0), diff)
    log.info("recovered %d items (%d tokens) in %d segments in %.3f s (boot %d)%s",
             items, tokens, len(live), report.seconds, meta.boot,
             "" if report.ledger_ok else f"; LEDGER DIFFERENCE {diff}")
    return report
