"""The garbage collector in a long-running broker process.

Contract: `settle_heap()` collects once, moves every object alive at that moment (modules,
classes, recovered state) out of the collector's reach for good, and sets the collector's
thresholds to `GC_THRESHOLDS`. Call it once the process has started serving. Cyclic garbage
among the frozen objects is never reclaimed afterwards; objects freed by reference counting
still are, and later cyclic garbage is collected as before, only in fewer, larger passes.

Why: a full (oldest-generation) collection walks every tracked object; with the daemon's
imports alone that took 9-11 ms per collection in `bench/e2e_bench.py`, time during which
the event loop answers nobody (8 such pauses per 200k items: the pull-latency tail). And
ingest allocates a shape, its lanes and its index entries for every new prompt shape: at
Python's default thresholds (700, 10, 10) the collections over that growing heap took 0.80
s of the 6.5 s that `fabricctl run` spent on 20,000 items over 12,500 shapes
(`bench/shapes_bench.py`, workload c; summed through `gc.callbacks`); at these, 0.15 s.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (50_000, 20, 100)  # young collections every 50,000 allocations, not 700


def settle_heap() -> None:
    """Collect, exclude what is alive now from every later collection, raise the thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
