"""Rolling lanes: the length buckets inside one shape.

Contract: a shape holds at most `lanes_max` lanes, kept sorted by target length, with a free
list of released ids that is used before any new id. `assign(n)` finds the first lane whose
target is >= n (bisect), compares it with its lower neighbour on waste fraction, and opens a
new lane when (waste fraction > threshold and waste >= waste_floor) or waste > waste_cap,
where threshold = threshold_min + threshold_span * lanes_in_use / lanes_max. At the cap it
force-fits to the best lane. Accepting an item can only raise a target; lanes never merge.
`assign_many(ns)` is `assign` of each length in order (one call for a chunk's items of a
shape: the same lanes, targets and counters).
The maintenance tick marks a lane quiescing (< quiesce_items items and no assignment for
quiesce_s seconds): it takes no more items, drains, and returns its id once empty.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from fabricctl.core.config import CoreConfig
from fabricctl.core.entry_queue import EntryQueue
from fabricctl.core.types import Entry


@dataclass(slots=True)
class LaneCounters:
    """Why: lane churn is shared by every shape and must survive a shape finishing."""

    reuses: int = 0  # items assigned to a lane that already existed
    new_lanes: int = 0  # lanes opened
    releases: int = 0  # lane ids returned to a free list
    recycled_ids: int = 0  # new lanes that took a released id
    force_fits: int = 0  # items placed at the lane cap despite the waste rule


class Lane:
    """Why: items of like length batch with little padding; a lane is one rolling bucket.

    A target length and a FIFO of queued entries.
    """

    __slots__ = ("id", "inflight", "last_assign", "queue", "quiescing", "target", "tokens")

    def __init__(self, lane_id: int, target: int, now: float) -> None:
        self.id = lane_id
        self.target = target
        self.queue = EntryQueue()
        self.tokens = 0  # input tokens queued (not in flight)
        self.inflight = 0  # batches of this lane out with consumers
        self.last_assign = now
        self.quiescing = False

    def push(self, entry: Entry) -> None:
        self.queue.append(entry)
        self.tokens += entry.tokens

    def push_front(self, entries: list[Entry]) -> None:
        """Put entries back ahead of everything queued, in their original order."""
        self.queue.push_front(entries)
        self.tokens += sum(e.tokens for e in entries)

    def idle(self) -> bool:
        """Nothing queued and nothing in flight: the lane may return its id."""
        return not self.queue and self.inflight == 0

    def oldest_age(self, now: float) -> float:
        return now - self.queue.head if self.queue else 0.0

    def waste_fraction(self) -> float:
        """Padding of the queued items against the target, as a fraction of padded tokens."""
        n = len(self.queue)
        if n == 0 or self.target == 0:
            return 0.0
        return 1.0 - self.tokens / (n * self.target)


def enqueue(lanes: list[Lane], entries: list[Entry], ns: list[int]) -> None:
    """Each entry onto its lane's queue (`lanes[k]` takes `entries[k]`, `ns[k]` its tokens)."""
    for lane, e, t in zip(lanes, entries, ns, strict=True):
        lane.queue.append(e)
        lane.tokens += t


