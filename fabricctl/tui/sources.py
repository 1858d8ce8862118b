"""Where the dashboard's snapshots come from: a live broker, or fixed data for tests.

Contract: a `SnapshotSource` has an `address` (shown in the header) and
`stream(interval, lanes)`, an async iterator of `Snapshot`s about every `interval` seconds,
carrying lane lists only for the `(model, signature)` shapes in `lanes`. A lost or absent
broker ends the iteration with a `FabricError` (usually `BackendMissing`) or `OSError`; the
app then shows its reconnecting banner and calls `stream` again after a backoff. Closing the
iterator (`aclose`) releases the connection. The app iterates `stream` on an event loop of
its worker thread's own (`fabricctl.tui.pump.Pump`), never on the UI's, so reading and
decoding happen off the UI thread and a source touches nothing of the app. `FixedSource`
replays given snapshots, then stays silent without a clock, so screenshots of it are
reproducible.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

from fabricctl.core.snapshot import Snapshot

Lanes = list[tuple[str, int]]


class SnapshotSource(Protocol):
    """Why: the app must be testable (and benchmarkable) without a broker."""

    address: str

    def stream(self, interval: float, lanes: Lanes) -> AsyncIterator[Snapshot]: ...


class BrokerSource:
    """Snapshots from the stats stream of the broker at a data dir, socket or HOST:PORT."""

    def __init__(self, address: str | Path, token: str = "") -> None:
        self.address = str(address)
        self.token = token

    async def stream(self, interval: float, lanes: Lanes) -> AsyncIterator[Snapshot]:
        from fabricctl.wire.client import Client

        client = await Client.connect(self.address, "observer", "fabricctl-top",
                                      token=self.token, timeout=5.0)
        try:
            async for snap in client.snapshots(interval, lanes):
                yield snap
        finally:
            await client.close()


class FixedSource:
    """Replays `snapshots` once, in order, then yields nothing more until closed."""

    def __init__(self, snapshots: Sequence[Snapshot], address: str = "fixed data") -> None:
        self.snapshots = list(snapshots)
        self.address = address
        self.requests: list[tuple[float, Lanes]] = []  # what the app asked for, for tests

    async def stream(self, interval: float, lanes: Lanes) -> AsyncIterator[Snapshot]:
        self.requests.append((interval, list(lanes)))
        for snap in self.snapshots:
            yield snap
        await asyncio.Event().wait()
