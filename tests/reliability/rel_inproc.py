"""In-process pieces of the reliability suite: a live broker with chosen store limits,
a recording producer, result readers and a faulty engine.

`live_broker` runs a `BrokerServer` over a `DurableBroker` (any `StoreConfig`) in the test's
own event loop, with the short heartbeats of tests/server_helpers.py. `FaultyEngine` wraps a
`SimEngine` and misbehaves on purpose: it can be down for its first calls, hang, answer
"abort" for some items, or fail every batch that holds a poison id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from rel_history import History
from server_helpers import fast_config, result_sequence

from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Item, ItemResult, Prewarm, Work
from fabricctl.engines.base import EngineLimits, EngineStats
from fabricctl.engines.sim import SimEngine
from fabricctl.errors import EngineError
from fabricctl.formats.results import ResultRecord
from fabricctl.server.app import BrokerServer
from fabricctl.store.durable import DurableBroker, StoreConfig
from fabricctl.supervisor.consumer import Consumer
from fabricctl.wire.client import Client


@contextlib.asynccontextmanager
async def live_broker(data: Path, store: StoreConfig | None = None,
                      core: CoreConfig | None = None, **server_kw: Any,
                      ) -> AsyncIterator[BrokerServer]:
    """A broker on `data`/broker.sock in this event loop; stopped and closed afterwards."""
    db = DurableBroker(data, time.time(), core, store)
    server = BrokerServer(db, fast_config(data, **server_kw))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        db.close()


async def submit(address: str | Path, items: list[Item], hist: History,
                 chunk: int = 50, **connect_kw: Any) -> None:
    """Submit `items` in chunks, every one acknowledged (duplicates count as stored)."""
    c = await Client.connect(address, "producer", "reliability-producer", **connect_kw)
    try:
        for k in range(0, len(items), chunk):
            part = items[k:k + chunk]
            ids = [it.id for it in part]
            hist.invoke(ids)
            ack = await c.submit(part)
            bad = {r.index: r.reason for r in ack.rejects
                   if not r.reason.startswith("duplicate id")}
            assert not bad, bad
            hist.ok(ids)
    finally:
        await c.close()


async def results(address: str | Path, **connect_kw: Any) -> list[tuple[int, ResultRecord]]:
    """The broker's whole result sequence, through a Client."""
    c = await Client.connect(address, "observer", "reliability-reader", **connect_kw)
    try:
        return await result_sequence(c)
    finally:
        await c.close()


async def until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """Bounded polling of in-process broker state (used only where no event exists)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {timeout} s: {what}")
        await asyncio.sleep(0.02)


def settled(server: BrokerServer, n: int) -> Callable[[], bool]:
    """True once `n` items were received and every one of them completed."""
    lg = server.state.view.ledger

    def done() -> bool:
        return lg.items_received >= n and lg.items_completed >= lg.items_received
    return done


class FaultyEngine:
    """Why: engines fail in a few typical ways; each must end in a retry or an error result.

    - `down`: while set, every call of `run` raises EngineError (a restarting engine);
    - `hang_calls`: the first N calls of `run` never answer (until cancelled);
    - `abort_every`: in a batch of more than one item, every k-th item comes back with
      finish_reason "abort" (vLLM dropped it), the first `abort_calls` batch calls only;
    - `poison`: any call whose batch holds one of these ids raises EngineError;
    - `prewarm_gate`: pre-warms wait on it (set `prewarming` when they start).
    """

    simulated = True

    def __init__(self, name: str = "faulty", *, down: bool = False, hang_calls: int = 0,
                 abort_every: int = 0, abort_calls: int = 0, poison: Iterable[str] = (),
                 max_batch_size: int = 16, max_batch_tokens: int = 4096,
                 time_scale: float = 0.0001) -> None:
        self.name = name
        self.inner = SimEngine(name=name, max_batch_size=max_batch_size,
                               max_batch_tokens=max_batch_tokens, max_input_len=4096,
                               time_scale=time_scale)
        self.down, self.hang_calls = down, hang_calls
        self.abort_every, self.abort_calls = abort_every, abort_calls
        self.poison = set(poison)
        self.calls = 0
        self.errors = 0
        self.hangs = 0
        self.aborts = 0
        self.abort_batches = 0
        self.prewarm_gate: asyncio.Event | None = None
        self.prewarming = asyncio.Event()

    def limits(self) -> EngineLimits:
        return self.inner.limits()

    async def run(self, work: Work) -> list[ItemResult]:
        self.calls += 1
        if self.down:
            self.errors += 1
            raise EngineError(f"{self.name}: connection refused (engine restarting)")
        if self.calls <= self.hang_calls:
            self.hangs += 1
            await asyncio.Event().wait()  # never answers; the consumer's timeout cancels it
        bad = [it.id for it in work.items if it.id in self.poison]
        if bad:
            self.errors += 1
            raise EngineError(f"{self.name}: engine crashed on {bad[0]}")
        out = await self.inner.run(work)
        if self.abort_every and len(out) > 1 and self.abort_batches < self.abort_calls:
            self.abort_batches += 1
            for r in out[self.abort_every - 1::self.abort_every]:
                r.finish_reason, r.text, r.tokens_out = "abort", "", 0
                self.aborts += 1
        return out

    async def prewarm(self, signal: Prewarm) -> None:
        if self.prewarm_gate is not None:
            self.prewarming.set()
            await self.prewarm_gate.wait()
        await self.inner.prewarm(signal)

    def stats(self) -> EngineStats:
        return self.inner.stats()

    async def close(self) -> None:
        await self.inner.close()


class Watched(Consumer):
    """A Consumer that calls `on_fail_back` as soon as it has failed a batch back (before its
    pause), so a test can bring a down engine back at a known point."""

    on_fail_back: Callable[[], None] | None = None

    async def _run(self, client: Client, work: Work) -> None:
        before = self.failures
        await super()._run(client, work)
        if self.failures > before and self.on_fail_back is not None:
            self.on_fail_back()
