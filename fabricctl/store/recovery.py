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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.entry_queue import EntryQueue
from fabricctl.core.types import Entry
from fabricctl.errors import StoreError
from fabricctl.store.keys import (
    FORMAT,
    TOMB_FORMAT,
    SegHeader,
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


@dataclass(slots=True)
class _Disk:
    """Why: what the first read found, for the scan, the commit and the restore."""

    meta: Meta
    headers: dict[int, SegHeader]  # every segment's header by id
    answered: dict[int, set[int]]  # segment id -> offsets that have a result


@dataclass(slots=True)
class _LaneFound:
    """Why: one lane a shape recorded: its target and its live entries in arrival order."""

    target: int
    entries: EntryQueue = field(default_factory=EntryQueue)  # columns: no object per entry


@dataclass(slots=True)
class _ShapeFound:
    """Why: one (model, signature) the live entries name: its label and lanes by id."""

    label: str
    lanes: dict[int, _LaneFound] = field(default_factory=dict)


@dataclass(slots=True)
class _Scan:
    """Why: what the pass over the entries found, for the commit and the restore after it."""

    shapes: dict[tuple[str, int], _ShapeFound] = field(default_factory=dict)
    live: set[int] = field(default_factory=set)  # segments with an entry that has no result
    done: set[int] = field(default_factory=set)  # segments whose every entry has a result


@dataclass(slots=True)
class _Restored:
    """Why: what the core took back and how its ledger compares, for the report."""

    items: int = 0
    tokens: int = 0
    ledger_difference: tuple[int, int] = (0, 0)  # (items, tokens), as `restore_ledger` has it


def recover(state: StoreState, now: float) -> RecoveryReport:
    """Rebuild `state` (its core's shapes, its segments and meta) from the env on disk."""
    t0 = time.perf_counter()
    with state.env.read() as txn:
        disk = _read(state, txn)
        scan = _scan_entries(state, disk)
    meta = disk.meta
    meta.boot += 1
    _commit(state, meta, scan.done)
    state.env.drop_mapped_pages()  # the scan's page mappings: clean page cache, not queue memory
    meta.fmt = FORMAT
    state.meta = meta
    restored = _restore(state, disk, scan, now)
    diff = restored.ledger_difference
    report = RecoveryReport(meta.boot, restored.items, restored.tokens, len(scan.live),
                            len(scan.done), round(time.perf_counter() - t0, 4), diff == (0, 0),
                            diff)
    log.info("recovered %d items (%d tokens) in %d segments in %.3f s (boot %d)%s",
             restored.items, restored.tokens, len(scan.live), report.seconds, meta.boot,
             "" if report.ledger_ok else f"; LEDGER DIFFERENCE {diff}")
    return report


def _read(state: StoreState, txn: lmdb.Transaction) -> _Disk:
    """Read the meta row, the segment headers, the job table and the answered offsets."""
    dbs = state.env.dbs
    meta = _load_meta(state, txn)
    names: dict[str, str] = {}  # one object per model or label, not one per segment
    sigs: dict[int, int] = {}  # likewise per signature (an int past 2**30 is an object)
    headers: dict[int, SegHeader] = {}
    for k, v in txn.cursor(db=dbs["seg"]):
        h = headers[seg_id_of(k)] = header_decoder.decode(v)
        h.model = names.setdefault(h.model, h.model)
        h.label = names.setdefault(h.label, h.label)
        h.signature = sigs.setdefault(h.signature, h.signature)
    state.jobs.load(txn)
    return _Disk(meta, headers, _answered(txn, dbs, headers))


def _load_meta(state: StoreState, txn: lmdb.Transaction) -> Meta:
    """Read the meta row, refusing a data dir written in a layout this version cannot read."""
    dbs = state.env.dbs
    meta = Meta.load(txn, dbs["meta"])
    used = meta.next_seg > 1 or txn.stat(dbs["ids"])["entries"] > 0
    if meta.fmt not in (FORMAT, TOMB_FORMAT) and (meta.fmt or used):
        raise StoreError(
            f"{state.env.data_dir} holds a store in layout version {meta.fmt or 1}, and this "
            f"fabricctl reads version {FORMAT}: drain it with the fabricctl that wrote it, "
            "or move it aside and start with an empty data dir")
    return meta


def _answered(txn: lmdb.Transaction, dbs: Mapping[str, lmdb._Database],
              headers: dict[int, SegHeader]) -> dict[int, set[int]]:
    """Each stored segment's offsets that have a result (read from the result keys only)."""
    answered: dict[int, set[int]] = {}
    results = txn.cursor(db=dbs["results"])
    for sid in headers:
        hi = entry_key(sid + 1, 0)
        if results.set_range(entry_key(sid, 0)):
            for k in results.iternext(keys=True, values=False):
                if k >= hi:  # type: ignore[operator]
                    break
                answered.setdefault(sid, set()).add(split_entry_key(k)[1])
    return answered


def _scan_entries(state: StoreState, disk: _Disk) -> _Scan:
    """One pass over the entries: each unanswered one into its shape's lane, heads only."""
    env, headers, answered = state.env, disk.headers, disk.answered
    scan = _Scan()
    shapes, live = scan.shapes, scan.live
    small: dict[int, int] = {}  # one int object per distinct count: less memory per entry
    intern = small.setdefault
    t_last = -1.0  # entries of one commit share their arrival time: share the float too
    decode = head_decoder.decode
    seg_id = -1
    dead: set[int] = set()
    lanes: dict[int, _LaneFound] = {}
    split = split_entry_key
    with env.read(buffers=True) as btxn:
        for k, v in btxn.cursor(db=env.dbs["data"]):
            sid, off = split(k)
            if sid != seg_id:
                seg_id = sid
                hdr = headers.get(sid)
                if hdr is None:  # cannot happen (a header is written with its first entry)
                    raise StoreError(f"{env.data_dir}: entries of segment {sid} have no header")
                hdr.count = 0
                dead = answered.get(sid, set())
                key = (hdr.model, hdr.signature)
                lanes = shapes.setdefault(key, _ShapeFound(hdr.label)).lanes
                base = seg_base(sid)  # an entry's key is base | offset
            assert hdr is not None  # set when its segment's first entry was read
            hdr.count = off + 1
            if off in dead:
                continue
            h = decode(v)
            live.add(sid)
            slot = lanes.get(h.lane)
            if slot is None:
                slot = lanes[h.lane] = _LaneFound(h.target)
            elif h.target > slot.target:
                slot.target = h.target
            if h.t != t_last:
                t_last = h.t
            slot.entries.append(Entry(base | off, intern(h.tokens, h.tokens),
                                      intern(h.max_tokens, h.max_tokens), t_last, None, hdr.job))
    _settle_headers(scan, disk)
    return scan


def _settle_headers(scan: _Scan, disk: _Disk) -> None:
    """Count each segment's results in its header; one with no live entry is done."""
    for sid, hdr in disk.headers.items():
        hdr.deleted = len(disk.answered.get(sid, ()))
        if sid not in scan.live:
            scan.done.add(sid)


def _commit(state: StoreState, meta: Meta, done: set[int]) -> None:
    """Write the new boot and layout, drop a layout-3 tombstone table and the done segments."""
    env = state.env

    def write(txn: lmdb.Transaction) -> None:
        if meta.fmt == TOMB_FORMAT:
            txn.drop(env.env.open_db(b"tomb", txn=txn), delete=True)
        for seg_id in done:
            delete_segment(txn, env.dbs, seg_id)
        meta.write(txn, env.dbs["meta"], boot=meta.boot, fmt=FORMAT)

    env.write(write, drain=True)


def _restore(state: StoreState, disk: _Disk, scan: _Scan, now: float) -> _Restored:
    """Hand the core every shape found, the epochs and the ledger; keep the live headers."""
    core = state.core
    restored = _Restored()
    for (model, sig), found in scan.shapes.items():
        n, t = core.restore_shape(model, sig, found.label, (
            (lane_id, lane.target, lane.entries) for lane_id, lane in found.lanes.items()), now)
        restored.items += n
        restored.tokens += t
    for sid in scan.live:
        state.segs[sid] = disk.headers[sid]
    core.restore_epochs(disk.meta.epochs)
    core.restore_paces(disk.meta.paces)
    pl = disk.meta.ledger
    restored.ledger_difference = core.restore_ledger(
        pl.items_received, pl.tokens_received, pl.items_completed, pl.tokens_completed)
    return restored
