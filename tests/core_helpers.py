"""Driving the pure core in tests: every consumer pulls and completes at once, each tick of
an explicit clock."""

from __future__ import annotations

from collections.abc import Iterator

from fabricctl.core.broker import Broker
from fabricctl.core.types import Batch


def each_batch(b: Broker, t0: float, t1: float, dt: float = 0.01
               ) -> Iterator[tuple[float, str, Batch]]:
    """From `t0` until `t1`, every `dt`: each consumer pulls once and completes what it got
    at once; yields (time, consumer, batch) for each batch handed out, in order."""
    t = t0
    while t < t1:
        for c in list(b.consumers):
            batch = b.pull(c, t)
            if batch is not None:
                b.complete(batch.id, t)
                yield t, c, batch
        t = round(t + dt, 6)