class LaneSet:
    """Why: each shape buckets its own lengths, in a bounded number of lanes that reuse ids.

    The lanes of one shape: sorted by target, a free list of ids, waste-driven opening.
    """

    __slots__ = ("_free", "_lanes_sorted", "_next_id", "_targets", "cfg", "counters", "lanes")

    def __init__(self, cfg: CoreConfig, counters: LaneCounters | None = None) -> None:
        self.cfg = cfg
        self.counters = counters if counters is not None else LaneCounters()
        self.lanes: dict[int, Lane] = {}  # every live lane by id, quiescing ones included
        self._targets: list[int] = []  # sorted targets of the lanes that take items
        self._lanes_sorted: list[Lane] = []  # parallel to _targets
        self._free: list[int] = []  # released ids, reused before any new id
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.lanes)

    def threshold(self) -> float:
        """The waste fraction above which a new lane opens (with the 16-token floor)."""
        c = self.cfg
        return c.threshold_min + c.threshold_span * (len(self.lanes) / c.lanes_max)

    def targets(self) -> list[int]:
        """Sorted targets of the lanes that take items (a copy)."""
        return list(self._targets)

    def assign(self, n: int, now: float) -> Lane:
        """Choose (or open) the lane for an item of n tokens; may raise that lane's target."""
        targets = self._targets
        i = bisect_left(targets, n)
        best: Lane | None = None
        waste = 0
        frac = 0.0
        if i < len(targets):
            best = self._lanes_sorted[i]
            waste = targets[i] - n
            frac = waste / targets[i] if targets[i] else 0.0
        if i > 0:
            lower = self._lanes_sorted[i - 1]
            lw = n - lower.target
            lfrac = lw / n if n else 0.0
            if best is None or lfrac < frac:
                best, waste, frac = lower, lw, lfrac
        c = self.cfg
        open_new = best is None or waste > c.waste_cap or (
            waste >= c.waste_floor and frac > self.threshold()
        )
        if open_new:
            if len(self.lanes) < c.lanes_max:
                return self._open(n, now)
            if best is None:  # at the cap and every lane quiescing: take the nearest one back
                lane = min(self.lanes.values(), key=lambda la: abs(la.target - n))
                lane.quiescing = False
                self._insert_sorted(lane)
                return self.assign(n, now)
            self.counters.force_fits += 1
            assert best is not None  # the cap is > 0, so a full set has a best lane
        assert best is not None
        if best.target < n:
            best.target = n  # the lower neighbour: stays sorted since the next target >= n
            targets[i - 1] = n
        best.last_assign = now
        self.counters.reuses += 1
        return best

    def assign_many(self, ns: list[int], now: float, accepted: list[int] | None = None
                    ) -> list[Lane]:
        """`assign` for each of `ns` in order (the lanes, in the same order): the same rule,
        one call for a chunk's items of this shape. With `accepted`, each item's lane
        target once it was accepted is appended to it (a later item may raise it again).
        The reuse of a lane is decided here, on the sorted targets (a lane object is
        touched only once chosen); opening one (and the rarer cases at the cap) goes
        through `assign`."""
        out: list[Lane] = []
        append = out.append
        targets = self._targets
        ordered = self._lanes_sorted
        c = self.cfg
        cap, floor = c.waste_cap, c.waste_floor
        threshold = self.threshold()
        size = len(self.lanes)
        count = len(targets)
        reused = 0
        keep = accepted.append if accepted is not None else None
        try:
            for n in ns:
                i = bisect_left(targets, n)
                if i < count:  # the first lane at least n long, against its lower neighbour
                    t = targets[i]
                    waste = t - n
                    frac = waste / t if t else 0.0
                    if i:
                        lw = n - targets[i - 1]
                        lfrac = lw / n if n else 0.0
                        if lfrac < frac:
                            waste, frac = lw, lfrac
                            i -= 1
                elif i:  # longer than every lane: only the lower neighbour
                    waste = n - targets[i - 1]
                    frac = waste / n if n else 0.0
                    i -= 1
                else:  # no lane takes items
                    waste = cap + 1
                    frac = 0.0
                if waste > cap or (waste >= floor and frac > threshold):
                    lane = self.assign(n, now)  # opens a lane, or the cap's rules
                    append(lane)
                    if keep is not None:
                        keep(lane.target)
                    count = len(targets)
                    if len(self.lanes) != size:
                        size = len(self.lanes)
                        threshold = self.threshold()
                    continue
                lane = ordered[i]
                if targets[i] < n:  # the lower neighbour: stays sorted (the next is >= n)
                    lane.target = n
                    targets[i] = n
                lane.last_assign = now
                reused += 1
                append(lane)
                if keep is not None:
                    keep(targets[i])
        finally:  # counted as `assign` counts, even if an item fails halfway
            self.counters.reuses += reused
        return out

    def open_lane(self, lane_id: int, target: int, now: float) -> Lane:
        """Recreate a lane with a known id and target (recovery); keeps ids and order."""
        lane = Lane(lane_id, target, now)
        self.lanes[lane_id] = lane
        self._insert_sorted(lane)
        self._next_id = max(self._next_id, lane_id + 1)
        self._free = [f for f in self._free if f != lane_id]
        return lane

    def _open(self, target: int, now: float) -> Lane:
        if self._free:
            lane_id = self._free.pop()
            self.counters.recycled_ids += 1
        else:
            lane_id = self._next_id
            self._next_id += 1
        lane = Lane(lane_id, target, now)
        self.lanes[lane_id] = lane
        self._insert_sorted(lane)
        self.counters.new_lanes += 1
        return lane

    def _insert_sorted(self, lane: Lane) -> None:
        j = bisect_left(self._targets, lane.target)
        self._targets.insert(j, lane.target)
        self._lanes_sorted.insert(j, lane)

    def _unlist(self, lane: Lane) -> None:
        """Stop offering a lane to new items (it is quiescing or being released)."""
        j = bisect_left(self._targets, lane.target)
        while j < len(self._lanes_sorted) and self._lanes_sorted[j] is not lane:
            j += 1
        if j < len(self._lanes_sorted):
            del self._targets[j]
            del self._lanes_sorted[j]

    def quiesce(self, lane: Lane) -> None:
        if not lane.quiescing:
            lane.quiescing = True
            self._unlist(lane)

    def release(self, lane: Lane) -> None:
        """Return an idle lane's id to the free list."""
        assert lane.idle(), "only an idle lane may return its slot"
        if not lane.quiescing:
            self._unlist(lane)
        del self.lanes[lane.id]
        self._free.append(lane.id)
        self.counters.releases += 1

    def tick(self, now: float) -> list[Lane]:
        """Mark quiescing lanes and release the idle ones; returns lanes newly quiescing."""
        c = self.cfg
        newly: list[Lane] = []
        for lane in list(self.lanes.values()):
            if not lane.quiescing and (
                len(lane.queue) < c.quiesce_items and now - lane.last_assign >= c.quiesce_s
            ):
                self.quiesce(lane)
                newly.append(lane)
            if lane.quiescing and lane.idle():
                self.release(lane)
        return newly

    def release_idle(self) -> int:
        """Release every idle lane at once (a draining shape); returns how many."""
        idle = [lane for lane in self.lanes.values() if lane.idle()]
        for lane in idle:
            self.release(lane)
        return len(idle)

    def starving(self, now: float) -> int:
        """Lanes whose oldest item has waited longer than starve_s."""
        limit = self.cfg.starve_s
        return sum(
            1 for lane in self.lanes.values() if now - lane.queue.head > limit
        )
