"""Placing a screened chunk into segment runs, and encoding the rows of each run.

Contract: an ingest's items, screened (`Good`: index in the chunk, item, id key), are
grouped by (model, shape signature, job) in order of first appearance (`group_items`); the
ingest places each group in its shape's lanes (`Group`); `cut_runs` cuts each group into
runs of at most `segment_entries` (the tail segment first, when it is the group's own and
has room), in order of arrival; `number_runs` gives the new runs their segment numbers in
that order; `encode_runs` encodes each run's data rows, id rows and the entries the core
admits once the commit is durable, into the `IngestPlan` (what passes between the ingest's
prepare, commit and apply; `Refused` is an item it did not take), its rows in key order.
`resume_skip` is the resume rule (a resumed submit counts a reject already stored as skipped).
Pure placement and encoding: nothing here reads or writes LMDB.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from typing import TypeVar

import msgspec

from fabricctl.core.jobs import JobShape
from fabricctl.core.lanes import Lane
from fabricctl.core.shape import Shape
from fabricctl.core.types import Entry, Item
from fabricctl.store.keys import _ENTRY, SegHeader, entry_encoder, header_encoder, seg_base, seg_key
from fabricctl.store.steps import STEP_ITEMS, Steps

R = TypeVar("R")

class Run:
    """Why: an ingest appends to a few segments; this is what it adds to one (one shape's
    entries of this commit)."""

    __slots__ = ("base", "end", "hdr", "new", "rows", "seg_id")

    def __init__(self, seg_id: int, hdr: SegHeader, new: bool) -> None:
        self.seg_id = seg_id
        self.base = seg_base(seg_id)  # an entry's key is base | offset
        self.hdr = hdr
        self.new = new
        self.end = hdr.count  # the next offset
        self.rows: list[tuple[bytes, bytes]] = []


class Refused(msgspec.Struct, array_like=True):
    """Why: a submit is answered per item; this is one item it did not take, by its index."""

    index: int
    reason: str


def resume_skip(rejects: list[R], stored: Callable[[R], bool]) -> tuple[list[R], int]:
    """The resume rule, written once: a resumed submit skips (counts) each reject whose
    item is already `stored` in its job instead of refusing it; (rejects kept, skipped)."""
    keep = [r for r in rejects if not stored(r)]
    return keep, len(rejects) - len(keep)


class IngestPlan:
    """Why: ingest is prepared, committed and applied in three steps, so the commit can run
    off the event loop; this is what passes between them."""

    __slots__ = ("admits", "data_rows", "id_rows", "job_endpoints", "job_models", "job_shapes",
                 "jobs", "next_seg", "now", "received", "rejects", "releases", "runs",
                 "seg_rows", "stored")

    def __init__(self, rejects: list[Refused], now: float = 0.0) -> None:
        self.rejects = rejects
        self.now = now
        self.stored: set[int] = set()  # indexes of rejects already stored in their job
        self.jobs: dict[int, int] = {}  # job -> items of it this ingest adds
        self.job_shapes: dict[int, set[JobShape]] = {}  # job -> the shapes they join
        self.job_models: dict[int, tuple[int, str]] = {}  # job -> (line, model): its first
        self.job_endpoints: dict[int, Counter[int]] = {}  # job -> items per endpoint (core.mix)
        # per run, in arrival order: its shape, each entry's lane, the entries
        self.admits: list[tuple[Shape, list[Lane], list[Entry]]] = []
        self.releases = 0  # the core's lane releases when placing began (`Broker.admit_shape`)
        self.id_rows: list[tuple[bytes, bytes]] = []
        self.data_rows: list[tuple[bytes, bytes]] = []
        self.seg_rows: list[tuple[bytes, bytes]] = []
        self.runs: list[Run] = []
        self.next_seg = 0
        self.received = (0, 0)  # items, tokens

    def grown(self) -> dict[int, int]:
        """Existing segments this ingest appends to -> their new entry count."""
        return {r.seg_id: r.end for r in self.runs if not r.new}


Good = tuple[int, Item, bytes]  # a screened item: (its index in the chunk, it, its id key)


class Group:
    """Why: one (model, shape, job) group of a chunk, placed: its items with their id keys,
    token counts, lanes and target lengths, in arrival order."""

    __slots__ = ("first", "idbs", "items", "lanes", "shape", "targets", "tokens")

    def __init__(self, gs: list[Good], shape: Shape, items: list[Item],
                 tokens: list[int]) -> None:
        self.first = [g[0] for g in gs]  # each item's index in the chunk
        self.idbs = [g[2] for g in gs]
        self.shape, self.items, self.tokens = shape, items, tokens
        self.lanes: list[Lane] = []
        self.targets: list[int] = []


class Cut:
    """Why: a group's items [start, stop) go into one segment run (the tail segment grows
    for its own group; a run holds at most `segment_entries`)."""

    __slots__ = ("group", "run", "start", "stop")

    def __init__(self, run: Run, group: Group, start: int, stop: int) -> None:
        self.run, self.group, self.start, self.stop = run, group, start, stop


def group_items(good: list[Good]) -> dict[tuple[str, int, int], list[Good]]:
    """(model, signature, job) -> its items, keys in order of first appearance."""
    keyed: dict[tuple[str, int, int], list[Good]] = {}
    for g in good:
        item = g[1]
        key = (item.model, item.signature, item.job)
        same = keyed.get(key)
        if same is None:
            keyed[key] = [g]
        else:
            same.append(g)
    return keyed


def cut_runs(groups: list[Group], tail: SegHeader | None, tail_seg: int, limit: int,
         now: float) -> list[Cut]:
    """Each group's items cut into runs, the tail segment first when it is the group's own
    and has room; new runs are numbered by `_number`. In order of arrival."""
    cuts: list[Cut] = []
    for group in groups:
        its, shape = group.items, group.shape
        model, sig, job = its[0].model, its[0].signature, its[0].job
        at = 0
        if (tail is not None and tail.count < limit and tail.signature == sig
                and tail.model == model and tail.job == job):
            to = min(len(its), limit - tail.count)
            cuts.append(Cut(Run(tail_seg, tail, False), group, 0, to))
            tail = None
            at = to
        while at < len(its):
            to = min(len(its), at + max(limit, 1))
            hdr = SegHeader(model, sig, shape.label, 0, 0, now, job)
            cuts.append(Cut(Run(0, hdr, True), group, at, to))
            at = to
    cuts.sort(key=lambda c: c.group.first[c.start])  # new segments in order of arrival
    return cuts


def number_runs(cuts: list[Cut], next_seg: int) -> int:
    """Number the new runs' segments from `next_seg`, in order; the next free number."""
    for c in cuts:
        if c.run.new:
            c.run.seg_id, c.run.base = next_seg, seg_base(next_seg)
            next_seg += 1
    return next_seg


