"""The garbage collector in a long-running broker process.

Contract: `settle_heap()` collects once, then moves every object alive at that moment
(modules, classes, recovered state) out of the collector's reach for good. Call it once the
process has started serving. Cyclic garbage among those objects is never reclaimed
afterwards; objects freed by reference counting still are.

Why: a full (oldest-generation) collection walks every tracked object; with the daemon's
imports alone that took 9-11 ms per collection in `bench/e2e_bench.py`, time during which
the event loop answers nobody (8 such pauses per 200k items: the pull-latency tail).
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect, then exclude what is alive now from every later collection."""
    gc.collect()
    gc.freeze()
