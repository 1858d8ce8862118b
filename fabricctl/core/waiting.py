"""The waiting index: every shape of a model that has queued items and no holder, ordered so
the shape choice reads its candidates in O(log shapes) instead of scanning them all.

Contract: a shape is a candidate while it is staged or active, has queued items and no holder
(`Shape.held == 0`: no consumer slot, nor the model, has it as its current shape). Whoever
changes a candidate's tokens, oldest item, jobs or terms, or makes a shape a candidate (a
holder left it with work), calls `touch(shape, priority, deadline, oldest)`; entries of older
touches and of shapes no longer candidates are dropped lazily when they reach a heap's top.
Candidates are grouped by priority (`levels`, highest first); each level orders them by most
queued tokens, by oldest item, by earliest deadline, and per job by most tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heapify, heappop, heappush

from fabricctl.core.shape import Shape, ShapeState

_CANDIDATE_STATES = (ShapeState.STAGED, ShapeState.ACTIVE)

HeapEntry = tuple[float, int, int, Shape]  # (order key, sequence, version, shape)


def candidate(shape: Shape) -> bool:
    """Queued items, nobody's current shape, and staged or active (a warming shape is
    promised to one consumer; draining and finished shapes take no choice)."""
    return shape.held == 0 and shape.items > 0 and shape.state in _CANDIDATE_STATES


def _valid(entry: HeapEntry) -> bool:
    shape = entry[3]
    return entry[2] == shape.wver and candidate(shape)


class _Heap:
    """Why: a lazily cleaned heap; stale entries leave when they reach the top."""

    __slots__ = ("items", "mark")

    def __init__(self) -> None:
        self.items: list[HeapEntry] = []
        self.mark = 1024  # rebuilt from its valid entries when it grows past this

    def push(self, entry: HeapEntry) -> None:
        items = self.items
        heappush(items, entry)
        if len(items) > self.mark:
            self.items = [e for e in items if _valid(e)]
            heapify(self.items)
            self.mark = max(1024, 2 * len(self.items))

    def top(self) -> Shape | None:
        items = self.items
        while items and not _valid(items[0]):
            heappop(items)
        return items[0][3] if items else None

    def shapes(self) -> Iterator[Shape]:
        """Every valid candidate in it (unordered)."""
        return (e[3] for e in self.items if _valid(e))


class Level:
    """Why: priority is strict, so each priority's candidates are ordered on their own."""

    __slots__ = ("by_age", "by_deadline", "by_job", "by_tokens")

    def __init__(self) -> None:
        self.by_tokens = _Heap()  # most queued tokens first
        self.by_age = _Heap()  # oldest queued item first
        self.by_deadline = _Heap()  # earliest deadline first (shapes with one)
        self.by_job: dict[int, _Heap] = {}  # job -> its shapes here, most tokens first

    def job_tops(self) -> Iterator[tuple[int, Shape]]:
        """Each job's biggest candidate at this level (jobs with none are forgotten)."""
        for job, heap in list(self.by_job.items()):
            top = heap.top()
            if top is None:
                del self.by_job[job]
            else:
                yield job, top


class Waiting:
    """Why: the shape choice runs at every pull; it must not scan 100,000 staged shapes."""

    def __init__(self) -> None:
        self.levels: dict[int, Level] = {}
        self.seq = 0

    def touch(self, shape: Shape, priority: int, deadline: float | None, oldest: float | None
              ) -> None:
        """Index a candidate (again) under its current tokens, oldest item and terms."""
        shape.wver += 1
        if not candidate(shape):
            return
        level = self.levels.get(priority)
        if level is None:
            level = self.levels[priority] = Level()
            self.levels = dict(sorted(self.levels.items(), reverse=True))
        self.seq += 1
        seq, ver = self.seq, shape.wver
        level.by_tokens.push((-shape.tokens, seq, ver, shape))
        level.by_age.push((shape.created if oldest is None else oldest, seq, ver, shape))
        if deadline is not None:
            level.by_deadline.push((deadline, seq, ver, shape))
        for job in shape.jobs:
            heap = level.by_job.get(job)
            if heap is None:
                heap = level.by_job[job] = _Heap()
            heap.push((-shape.tokens, seq, ver, shape))

    def ordered(self) -> Iterator[tuple[int, Level]]:
        """The levels with candidates, highest priority first (empty ones are dropped)."""
        for priority, level in list(self.levels.items()):
            if level.by_tokens.top() is None:
                del self.levels[priority]
            else:
                yield priority, level

    def with_job(self, job: int) -> list[Shape]:
        """Every candidate holding items of `job` (to index again when its terms change)."""
        out: dict[int, Shape] = {}
        for level in self.levels.values():
            heap = level.by_job.get(job)
            if heap is not None:
                for s in heap.shapes():
                    out[id(s)] = s
        return list(out.values())
