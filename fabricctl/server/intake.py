"""What waits for the writer: submits and completions queued until a cycle takes them.

Contract: `submit(items)`, `complete(done)` and `job(op)` queue work with the future its
sender waits on and wake the writer. `take()` makes the next `Cycle`: up to `max_items`
items of waiting submits (at least one chunk, whole chunks only) and up to `max_batches`
waiting completions holding at most twice `max_items` results (at least one batch), and up
to `MAX_OPS` job operations, oldest first; the batches it took stay `taken` until the writer
`release`s that cycle. `pending_batches()` names the batches whose completion was received
and is not settled yet (queued or taken). `fill()` waits up to `max_wait_s` while the next
cycle is not full; `wait()` until work arrives; `work_before(commit)` until either work
arrives or that commit returns. `close()` wakes the writer for the last time: it takes what
waits and stops."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

from fabricctl.core.jobs import JobRecord
from fabricctl.core.types import Item
from fabricctl.server.cycle import Cycle
from fabricctl.store.dispatch import Completed
from fabricctl.store.jobs import JobOp
from fabricctl.wire.protocol import Reject

MAX_OPS = 256  # job operations one cycle takes


class CommitQueue:
    """Why: how much one commit takes, and how long it waits for more, is one policy."""

    def __init__(self, max_items: int, max_batches: int, max_wait_s: float) -> None:
        self.max_items = max_items
        self.max_batches = max_batches
        self.max_wait_s = max_wait_s
        self._chunks: deque[tuple[list[Item], asyncio.Future[list[Reject]]]] = deque()
        self._items = 0
        self._done: deque[tuple[Completed, asyncio.Future[int]]] = deque()
        self._ops: deque[tuple[JobOp, asyncio.Future[JobRecord | str]]] = deque()
        self._taken: set[int] = set()  # batches of cycles being prepared or committed
        self._wake = asyncio.Event()
        self.closing = False

    def submit(self, items: list[Item]) -> asyncio.Future[list[Reject]]:
        fut: asyncio.Future[list[Reject]] = asyncio.get_running_loop().create_future()
        self._chunks.append((items, fut))
        self._items += len(items)
        self._wake.set()
        return fut

    def complete(self, done: Completed) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._done.append((done, fut))
        self._wake.set()
        return fut

    def job(self, op: JobOp) -> asyncio.Future[JobRecord | str]:
        fut: asyncio.Future[JobRecord | str] = asyncio.get_running_loop().create_future()
        self._ops.append((op, fut))
        self._wake.set()
        return fut

    def close(self) -> None:
        self.closing = True
        self._wake.set()

    def waiting(self) -> bool:
        """Whether any submit, completion or job operation waits to be taken."""
        return bool(self._chunks or self._done or self._ops)

    def pending_batches(self) -> set[int]:
        return {d[0] for d, _ in self._done} | self._taken

    async def wait(self) -> None:
        """Until something is queued (or `close`)."""
        await self._wake.wait()
        self._wake.clear()

    async def fill(self) -> None:
        """Wait up to `max_wait_s` while the next cycle is not full, woken by new work. Never
        under a millisecond at a time: uvloop's timers count whole milliseconds, and a
        shorter wait would spin."""
        deadline = time.perf_counter() + self.max_wait_s
        while (not self.closing and self._items < self.max_items
               and len(self._done) < self.max_batches):
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(left, 0.001))

    async def work_before(self, commit: asyncio.Future[Any] | None) -> bool:
        """Wait for new work or for `commit` to return; True: work came first."""
        if commit is None or commit.done():
            return False
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({commit, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        return self.waiting() and not commit.done()

    def take(self) -> Cycle:
        chunks: list[tuple[list[Item], asyncio.Future[list[Reject]]]] = []
        taken = 0
        while self._chunks and (not chunks or taken + len(self._chunks[0][0]) <= self.max_items):
            chunks.append(self._chunks.popleft())
            taken += len(chunks[-1][0])
        self._items -= taken
        done: list[tuple[Completed, asyncio.Future[int]]] = []
        results = 0  # at most max_batches, and about twice max_items results
        while self._done and len(done) < self.max_batches and (
                not done or results + len(self._done[0][0][1]) <= 2 * self.max_items):
            done.append(self._done.popleft())
            results += len(done[-1][0][1])
        self._taken.update(d[0] for d, _ in done)
        ops = [self._ops.popleft() for _ in range(min(len(self._ops), MAX_OPS))]
        return Cycle(chunks, done, ops)

    def release(self, c: Cycle) -> None:
        """The cycle is over (settled or failed): its batches are no longer taken."""
        self._taken.difference_update(d[0] for d, _ in c.done)
