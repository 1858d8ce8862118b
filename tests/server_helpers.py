"""Shared pieces of the socket-level server tests: a live broker, items, consumers.

`running_server` starts a `BrokerServer` over a `DurableBroker` in a temporary data dir
inside the test's own event loop (short heartbeats and ticks, so the tests are quick);
`WireConsumer` speaks the protocol frame by frame so a test sees pushes and replies in
exactly the order the broker wrote them; `spawn_consumer` runs tests/null_consumer.py as
a separate process for the tests that kill or stop one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Contract, Item, ItemResult, Work
from fabricctl.formats.results import ResultRecord
from fabricctl.server.app import BrokerServer
from fabricctl.server.config import ServerConfig
from fabricctl.store.durable import DurableBroker
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import (
    PROTOCOL_VERSION,
    Complete,
    Done,
    Frame,
    Hello,
    PrewarmPush,
    Pull,
    Register,
    Registered,
    Welcome,
    WorkReply,
    encode,
    read_frame,
)

NULL_CONSUMER = str(Path(__file__).with_name("null_consumer.py"))
REPO = str(Path(__file__).resolve().parent.parent)
MODEL = "m"
SIG_A = 0xA11CE
SIG_B = 0xB0B
CONTRACT = Contract(MODEL, 16, 4096, 4096)


def fast_config(data_dir: Path, **kw: Any) -> ServerConfig:
    """Heartbeats, timeouts and ticks short enough for tests."""
    base: dict[str, Any] = {"heartbeat_s": 0.2, "heartbeat_timeout_s": 1.0, "tick_s": 0.2}
    base.update(kw)
    return ServerConfig(data_dir, **base)


@contextlib.asynccontextmanager
async def running_server(
    tmp_path: Path, core: CoreConfig | None = None, **server_kw: Any
) -> AsyncIterator[BrokerServer]:
    """A live broker on a Unix socket in `tmp_path/data`, stopped and closed afterwards."""
    data = tmp_path / "data"
    store = DurableBroker(data, time.time(), core)
    server = BrokerServer(store, fast_config(data, **server_kw))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        store.close()


def make_items(n: int, signature: int = SIG_A, tokens: int = 100, prefix: str = "i",
               model: str = MODEL) -> list[Item]:
    return [Item(f"{prefix}{k}", model, signature, tokens, 8, f"p{k}".encode())
            for k in range(n)]


async def all_results(client: Client, limit: int = 100_000) -> list[ResultRecord]:
    rows = await client.results(0, limit)
    return [rec for _, rec in rows]


async def result_sequence(client: Client, page: int = 5000) -> list[tuple[int, ResultRecord]]:
    """The broker's whole result sequence, `page` rows a query."""
    out: list[tuple[int, ResultRecord]] = []
    while True:
        rows = await client.results(out[-1][0] if out else 0, page)
        out.extend(rows)
        if len(rows) < page:
            return out


def results_by_id(results: list[ResultRecord]) -> dict[str, list[ResultRecord]]:
    out: dict[str, list[ResultRecord]] = {}
    for rec in results:
        out.setdefault(rec.id, []).append(rec)
    return out


async def wait_until(predicate: Any, timeout: float = 10.0, every: float = 0.02) -> None:
    """Poll an async predicate with a bounded deadline (only where no event exists)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(every)


class Tally:
    """Items completed across consumers; `reached` is set once `target` were stored."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.reached = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Event]] = []

    def add(self, n: int) -> None:
        self.count += n
        if self.count >= self.target:
            self.reached.set()
        for want, event in self._waiters:
            if self.count >= want:
                event.set()

    async def at_least(self, n: int) -> None:
        """Wait until at least `n` items were stored."""
        event = asyncio.Event()
        self._waiters.append((n, event))
        if self.count >= n:
            event.set()
        await event.wait()


async def run_consumer(client: Client, name: str, text: str, stop: asyncio.Event,
                       tally: Tally | None = None, seen: list[Work] | None = None,
                       contract: Contract = CONTRACT) -> int:
    """Register, then pull and complete until `stop` is set; returns items completed."""
    await client.register(name, contract)
    done = 0
    while not stop.is_set():
        pull = asyncio.ensure_future(client.pull(0.5))
        halt = asyncio.ensure_future(stop.wait())
        await asyncio.wait({pull, halt}, return_when=asyncio.FIRST_COMPLETED)
        if not pull.done():
            pull.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pull
            break
        halt.cancel()
        work = pull.result()
        if work is None:
            continue
        if seen is not None:
            seen.append(work)
        stored = await client.complete(work.id, [ItemResult(it.id, text=text)
                                                 for it in work.items])
        if stored >= 0:
            done += stored
            if tally is not None:
                tally.add(stored)
    return done


@dataclass
class WireConsumer:
    """A consumer that reads frames itself, logging pushes and replies in wire order."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    name: str
    log: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, signature, epoch)
    rid: int = 0

    @classmethod
    async def connect(cls, path: Path, name: str, contract: Contract) -> WireConsumer:
        reader, writer = await asyncio.open_unix_connection(str(path))
        wc = cls(reader, writer, name)
        wc.send(Hello(PROTOCOL_VERSION, "consumer", name))
        assert isinstance(await wc.next_frame(), Welcome)
        wc.rid += 1
        wc.send(Register(wc.rid, name, contract))
        assert isinstance(await wc.reply(wc.rid), Registered)
        return wc

    def send(self, frame: Frame) -> None:
        self.writer.write(encode(frame))

    async def next_frame(self) -> Frame:
        frame = await read_frame(self.reader)
        assert frame is not None, "the broker closed the connection"
        if isinstance(frame, PrewarmPush):
            self.log.append(("push", frame.signal.signature, frame.signal.epoch))
        return frame

    async def reply(self, rid: int) -> Frame:
        while True:
            frame = await self.next_frame()
            if getattr(frame, "rid", None) == rid:
                return frame

    async def pull(self, wait_s: float = 0.5) -> Work | None:
        self.rid += 1
        self.send(Pull(self.rid, wait_s))
        reply = await self.reply(self.rid)
        assert isinstance(reply, WorkReply)
        if reply.work is not None:
            self.log.append(("work", reply.work.signature, reply.work.epoch))
        return reply.work

    async def complete(self, work: Work, text: str) -> int:
        self.rid += 1
        self.send(Complete(self.rid, work.id, [ItemResult(i.id, text=text) for i in work.items]))
        done = await self.reply(self.rid)
        assert isinstance(done, Done)
        return done.stored

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


@dataclass
class ConsumerProc:
    """tests/null_consumer.py running as a child process, driven line by line."""

    proc: asyncio.subprocess.Process

    async def line(self, timeout: float = 15.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        assert raw, "the consumer process exited without a report"
        out: dict[str, Any] = json.loads(raw)
        return out

    async def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def reap(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()


async def spawn_consumer(socket: Path, name: str, text: str) -> ConsumerProc:
    """Start a consumer process that pulls one batch, reports it, then waits on stdin."""
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, NULL_CONSUMER, "--hold", str(socket), name, text,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
    return ConsumerProc(proc)
