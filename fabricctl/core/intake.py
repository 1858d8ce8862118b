"""Intake: how items come into the broker's shapes and lanes — new, or restored from a store.

Contract: `open_shape(model, signature, label, now)` is the one rule for the shape an item of
a key joins: the key's open shape, or a new one (staged; active with the lifecycle off) when
there is none, since a draining shape is no longer open; a label fills in a shape that had
none. `place(...)` assigns an item to a lane of that shape (not dispatchable yet) and
`admit(placement, entry)` makes it dispatchable; `admit_all` admits a whole commit, sending a
placement whose shape or lane was retired meanwhile (`placement_live`) to its key's open
shape, and `admit_shape(shape, lanes, entries, now, releases)` does it for one shape's
placements in one pass when no lane was released since they were placed;
`ingest(items, now)` is place + admit of each item, the memory mode's hot path, done a key
at a time (the same shapes, lanes, queues and counts as item by item; items a failing
source yielded before it failed are admitted).
Restoring a store's start: `restore_shape(model, signature, label, lanes, now)` re-queues one
recorded shape — each (lane id, target, entries in arrival order) in a lane reopened with that
id and target, each entry admitted — and returns (items, tokens); `restore_epochs(epochs)`
gives each model its recorded epoch; `restore_ledger(...)` puts the persisted received and
completed counts over what was re-admitted (`Ledger.restore`) and returns the ledger's
difference. Every admission is received by the ledger. `Intake` owns the memory mode's
entry keys; the broker hands it its config, models (and its rule for a new model), lane
counters and ledger.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat

from fabricctl.core.config import CoreConfig
from fabricctl.core.entry_queue import EntryQueue
from fabricctl.core.lanes import Lane, LaneCounters, enqueue
from fabricctl.core.ledger import Ledger
from fabricctl.core.model_state import ModelState
from fabricctl.core.shape import JobTally, Shape, ShapeState
from fabricctl.core.sweep import SWEPT_LABEL, swept_signature
from fabricctl.core.tracking import Placement
from fabricctl.core.types import Entry, Item


def _by_key(chunk: list[Item]) -> list[tuple[str, int, list[int]]]:
    """Each (model, signature) of a chunk with the indexes of its items, in order of first
    appearance."""
    models = {it.model for it in chunk}
    if len(models) == 1:  # the common chunk: one model, keyed by signature alone
        (model,) = models
        by_sig: defaultdict[int, list[int]] = defaultdict(list)
        for i, sig in enumerate([it.signature for it in chunk]):
            by_sig[sig].append(i)
        return [(model, sig, idx) for sig, idx in by_sig.items()]
    groups: dict[tuple[str, int], list[int]] = {}
    for i, item in enumerate(chunk):
        k = (item.model, item.signature)
        g = groups.get(k)
        if g is None:
            groups[k] = [i]
        else:
            g.append(i)
    return [(model, sig, idx) for (model, sig), idx in groups.items()]


def _count_jobs(shape: Shape, entries: list[Entry]) -> None:
    """Count a group of entries into their shape's jobs (one job: one update)."""
    if entries:
        shape.count_jobs(entries, 1)


