"""Recovery at start: rebuild shapes, lanes and cursors from segments and tombstones.

Contract: every entry below a segment's boundary that has no tombstone is queued again, in
its lane, in arrival order (segments by id, entries by offset); entries that were pending at
the crash are simply available again (at-least-once; results are de-duplicated by id).
Every shape comes back staged, with its lanes' ids and targets; each model keeps its epoch.
Segments found fully tombstoned (a crash between completion and deletion) are deleted; the
persisted ledger must then equal completed + queued, and the report says whether it does.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import msgspec

from fabricctl.core.broker import Placement
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.types import Entry
from fabricctl.store.keys import (
    entry_decoder,
    entry_key,
    header_decoder,
    ref,
    split_entry_key,
)
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
        headers = {int.from_bytes(k, "big"): header_decoder.decode(v)
                   for k, v in txn.cursor(db=dbs["seg"])}
        done: set[int] = set()
        live: dict[int, list[Entry]] = {}
        tomb_cur = txn.cursor(db=dbs["tomb"])
        data_cur = txn.cursor(db=dbs["data"])
        for seg_id, hdr in headers.items():
            lo, hi = entry_key(seg_id, 0), entry_key(seg_id + 1, 0)
            tombs: set[int] = set()
            if tomb_cur.set_range(lo):
                for k in tomb_cur.iternext(keys=True, values=False):
                    if k >= hi:
                        break
                    tombs.add(split_entry_key(k)[1])
            hdr.deleted = len(tombs)
            if hdr.deleted >= hdr.count:
                done.add(seg_id)
                continue
            entries = []
            if data_cur.set_range(lo):
                for k, v in data_cur:
                    if k >= hi:
                        break
                    offset = split_entry_key(k)[1]
                    if offset in tombs or offset >= hdr.count:
                        continue
                    s = entry_decoder.decode(v)
                    entries.append(Entry(ref(seg_id, offset), s.tokens, s.max_tokens, s.t))
            live[seg_id] = entries
    meta.boot += 1
    from fabricctl.store.durable import delete_segment

    def write(txn: object) -> None:
        for seg_id in done:
            delete_segment(txn, dbs, seg_id)  # type: ignore[arg-type]
        meta.write(txn, dbs["meta"], boot=meta.boot)  # type: ignore[arg-type]

    env.write(write)
    db.meta = meta
    items = tokens = 0
    for seg_id in sorted(live):
        hdr = headers[seg_id]
        ms = core.model(hdr.model)
        shape = ms.open.get(hdr.signature)
        if shape is None:
            shape = Shape(hdr.model, hdr.signature, hdr.label, core.cfg, core.lane_counters, now,
                          ShapeState.STAGED if core.cfg.lifecycle else ShapeState.ACTIVE)
            ms.open[hdr.signature] = shape
        lane = shape.lanes.lanes.get(hdr.lane)
        if lane is None:
            lane = shape.lanes.open_lane(hdr.lane, hdr.target, now)
        elif hdr.target > lane.target:
            shape.lanes.quiesce(lane)  # re-sort: take it out and put it back with the new target
            lane.quiescing = False
            lane.target = hdr.target
            shape.lanes._insert_sorted(lane)
        p = Placement(shape, lane)
        for e in live[seg_id]:
            core.admit(p, e)
            items += 1
            tokens += e.tokens
        db.segs[seg_id] = hdr
        db.open_segs[(hdr.model, hdr.signature, hdr.lane)] = seg_id
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
