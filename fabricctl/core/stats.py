"""Per-shape statistics: the 512-bin piecewise length histogram and the batches-per-shape one.

Contract: `LengthHistogram` counts input lengths in 512 piecewise-linear bins (fine for short
prompts, coarse for long ones) and answers percentiles by linear interpolation inside a bin;
`add_many(ns)` adds a list at once (the same counts, min and max as `add` of each); it is
copied onto a shape when it activates. `BatchesHistogram` records how many batches each
finished shape ran and how many of them thrashed (`thrash_reason`'s verdict, handed in).
`thrash_reason(batches, line, waiting)` is the thrash rule: a shape that finished under the
thrash line (`line` batches) while `waiting` items of its own prefix had already been staged
again (they arrived as it drained, so its prefix is prefilled once more in another run)
thrashed; it returns why and what to change (`THRASH_FIX`), "" when it did not. A shape
that left nothing of its prefix waiting ran as long as its work allowed: however few its
batches (the Zipf tail of a file, or a stream slower than the GPUs), it ran every item
there was, so it is short, not thrashing.
"""

from __future__ import annotations

from bisect import bisect_right

# (start, width, bins): [0,1024) by 8, [1024,8192) by 32, [8192,32768) by 256,
# [32768,131072) by 2048, [131072,393216) by 16384 — 512 bins; the last absorbs overflow.
_PIECES = ((0, 8, 128), (1024, 32, 224), (8192, 256, 96), (32768, 2048, 48), (131072, 16384, 16))
BIN_EDGES: list[int] = [start + k * width for start, width, bins in _PIECES for k in range(bins)]
BIN_EDGES.append(_PIECES[-1][0] + _PIECES[-1][1] * _PIECES[-1][2])
NUM_BINS = len(BIN_EDGES) - 1
assert NUM_BINS == 512


# Every bin edge is a multiple of 8, so below the last edge a length's bin is a function of
# n >> 3: `add_many` looks it up in this table.
_TABLE_END = BIN_EDGES[-1]


def bin_of(n: int) -> int:
    """The bin an input length falls in."""
    if n < 1024:  # the first piece, 8 wide from 0: most prompts, so skip the search
        return n >> 3
    return min(bisect_right(BIN_EDGES, n) - 1, NUM_BINS - 1)


_BIN_BY_EIGHTH: list[int] = [bin_of(k << 3) for k in range(_TABLE_END >> 3)]
assert all(e % 8 == 0 for e in BIN_EDGES)


class LengthHistogram:
    """Why: lane boundaries roll, but operators still want a shape's length distribution."""

    __slots__ = ("count", "counts", "max", "min")

    def __init__(self) -> None:
        self.counts = [0] * NUM_BINS
        self.count = 0
        self.min = 0
        self.max = 0

    def add(self, n: int) -> None:
        self.counts[bin_of(n)] += 1
        if self.count == 0 or n < self.min:
            self.min = n
        if n > self.max:
            self.max = n
        self.count += 1

    def add_many(self, ns: list[int]) -> None:
        """`add` for each of `ns` (the same counts, min and max), in one call."""
        if not ns:
            return
        counts = self.counts
        lo, hi = min(ns), max(ns)
        if lo >= 0 and hi < _TABLE_END:
            table = _BIN_BY_EIGHTH
            for n in ns:
                counts[table[n >> 3]] += 1
        else:
            for n in ns:
                counts[bin_of(n)] += 1
        if self.count == 0 or lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi
        self.count += len(ns)

    def copy(self) -> LengthHistogram:
        h = LengthHistogram()
        h.counts = list(self.counts)
        h.count, h.min, h.max = self.count, self.min, self.max
        return h

    def percentile(self, p: float) -> float:
        """The p-th percentile (0..100), interpolated inside its bin and clamped to [min, max]."""
        if self.count == 0:
            return 0.0
        rank = p / 100.0 * self.count
        seen = 0
        for i, c in enumerate(self.counts):
            if c and seen + c >= rank:
                lo, hi = BIN_EDGES[i], BIN_EDGES[i + 1]
                value = lo + (hi - lo) * ((rank - seen) / c)
                return float(min(max(value, self.min), self.max))
            seen += c
        return float(self.max)

    def percentiles(self, ps: tuple[float, ...] = (50, 90, 99)) -> dict[str, float]:
        return {f"p{p:g}": self.percentile(p) for p in ps}


THRASH_FIX = "to gather more per run, raise [broker] activate_multiple or stage_timeout_s"


def thrash_reason(batches: int, line: int, waiting: int) -> str:
    """Why the shape thrashed, with what to change ("" when it did not: see the module)."""
    if batches >= line or waiting <= 0:
        return ""
    return (f"finished after {batches} batches (< {line}) with {waiting} items of its prefix "
            f"staged again; {THRASH_FIX}")


# Buckets for "batches a shape ran before it finished"; 100 is the thrashing line.
BATCH_BUCKETS: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)


class BatchesHistogram:
    """Why: a workload whose shapes are too small to amortise shows up as a pattern here."""

    __slots__ = ("counts", "samples", "thrash_line", "thrashed", "total")

    def __init__(self, thrash_line: int = 100) -> None:
        self.thrash_line = thrash_line
        self.counts = [0] * (len(BATCH_BUCKETS) + 1)  # counts[i]: B[i-1] <= batches < B[i]
        self.total = 0
        self.thrashed = 0  # finished shapes that thrashed (`thrash_reason`)
        self.samples: list[int] = []  # the most recent finished shapes' batch counts

    def add(self, batches: int, thrashed: bool = False) -> None:
        self.counts[bisect_right(BATCH_BUCKETS, batches)] += 1
        self.total += 1
        if thrashed:
            self.thrashed += 1
        self.samples.append(batches)
        if len(self.samples) > 1000:
            del self.samples[:500]
