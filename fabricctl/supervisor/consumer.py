"""One consumer per GPU: registers its engine's contract, pulls, runs, completes, heartbeats.

Contract: `Consumer.run(stop)` connects to a broker (Unix socket or TCP with a token),
registers `Contract(model, *engine.limits())`, heartbeats every `heartbeat_s` with the
engine's counters, and loops: handle any pre-warm pushes first (so the engine prefills the
next shape's prefix before its first batch), pull (long-poll), run the batch on the engine,
complete it. An `EngineError` fails the batch back to the broker (it goes to the front of
its lane); a lost broker is retried with backoff until `stop` is set. When `stop` is set it
finishes the batch in hand and returns; nothing it held is lost either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import msgspec

from fabricctl.client import Client
from fabricctl.core.types import Contract, ItemResult, Work
from fabricctl.engines.base import Engine, EngineError
from fabricctl.errors import BackendMissing, BrokerError
from fabricctl.server.protocol import PrewarmPush

log = logging.getLogger("fabricctl.consumer")


class Consumer:
    """Why: the broker is math-only; this is the part that knows an engine exists."""

    def __init__(
        self, address: str | Path, name: str, model: str, engine: Engine,
        gpu: int | None = None, token: str = "", pull_wait_s: float = 1.0,
    ) -> None:
        self.address = address
        self.name = name
        self.model = model
        self.engine = engine
        self.gpu = gpu
        self.token = token
        self.pull_wait_s = pull_wait_s
        self.batches = 0
        self.items = 0
        self.failures = 0
        self.prewarms = 0
        self.connected = asyncio.Event()
        self.max_unacked = 4  # completions sent but not yet confirmed durable
        self._unacked: set[asyncio.Task[None]] = set()

    def contract(self) -> Contract:
        lim = self.engine.limits()
        return Contract(self.model, lim.max_batch_size, lim.max_batch_tokens, lim.max_input_len)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.2
        while not stop.is_set():
            try:
                await self._session(stop)
                backoff = 0.2
            except (BackendMissing, BrokerError, ConnectionError, OSError) as e:
                self.connected.clear()
                if stop.is_set():
                    break
                log.warning("consumer %s: %s; retrying in %.1f s", self.name, e, backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 5.0)

    async def _session(self, stop: asyncio.Event) -> None:
        client = await Client.connect(self.address, "consumer", self.name, self.token)
        try:
            reg = await client.register(self.name, self.contract(), self.gpu, self.engine.name,
                                        self.engine.simulated)
            self.connected.set()
            beat = asyncio.get_running_loop().create_task(self._heartbeat(client, reg.heartbeat_s))
            try:
                while not stop.is_set():
                    await self._prewarm(client)
                    work = await client.pull(self.pull_wait_s)  # bounded long-poll
                    if work is None:
                        continue
                    await self._prewarm(client)
                    await self._run(client, work)
            finally:
                beat.cancel()
                if self._unacked:  # a batch is ours until the broker confirmed it
                    await asyncio.wait(self._unacked)
        finally:
            await client.close()

    async def _prewarm(self, client: Client) -> None:
        while not client.pushes.empty():
            push = client.pushes.get_nowait()
            if isinstance(push, PrewarmPush):
                try:
                    await self.engine.prewarm(push.signal)
                    self.prewarms += 1
                except EngineError as e:
                    log.warning("consumer %s: pre-warm failed: %s", self.name, e)

    async def _run(self, client: Client, work: Work) -> None:
        try:
            results = await self.engine.run(work)
        except EngineError as e:
            self.failures += 1
            log.warning("consumer %s: batch %d failed: %s", self.name, work.id, e)
            await client.fail(work.id, str(e))
            return
        # Pipelined: the next pull overlaps this completion's durable commit.
        task = asyncio.get_running_loop().create_task(self._complete(client, work, results))
        self._unacked.add(task)
        task.add_done_callback(self._unacked.discard)
        if len(self._unacked) >= self.max_unacked:
            await asyncio.wait(self._unacked, return_when=asyncio.FIRST_COMPLETED)

    async def _complete(self, client: Client, work: Work, results: list[ItemResult]) -> None:
        try:
            await client.complete(work.id, results)
        except (BackendMissing, BrokerError, ConnectionError, OSError) as e:
            log.warning("consumer %s: completion of batch %d not confirmed (%s); the broker "
                        "will hand it out again", self.name, work.id, e)
            return
        self.batches += 1
        self.items += len(work.items)

    async def _heartbeat(self, client: Client, every: float) -> None:
        while True:
            try:
                await client.heartbeat(msgspec.to_builtins(self.engine.stats()))
            except (BackendMissing, ConnectionError, OSError):
                return
            await asyncio.sleep(every)
