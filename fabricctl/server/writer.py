"""The writer: group commit of submits and completions, one durable transaction per cycle.

Contract: `submit(items)` returns the chunk's rejects once the commit that stored its
accepted items returned (or raises the `StoreError` that refused them); `complete(done)`
returns the results stored for one batch (-1: not in flight) once its commit returned;
`enqueue_complete` does the same without waiting. A cycle takes up to `max_items` items of
waiting submits (at least one chunk) and up to `max_batches` waiting completions holding at
most twice as many results (at least one batch), so no step holds the event loop long, waiting
up to `max_wait_s` for more when there are fewer, prepares both on the event loop, commits
them in one transaction on the writer thread (LMDB lets go of the GIL while it writes and
syncs, so the loop goes on serving pulls and heartbeats), then applies both on the loop and
calls `on_commit`. One cycle at a time. A store refusal of the ingest (full map or disk)
fails those submits only: the completions are committed alone. `pending_batches()` names the
batches whose completion was received and is not settled yet; `stop()` commits whatever
waits and returns once the last cycle finished (a cycle is never cut short).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from fabricctl.core.types import Item, ItemResult
from fabricctl.server.protocol import Reject
from fabricctl.store.errors import StoreError
from fabricctl.store.steps import Steps

if TYPE_CHECKING:
    from fabricctl.store.completion import CompletePlan
    from fabricctl.store.durable import DurableBroker
    from fabricctl.store.ingest import IngestPlan

Done = tuple[int, list[ItemResult], "int | None"]  # batch id, results, gpu
T = TypeVar("T")


class Writer:
    """Why: the broker's one writer; the event loop never waits for an fsync."""

    def __init__(
        self, store: DurableBroker, clock: Callable[[], float], on_commit: Callable[[], None],
        max_items: int = 512, max_batches: int = 16, max_wait_s: float = 0.002,
        threaded: bool = True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.on_commit = on_commit
        self.max_items = max_items
        self.max_batches = max_batches
        self.max_wait_s = max_wait_s
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="fabricctl-writer")
        self.threaded = threaded
        self._chunks: deque[tuple[list[Item], asyncio.Future[list[Reject]]]] = deque()
        self._items = 0
        self._done: deque[tuple[Done, asyncio.Future[int]]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.commits = 0
        self.ingest_commits = 0
        self.complete_commits = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        while self._chunks or self._done:  # never started: commit what waits here
            await self._cycle()
        self.thread.shutdown(wait=True)

    async def submit(self, items: list[Item]) -> list[Reject]:
        fut: asyncio.Future[list[Reject]] = asyncio.get_running_loop().create_future()
        self._chunks.append((items, fut))
        self._items += len(items)
        self._wake.set()
        return await fut

    def enqueue_complete(self, done: Done) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._done.append((done, fut))
        self._wake.set()
        return fut

    async def complete(self, done: Done) -> int:
        return await self.enqueue_complete(done)

    def pending_batches(self) -> set[int]:
        return {d[0] for d, _ in self._done}

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not (self._chunks or self._done):
                if self._closing:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            deadline = loop.time() + self.max_wait_s
            while (not self._closing and self._items < self.max_items
                   and len(self._done) < self.max_batches and loop.time() < deadline):
                await asyncio.sleep(min(self.max_wait_s / 4, deadline - loop.time()))
            await self._cycle()
            await asyncio.sleep(0)

    async def _commit(self, ip: IngestPlan | None, cp: CompletePlan | None) -> None:
        """Stage the plans here in steps, commit on the writer thread, grow the map here if
        needed.

        Only the commit runs on the thread: py-lmdb lets go of the GIL around every put, so
        a thread doing the puts waits for the GIL once per row while the loop is busy
        (measured: a 1,000-row write took 150 ms instead of 1 ms against a busy loop)."""
        store = self.store
        loop = asyncio.get_running_loop()
        while (staged := await self._steps(store.stage_steps(ip, cp))) is not None:
            if self.threaded:
                ok = await loop.run_in_executor(self.thread, store.env.finish,
                                                staged.txn_staged, staged.drain)
            else:
                ok = store.env.finish(staged.txn_staged, staged.drain)
            if ok:
                store.committed(staged)
                return
            store.env.grow(staged.drain)

    async def _steps(self, steps: Steps[T]) -> T:
        """Run a store operation, letting the loop serve sockets at each of its pauses."""
        try:
            while True:
                next(steps)
                await io_turn()
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()  # cancelled at a pause: its transaction is aborted

    async def _cycle(self) -> None:
        chunks, taken = [], 0
        while self._chunks and (not chunks or taken + len(self._chunks[0][0]) <= self.max_items):
            chunks.append(self._chunks.popleft())
            taken += len(chunks[-1][0])
        self._items -= taken
        done, results = [], 0  # at most max_batches, and about twice max_items results
        while self._done and len(done) < self.max_batches and (
                not done or results + len(self._done[0][0][1]) <= 2 * self.max_items):
            done.append(self._done.popleft())
            results += len(done[-1][0][1])
        store, now = self.store, self.clock()
        ip: IngestPlan | None = None
        cp: CompletePlan | None = None
        refused: BaseException | None = None
        try:
            if chunks:
                try:
                    ip = await self._steps(
                        store.ingest_steps([it for c, _ in chunks for it in c], now))
                except StoreError as e:
                    refused = e
                await io_turn()
            if done:
                cp = await self._steps(store.complete_steps([d for d, _ in done], now))
                await io_turn()
            try:
                await self._commit(ip, cp)
            except StoreError as e:
                if ip is None or cp is None or not cp.settled:
                    raise
                refused, ip = e, None  # the ingest was refused: the completions go alone
                await self._commit(None, cp)
        except BaseException as e:
            if cp is not None:
                store.abort_complete(cp, self.clock())
            if ip is not None:
                refused = e
            _fail([f for _, f in chunks], refused or e)
            _fail([f for _, f in done], e)
            if not isinstance(e, Exception):
                raise
            return
        now = self.clock()
        self.commits += 1
        if ip is not None:
            await io_turn()
            self.ingest_commits += bool(ip.admits)
            _answer_chunks(chunks, await self._steps(store.apply_ingest_steps(ip, now)))
            if cp is not None:
                await io_turn()
        elif chunks:
            _fail([f for _, f in chunks], refused or StoreError("ingest refused"))
        if cp is not None:
            self.complete_commits += 1
            stored = await self._steps(store.apply_complete_steps(cp, now))
            for (_, fut), n in zip(done, stored, strict=True):
                if not fut.done():
                    fut.set_result(n)
        self.on_commit()


async def io_turn() -> None:
    """Let the event loop serve what arrived before the writer's next step holds it.

    A task resumed by `sleep(0)` runs ahead of the socket events the next loop turn collects,
    so one yield would let a long step run before pulls that waited through the previous
    one. The second yield puts the step behind them."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _answer_chunks(chunks: list[tuple[list[Item], Any]], rejects: list[Any]) -> None:
    """Split the rejects of the flattened chunks back into each chunk's own indexes."""
    out: list[list[Reject]] = [[] for _ in chunks]
    starts, pos = [], 0
    for c, _ in chunks:
        starts.append(pos)
        pos += len(c)
    ci = 0
    for r in rejects:
        while ci + 1 < len(starts) and r.index >= starts[ci + 1]:
            ci += 1
        out[ci].append(Reject(r.index - starts[ci], r.reason))
    for (_, fut), rs in zip(chunks, out, strict=True):
        if not fut.done():
            fut.set_result(rs)


def _fail(futs: list[asyncio.Future[Any]], e: BaseException) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(e)
            fut.exception()  # a waiter that went away must not leave it unretrieved
