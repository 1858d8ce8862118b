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
`StoreError` that says so. The jobs come back from their table (`JobTable.load`): every
count as the last commit left it; nothing is in flight after a start, so a job's in-flight
items are queued again with the rest of its segments' entries (a cancelled job's are
withdrawn again by the next tick).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.types import Entry
from fabricctl.errors import StoreError
from fabricctl.store.keys import (
    FORMAT,
    TOMB_FORMAT,
    entry_key,
    head_decoder,
    header_decoder,
    seg_base,
    seg_id_of,
    split_entry_key,
)
from fabricctl.store.meta import Meta
from fabricctl.store.rows import delete_segment

if TYPE_CHECKING:
    from fabricctl.store.state import StoreState

log = logging.getLogger("fabricctl.store")


class RecoveryReport(msgspec.Struct):
    """Why: what a start found on disk, for the log and for `fabricctl status`."""

    boot: int
    items: int
    tokens: int
    segments: int
    segments_deleted: int
    seconds: float
    ledger_ok: bool
    ledger_difference: tuple[int, int]


def recover(state: StoreState, now: float) -> RecoveryReport:
    """Rebuild `state` (its core's shapes, its segments and meta) from the env on disk."""
    t0 = time.perf_counter()
    env, dbs, core = state.env, state.env.dbs, state.core
    with env.read() as txn:
        meta = Meta.load(txn, dbs["meta"])
        used = meta.next_seg > 1 or txn.stat(dbs["ids"])["entries"] > 0
        if meta.fmt not in (FORMAT, TOMB_FORMAT) and (meta.fmt or used):
            raise StoreError(
                f"{env.data_dir} holds a store in layout version {meta.fmt or 1}, and this "
                f"fabricctl reads version {FORMAT}: drain it with the fabricctl that wrote it, "
                "or move it aside and start with an empty data dir")
        headers = {seg_id_of(k): header_decoder.decode(v)
                   for k, v in txn.cursor(db=dbs["seg"])}
        state.jobs.load(txn)
        answered: dict[int, set[int]] = {}  # live segment -> offsets that have a result
        results = txn.cursor(db=dbs["results"])
        for sid in headers:
            hi = entry_key(sid + 1, 0)
            if results.set_range(entry_key(sid, 0)):
                for k in results.iternext(keys=True, values=False):
                    if k >= hi:  # type: ignore[operator]
                        break
                    answered.setdefault(sid, set()).add(split_entry_key(k)[1])
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
        split = split_entry_key
        with env.read(buffers=True) as btxn:
            for k, v in btxn.cursor(db=dbs["data"]):
                sid, off = split(k)
                if sid != seg_id:
                    seg_id = sid
                    hdr = headers.get(sid)
                    if hdr is None:  # cannot happen (a header is written with its first entry)
                        raise StoreError(f"{env.data_dir}: entries of segment {sid} have no header")
                    hdr.count = 0
                    dead = answered.get(sid, set())
                    lanes = shapes.setdefault((hdr.model, hdr.signature), (hdr.label, {}))[1]
                    base = seg_base(sid)  # an entry's key is base | offset
                assert hdr is not None  # set when its segment's first entry was read
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
                                     intern(h.max_tokens, h.max_tokens), t_last, None, hdr.job))
        done: set[int] = set()
        for sid, hdr in headers.items():
            hdr.deleted = len(answered.get(sid, ()))
            if sid not in live:
                done.add(sid)
    meta.boot += 1

    def write(txn: lmdb.Transaction) -> None:
        if meta.fmt == TOMB_FORMAT:
            txn.drop(env.env.open_db(b"tomb", txn=txn), delete=True)
        for seg_id in done:
            delete_segment(txn, dbs, seg_id)
        meta.write(txn, dbs["meta"], boot=meta.boot, fmt=FORMAT)

    env.write(write, drain=True)
    env.drop_mapped_pages()  # the scan's page mappings: clean page cache, not queue memory
    meta.fmt = FORMAT
    state.meta = meta
    items = tokens = 0
    for (model, sig), (label, lanes) in shapes.items():
        n, t = core.restore_shape(model, sig, label, (
            (lane_id, target, entries) for lane_id, (target, entries) in lanes.items()), now)
        items += n
        tokens += t
    for sid in live:
        state.segs[sid] = headers[sid]
    core.restore_epochs(meta.epochs)
    pl = meta.ledger
    diff = core.restore_ledger(pl.items_received, pl.tokens_received, pl.items_completed,
                               pl.tokens_completed)
    report = RecoveryReport(meta.boot, items, tokens, len(live), len(done),
                            round(time.perf_counter() - t0, 4), diff == (0, 0), diff)
    log.info("recovered %d items (%d tokens) in %d segments in %.3f s (boot %d)%s",
             items, tokens, len(live), report.seconds, meta.boot,
             "" if report.ledger_ok else f"; LEDGER DIFFERENCE {diff}")
    return report
