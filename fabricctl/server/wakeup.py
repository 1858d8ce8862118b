"""A broadcast wake-up for long-polling pulls: every waiter wakes when new work may exist."""

from __future__ import annotations

import asyncio


class Wakeup:
    """Why: consumers long-poll; new items, returned batches and ticks must wake them all."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """Wait until notified or `timeout` seconds pass; True when notified."""
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