def encode_runs(plan: IngestPlan, cuts: list[Cut], now: float) -> Steps[None]:
    """Each run's rows, id rows and admits, encoded in bulk; the plan's rows in key order.
    Pauses every `STEP_ITEMS` items."""
    id_rows, admits = plan.id_rows, plan.admits
    encode, pack = entry_encoder.encode, _ENTRY.pack
    every: list[Run] = []
    tokens = since = 0
    for c in cuts:
        if since >= STEP_ITEMS:
            since = 0
            yield
        run, g, at, to = c.run, c.group, c.start, c.stop
        since += to - at
        part = g.items[at:to]
        cnt = to - at
        off = run.end
        run.end = off + cnt
        keys = list(map(pack, repeat(run.seg_id, cnt), range(off, off + cnt)))
        part_ns = g.tokens[at:to]
        lanes = g.lanes[at:to]
        # each row a `StoredEntry`, encoded from the tuple of its fields (array_like, no
        # omitted defaults: the same bytes, without building the Struct)
        stored = [(n, it.max_tokens, now, la.id, t, it.id, it.payload, it.source, it.line)
                  for it, n, la, t in zip(part, part_ns, lanes, g.targets[at:to], strict=True)]
        maxes = [f[1] for f in stored]
        run.rows = list(zip(keys, map(encode, stored), strict=True))
        id_rows.extend(zip(g.idbs[at:to], keys, strict=True))
        first = run.base | off
        admits.append((g.shape, lanes, list(map(
            Entry, range(first, first + cnt), part_ns, maxes, repeat(now, cnt),
            repeat(None, cnt), repeat(run.hdr.job, cnt)))))
        tokens += sum(part_ns)
        every.append(run)
    every.sort(key=lambda r: r.seg_id)  # then their rows are in key order
    plan.runs = every
    plan.data_rows = [row for r in every for row in r.rows]
    plan.seg_rows = [(seg_key(r.seg_id), header_encoder.encode(
        msgspec.structs.replace(r.hdr, count=r.end))) for r in every if r.new]
    plan.received = (len(id_rows), tokens)
    id_rows.sort(key=itemgetter(0))  # the ids are unique: the order of the rows