class Intake:
    """Why: a memory ingest, a durable commit and a restart must put items in the same way."""

    def __init__(self, cfg: CoreConfig, models: dict[str, ModelState],
                 model: Callable[[str], ModelState], lane_counters: LaneCounters,
                 ledger: Ledger, queued: Callable[[Shape], None] = lambda shape: None) -> None:
        self.cfg = cfg
        self.models = models  # the broker's, read and added to, never rebound
        self.model = model  # the broker's rule for a model seen first (its batch budget)
        self.lane_counters = lane_counters
        self.ledger = ledger
        self.next_key = 1  # memory mode: the key of the next item ingested
        self.queued = queued  # told of each shape that gained queued items (the choice's index)
        self.tally = JobTally()  # each job's queued items and tokens, over every shape
        self.swept: set[tuple[str, int]] = set()  # keys of the swept shapes (`core.sweep`)

    def open_shape(self, model: str, signature: int, label: str, now: float) -> Shape:
        """The key's open shape, made when there is none (a draining shape is no longer open)."""
        ms = self.models.get(model) or self.model(model)
        shape = ms.open.get(signature)
        if shape is None:
            state = ShapeState.STAGED if self.cfg.lifecycle else ShapeState.ACTIVE
            shape = Shape(model, signature, label, self.cfg, self.lane_counters, now, state,
                          self.tally)
            shape.swept = (model, signature) in self.swept
            ms.open[signature] = shape
        elif label and not shape.label:
            shape.label = label
        return shape

    def open_swept(self, model: str, job: int, now: float) -> Shape:
        """The job's open swept shape (`core.sweep`), made when there is none."""
        sig = swept_signature(job)
        self.swept.add((model, sig))
        return self.open_shape(model, sig, SWEPT_LABEL, now)

    def place(self, model: str, signature: int, label: str, tokens: int, now: float) -> Placement:
        """Assign an item to a lane (first step of ingest); it is not dispatchable yet."""
        shape = self.open_shape(model, signature, label, now)
        return Placement(shape, shape.lanes.assign(tokens, now))

    def placement_live(self, shape: Shape, lane: Lane) -> bool:
        """Whether a placement still names its key's open shape and a lane of it (the tick
        or a shape switch may have retired either while the placement was being written)."""
        ms = self.models.get(shape.model)
        return (ms is not None and ms.open.get(shape.signature) is shape
                and shape.lanes.lanes.get(lane.id) is lane)

    def admit(self, placement: Placement, entry: Entry) -> None:
        """Make a placed item dispatchable (second step, after its durable commit)."""
        self._admit(placement, entry)
        self.queued(placement.shape)

    def _admit(self, placement: Placement, entry: Entry) -> None:
        """`admit` without telling the choice's index (a restore tells it once a shape)."""
        shape = placement.shape
        placement.lane.push(entry)
        shape.tokens += entry.tokens
        shape.items += 1
        shape.lengths.add(entry.tokens)
        shape.count_job(entry.job, 1, entry.tokens)
        if shape.staged_since is None:
            shape.staged_since = entry.t
        self.ledger.receive(1, entry.tokens)

    def admit_all(self, admits: list[tuple[Shape, Lane, Entry]], now: float) -> None:
        """`admit` for a whole commit's placements (shape, lane, entry: the hot path of
        durable ingest); one whose shape or lane was retired while its commit ran joins its
        key's open shape."""
        live: dict[int, bool] = {}  # id(lane) -> its placements are still live
        touched: dict[int, Shape] = {}
        n = tokens = 0
        for shape, lane, e in admits:
            ok = live.get(id(lane))
            if ok is None:
                ok = live[id(lane)] = self.placement_live(shape, lane)
            if not ok:
                p = self.place(shape.model, shape.signature, shape.label, e.tokens, now)
                shape, lane = p.shape, p.lane
            t = e.tokens
            lane.queue.append(e)
            lane.tokens += t
            shape.tokens += t
            shape.items += 1
            shape.lengths.add(t)
            shape.count_job(e.job, 1, t)
            if shape.staged_since is None:
                shape.staged_since = e.t
            touched[id(shape)] = shape
            n += 1
            tokens += t
        self.ledger.receive(n, tokens)
        for shape in touched.values():
            self.queued(shape)

    def admit_shape(self, shape: Shape, lanes: list[Lane], entries: list[Entry], now: float,
                    releases: int) -> None:
        """`admit_all` for a commit's placements of one shape (`lanes[k]` is `entries[k]`'s
        lane, each lane's entries in arrival order). `releases` is the lane counters'
        `releases` when they were placed: when no lane was released since and the shape is
        still its key's open shape, every lane is still live (a lane leaves its shape only
        by release) and the entries are admitted in one pass; otherwise each placement is
        checked as `admit_all` does."""
        ms = self.models.get(shape.model)
        if (releases != self.lane_counters.releases or ms is None
                or ms.open.get(shape.signature) is not shape):
            self.admit_all([(shape, la, e) for la, e in zip(lanes, entries, strict=True)], now)
            return
        ns = [e.tokens for e in entries]
        enqueue(lanes, entries, ns)
        tokens = sum(ns)
        shape.tokens += tokens
        shape.items += len(ns)
        shape.lengths.add_many(ns)
        _count_jobs(shape, entries)
        if shape.staged_since is None and entries:
            shape.staged_since = entries[0].t
        self.ledger.receive(len(ns), tokens)
        self.queued(shape)

    def ingest(self, items: Iterable[Item], now: float) -> int:
        """Memory mode: place and admit each item at once; returns how many went in.

        The steps of `place` then `admit`, a key at a time: the chunk's items are grouped by
        (model, signature) in order of first appearance (the order `place` would meet the
        keys, so shapes are made in the same order), and each group is placed in one
        `LaneSet.assign_many` call and admitted with its counts summed once. Each lane
        still receives its items in arrival order, and each item's key is its place in
        the chunk. This is the broker's hottest loop.
        """
        if isinstance(items, list):
            return self._ingest_chunk(items, now)
        chunk: list[Item] = []
        try:
            chunk.extend(items)  # keeps what came before a source that fails
        except BaseException:
            self._ingest_chunk(chunk, now)
            raise
        return self._ingest_chunk(chunk, now)

    def _ingest_chunk(self, chunk: list[Item], now: float) -> int:
        key = self.next_key
        n = tokens = 0
        take = chunk.__getitem__
        try:
            for model, sig, idx in _by_key(chunk):
                its = list(map(take, idx))
                label = next((it.label for it in its if it.label), "")
                shape = self.open_shape(model, sig, label, now)
                ns = [it.input_tokens for it in its]
                lanes = shape.lanes.assign_many(ns, now)
                entries = list(map(Entry, [key + i for i in idx], ns,
                                   [it.max_tokens for it in its], repeat(now), its,
                                   [it.job for it in its]))
                enqueue(lanes, entries, ns)
                t = sum(ns)
                n += len(ns)
                tokens += t
                shape.tokens += t
                shape.items += len(ns)
                shape.lengths.add_many(ns)
                _count_jobs(shape, entries)
                if shape.staged_since is None:
                    shape.staged_since = now
                self.queued(shape)
        finally:  # one ledger entry for the call, even if an item fails halfway
            self.next_key = key + len(chunk)
            self.ledger.receive(n, tokens)
        return n

    # -- a store's start ----------

    def restore_shape(self, model: str, signature: int, label: str,
                      lanes: Iterable[tuple[int, int, Sequence[Entry] | EntryQueue]], now: float
                      ) -> tuple[int, int]:
        """Re-queue a shape a store recorded: each (lane id, target, entries in arrival
        order) in a lane of that id and target, admitted; returns (items, tokens). A lane
        given as an `EntryQueue` (the recovery's scan builds them) becomes the lane's queue."""
        shape = self.open_shape(model, signature, label, now)
        items = tokens = 0
        for lane_id, target, entries in lanes:  # `_admit` of each entry, a lane at a time
            lane = shape.lanes.open_lane(lane_id, target, now)
            q = entries if isinstance(entries, EntryQueue) else EntryQueue(entries)
            if not q:
                continue
            n, ns = len(q), q.head_tokens(len(q))
            t = sum(ns)
            if lane.queue:
                lane.queue.extend(q)
            else:
                lane.queue = q
            lane.tokens += t
            shape.tokens += t
            shape.items += n
            shape.lengths.add_many(ns)
            shape.count_jobs(q, 1)
            if shape.staged_since is None:
                shape.staged_since = q.head
            self.ledger.receive(n, t)
            tokens += t
            items += n
        self.queued(shape)
        return items, tokens

    def restore_epochs(self, epochs: Mapping[str, int]) -> None:
        """Each model's epoch as a store recorded it (a model keeps its epoch across starts)."""
        for model, epoch in epochs.items():
            self.model(model).epoch = epoch

    def restore_ledger(self, items_received: int, tokens_received: int, items_completed: int,
                       tokens_completed: int) -> tuple[int, int]:
        """The persisted counts over what `restore_shape` re-admitted (`Ledger.restore`);
        returns the ledger's difference, (0, 0) when the store and the queues agree."""
        self.ledger.restore(items_received, tokens_received, items_completed, tokens_completed)
        return self.ledger.difference()
