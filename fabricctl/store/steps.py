"""Long store operations as generators that pause between parts.

Contract: a `Steps[T]` is a generator that does part of its work between `yield`s and returns
its `T`. A synchronous caller runs it straight through (`run_steps`); the daemon's writer
lets the event loop serve sockets at each pause, so no single step holds the loop for long.
Between pauses nothing but reads may touch the store: the writer runs one operation at a time.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")

Steps = Generator[None, None, T]

STEP_ITEMS = 128  # items an ingest screens and places between pauses
STEP_ROWS = 1024  # items screened between pauses
STEP_PUTS = 512  # rows put between pauses (a transaction's tables each start after one)
STEP_DELETES = 512  # keys a segment delete removes between pauses
STEP_ADMITS = 512  # committed entries made dispatchable between pauses
STEP_RESULTS = 256  # results encoded between pauses (and batches settled, over 8)


def run_steps(steps: Steps[T]) -> T:
    """Run every step at once; the operation's result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
