"""Running the store's stepped operations on the event loop, pausing between their steps.

Contract: `run_steps_async(steps, each)` runs a `Steps` generator to its result; at each of
its pauses it calls `each` (if given) and then `io_turn()`, which returns only after the
socket events that were waiting have been handled. Cancelled at a pause, the generator is
closed (a transaction it holds is aborted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from fabricctl.store.steps import Steps

T = TypeVar("T")


async def run_steps_async(steps: Steps[T], each: Callable[[], None] | None = None) -> T:
    """Run a store operation, letting the loop serve sockets at each of its pauses (and
    calling `each` there first)."""
    try:
        while True:
            next(steps)
            if each is not None:
                each()
            await io_turn()
    except StopIteration as done:
        return done.value
    finally:
        steps.close()


async def io_turn() -> None:
    """Let the event loop serve what arrived before the writer's next step holds it.

    A task resumed by `sleep(0)` runs ahead of the socket events the next loop turn collects,
    so one yield would let a long step run before pulls that waited through the previous
    one. The second yield puts the step behind them."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)
