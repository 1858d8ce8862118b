"""One connected client as the server sees it: its role, its transport, when it was last heard."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fabricctl.wire.protocol import Frame, encode


async def _ready() -> None:
    return None


@dataclass(eq=False, slots=True)
class Peer:
    """Why: replies, pushes and liveness all hang off the connection they belong to."""

    transport: asyncio.Transport
    transport_kind: str  # "unix" or "tcp"
    role: str = ""
    name: str = ""
    consumer: str | None = None  # the registered consumer name, for consumers
    gpu: int | None = None
    engine: str = ""
    simulated: bool = False
    last_seen: float = 0.0
    engine_stats: dict[str, Any] = field(default_factory=dict)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    streams: dict[int, asyncio.Task[Any]] = field(default_factory=dict)  # FollowResults, by rid
    closed: bool = False
    drain: Callable[[], Awaitable[None]] = _ready  # waits while the write buffer is full

    def send(self, frame: Frame) -> bool:
        """Queue a frame; False when the connection is already gone."""
        if self.closed or self.transport.is_closing():
            self.closed = True
            return False
        try:
            self.transport.write(encode(frame))
        except (ConnectionError, RuntimeError, OSError):
            self.closed = True
            return False
        return True

    def close(self, graceful: bool = False) -> None:
        """Stop serving this connection: `graceful` sends what is queued first (an Error
        frame, last replies; given up after 5 s), otherwise it is cut at once (a dead peer)."""
        self.closed = True
        for t in self.tasks:
            t.cancel()
        transport = self.transport
        if transport.is_closing():
            return
        if graceful and transport.get_write_buffer_size():
            transport.close()
            asyncio.get_running_loop().call_later(5.0, transport.abort)
        else:
            transport.abort()
