"""A shared server's batch window, kept current from the server's own load.

Contract: `LoadFollower(scrape, connections, colocation, interval_s)`: `start()` takes one
reading at once (no request goes out uncapped), then every `interval_s` another: it scrapes
the server (`scrape`, the engine's one scrape: its counters fold as usual) and caps the
engine's connections in use (`Connections.set_limit`) at the window `Colocation.update`
gives for the server's running and waiting requests and the batch requests in flight there.
With `canary` (a live target is set), each reading also times one tiny live-priority request
to its first token, which the controller holds against its target.
A scrape that fails or lacks the gauges keeps the last window, logged once per outage;
`stop()` ends it and lifts the cap. `paused`: live traffic has the whole server (the batch
waits; nothing is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from fabricctl.core.colocate import Colocation, ServerLoad
from fabricctl.engines.base import SharedLoad
from fabricctl.engines.pool import Connections

log = logging.getLogger(__name__)


class Gauges(Protocol):
    """What a scrape must carry for the follower (the engine's `MetricsSample`)."""

    running: int | None
    waiting: int | None


class LoadFollower:
    """Why: the window a shared server can take changes with its live load, step by step."""

    def __init__(self, scrape: Callable[[], Awaitable[Gauges | None]], connections: Connections,
                 colocation: Colocation, interval_s: float = 0.25,
                 canary: Callable[[], Awaitable[float | None]] | None = None) -> None:
        self.scrape = scrape
        self.canary = canary
        self.last_ttft_s: float | None = None  # the canary's last time to first token
        self.connections = connections
        self.colocation = colocation
        self.interval_s = interval_s
        self.readings = 0  # scrapes that gave a window (tests, status)
        self._blind = False  # the last scrape gave no reading (logged once per outage)
        self._task: asyncio.Task[None] | None = None

    @property
    def paused(self) -> bool:
        return self.readings > 0 and self.colocation.paused()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow())
            await self.step()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.connections.set_limit(None)

    def view(self) -> SharedLoad | None:
        """The last reading, for the engine's stats (None before the first)."""
        if not self.readings:
            return None
        c = self.colocation
        return SharedLoad(capacity=c.capacity, window=c.window, live=c.live,
                          live_ttft_s=self.last_ttft_s, target_s=c.target_s)

    async def step(self) -> int | None:
        """One reading: the window it set, or None (the last one stands)."""
        if self.canary is not None:
            self.last_ttft_s = await self.canary()
        sample = await self.scrape()
        if sample is None or sample.running is None or sample.waiting is None:
            if not self._blind:
                log.warning("shared server: no load reading (its /metrics is unreachable or "
                            "has no vllm:num_requests_running/waiting); the batch window "
                            "stays at %s", self.connections.limit)
            self._blind = True
            return None
        self._blind = False
        window = self.colocation.update(ServerLoad(
            running=sample.running, waiting=sample.waiting,
            batch_outstanding=self.connections.in_use, live_ttft_s=self.last_ttft_s))
        await self.connections.set_limit(window)
        self.readings += 1
        return window

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.step()
