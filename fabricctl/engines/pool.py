"""The HTTP connections of one OpenAI-compatible engine: one kept alive per request in flight.

Contract: `Connections(base_url, window, ...)` holds `window` HTTP/1.1 connections for an
engine's item requests, spread over httpx clients of at most `POOL_SHARD` connections each,
and one small `side` client (`SIDE_CONNECTIONS`) for what is not an item's request
(/metrics, pre-warms). `slot()` is one place of the window: an async context manager that
waits for a free connection and gives the client it belongs to, so no client is ever asked
for more requests than it has connections (httpx never queues one inside). Waiting requests
are served in arrival order; the connection freed last is taken first, so a trickle of
requests keeps to one connection and a full window keeps all of them busy. Every connection
is kept alive while idle for `KEEPALIVE_S`. Connections open as the window first fills; none
is opened again while the server keeps them. `aclose()` closes every client. A given
`transport` (tests) serves every client. `limit` (a shared server's window, set by its
`Colocation`) caps the places in use below `window`; lowering it lets the requests in flight
finish and holds new ones until fewer than `limit` are in use (None: no cap, no cost).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

# Connections per httpx client. httpcore walks every connection of a client on each request
# and on each answer (and its idle check is quadratic in them), so one client of a window's
# connections costs O(window) per request: at 768 in flight (max_batch_size 256) a plain
# client spent 2.75 ms of CPU per request with one pool and 1.45 ms with pools of 16 (a
# loaded 2-core box, against bench/path_server.py).
POOL_SHARD = 16
# An idle connection is closed after this long: under vLLM's own keep-alive timeout
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), so the client rarely reuses one the server is closing
# (the engine resends a request whose connection was closed under it).
KEEPALIVE_S = 4.0
SIDE_CONNECTIONS = 2  # one scrape at a time, and a pre-warm


def shard_sizes(window: int) -> list[int]:
    """The connections of each client: `POOL_SHARD`s, and what is left in the last."""
    whole, rest = divmod(max(1, window), POOL_SHARD)
    return [POOL_SHARD] * whole + ([rest] if rest else [])


class Connections:
    """Why: a window of requests needs a window of kept connections, and httpx's pool costs
    per request what it holds."""

    def __init__(self, base_url: str, window: int, *, timeout_s: float,
                 headers: dict[str, str], transport: httpx.AsyncBaseTransport | None = None,
                 ) -> None:
        tls = httpx.create_ssl_context()  # once: each client loading the CA store took 25 ms

        def client(connections: int) -> httpx.AsyncClient:
            limits = httpx.Limits(max_connections=connections,
                                  max_keepalive_connections=connections,
                                  keepalive_expiry=KEEPALIVE_S)
            return httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout_s,
                                     headers=headers, limits=limits, verify=tls)

        self.side = client(SIDE_CONNECTIONS)
        self.sizes = shard_sizes(window)
        self.clients = [client(n) for n in self.sizes]
        # one entry per connection, naming its client (asyncio wakes a queue's getters FIFO)
        self._free: asyncio.LifoQueue[httpx.AsyncClient] = asyncio.LifoQueue()
        for c, n in reversed(list(zip(self.clients, self.sizes, strict=True))):
            for _ in range(n):
                self._free.put_nowait(c)
        self.in_use = 0  # places taken (their requests in flight or about to be)
        self._limit: int | None = None
        self._gate = asyncio.Condition()

    @property
    def limit(self) -> int | None:
        return self._limit

    async def set_limit(self, limit: int | None) -> None:
        """Cap the places in use (None: the whole window); waiters under it go on at once."""
        async with self._gate:
            self._limit = limit
            self._gate.notify_all()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[httpx.AsyncClient]:
        """One place of the window, as the client whose connection the request may use."""
        if self._limit is not None:
            async with self._gate:
                await self._gate.wait_for(
                    lambda: self._limit is None or self.in_use < self._limit)
                self.in_use += 1
        else:
            self.in_use += 1
        c = await self._free.get()
        try:
            yield c
        finally:
            self._free.put_nowait(c)
            self.in_use -= 1
            if self._limit is not None:
                async with self._gate:
                    self._gate.notify()

    async def aclose(self) -> None:
        for c in (self.side, *self.clients):
            await c.aclose()
