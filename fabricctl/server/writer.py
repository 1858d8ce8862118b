"""The writer: group commit of submits and completions, one durable transaction per cycle.

Contract: `submit(items)` returns the chunk's rejects once the commit that stored its
accepted items returned (or raises the `StoreError` that refused them); `complete(done)`
returns the results stored for one batch (-1: not in flight) once its commit returned;
`enqueue_complete` does the same without waiting; `job(op)` queues a job operation (open,
seal, cancel, the tick's), answered with the job's record once its commit returned: job
records are written only in the writer's transactions, never in a second one on the loop. A
cycle takes up to `max_items` items of waiting submits (at least one chunk) and up to
`max_batches` waiting completions holding at most twice as many results (at least one
batch), waiting up to `max_wait_s` for more when there are fewer and no commit is running
(the queues and that policy: `CommitQueue`, in intake.py). It prepares both on the event
loop in short steps (the store's `steps`, `fabricctl.store.writes`), each after the socket
events that were waiting, stages them in one transaction, and commits it on the writer
thread (`steps.finish`: LMDB lets go of the GIL while it writes and syncs; a map that filled
meanwhile is grown with `steps.grow` here, and the cycle staged again). While that commit
runs, the next cycle is
taken and prepared; then the first is applied, answered and `on_commit` called (also after
each part of its entries is made dispatchable), and only then is the next one staged: one
transaction at a time, applied in order. A store refusal of the ingest (full map or disk)
fails those submits only: the completions are committed alone. `pending_batches()` names the
batches whose completion was received and is not settled yet; `stop()` commits whatever
waits and returns once the last cycle finished (a cycle is never cut short)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from fabricctl.core.jobs import JobRecord
from fabricctl.core.types import Item
from fabricctl.errors import StoreError
from fabricctl.server.config import COMMIT_ITEMS, COMMIT_WAIT_S, COMPLETE_BATCHES
from fabricctl.server.cycle import Cycle, answer_chunks, fail_all
from fabricctl.server.intake import CommitQueue
from fabricctl.server.pauses import io_turn, run_steps_async
from fabricctl.store.dispatch import Completed
from fabricctl.store.jobs import JobOp
from fabricctl.store.steps import run_steps
from fabricctl.wire.protocol import Reject

if TYPE_CHECKING:
    from fabricctl.store.durable import DurableBroker



class Writer:
    """Why: the broker's one writer; the event loop never waits for an fsync."""

    def __init__(
        self, store: DurableBroker, clock: Callable[[], float], on_commit: Callable[[], None],
        max_items: int = COMMIT_ITEMS, max_batches: int = COMPLETE_BATCHES,
        max_wait_s: float = COMMIT_WAIT_S,
        threaded: bool = True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.on_commit = on_commit
        self.intake = CommitQueue(max_items, max_batches, max_wait_s)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="fabricctl-writer")
        self.threaded = threaded
        self._task: asyncio.Task[None] | None = None
        self.commits = 0
        self.ingest_commits = 0
        self.complete_commits = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.intake.close()
        if self._task is not None:
            await self._task
        else:  # never started: commit what waits here
            await self._run()
        self.thread.shutdown(wait=True)

    async def submit(self, items: list[Item]) -> list[Reject]:
        return await self.intake.submit(items)

    def job(self, op: JobOp) -> asyncio.Future[JobRecord | str]:
        """A job operation, answered (the record after it, or why it was refused) once its
        commit returned."""
        return self.intake.job(op)

    def enqueue_complete(self, done: Completed) -> asyncio.Future[int]:
        return self.intake.complete(done)

    async def complete(self, done: Completed) -> int:
        return await self.enqueue_complete(done)

    def pending_batches(self) -> set[int]:
        return self.intake.pending_batches()

    # -- the cycle ----------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        landing: Cycle | None = None  # staged, its commit running on the thread
        intake = self.intake
        while True:
            if not intake.waiting():
                if landing is not None:
                    if await intake.work_before(landing.commit):
                        continue  # prepared while it lands
                    await self._finish(landing)
                    landing = None
                    continue
                if intake.closing:
                    return
                await intake.wait()
                continue
            if landing is None:  # no commit to overlap: wait a little for a fuller cycle
                await intake.fill()
            cycle = intake.take()
            if landing is None:
                await self._prepare(cycle, None)
            else:  # prepared while the commit runs; applied as soon as it returned
                behind = landing.ingest_plan is not None and bool(landing.ingest_plan.admits)
                prepared = loop.create_task(self._prepare(cycle, landing))
                try:
                    await self._finish(landing)
                finally:
                    await prepared
                if behind and not landing.ingested and cycle.ingest_plan is not None:
                    cycle.ingest_plan = None  # screened against ids that were not stored: again
                    await self._prepare(cycle, None, again=True)
                landing = None
            if not cycle.failed:
                landing = await self._start(cycle)
            await asyncio.sleep(0)

    async def _prepare(self, c: Cycle, after: Cycle | None, again: bool = False) -> None:
        """Screen, place and encode the submits; encode the completions (not when `again`)."""
        store, now = self.store, self.clock()
        try:
            if c.chunks:
                try:
                    c.ingest_plan = await run_steps_async(store.steps.ingest(
                        [it for ch, _ in c.chunks for it in ch], now, after is not None,
                        after.ingest_plan if after is not None else None))
                except StoreError as e:
                    c.refused = e
                await io_turn()
            if c.done and not again:
                c.complete_plan = await run_steps_async(
                    store.steps.complete([d for d, _ in c.done], now))
                await io_turn()
            if c.ops and not again:
                c.jobs_plan, c.complete_plan = store.steps.jobs(
                    [op for op, _ in c.ops], now, c.complete_plan)
        except BaseException as e:
            self._fail(c, e)
            if not isinstance(e, Exception):
                raise

    async def _start(self, c: Cycle) -> Cycle | None:
        """Stage the cycle and start its commit; None once it is over (nothing to commit,
        or it failed), else the cycle to finish."""
        try:
            if await self._begin(c):
                return c
        except BaseException as e:
            self._fail(c, e)
            if not isinstance(e, Exception):
                raise
            return None
        self._apply(c)  # nothing to write: rejects and duplicates only
        return None

    async def _begin(self, c: Cycle) -> bool:
        """Stage the plans (without a refused ingest) and start their commit; False when
        there is nothing to commit."""
        while True:
            try:
                staged = await run_steps_async(
                    self.store.steps.stage(c.ingest_plan, c.complete_plan, c.jobs_plan))
            except StoreError as e:
                if not c.refuse_ingest(e):
                    raise
                continue
            if staged is None:
                return False
            c.staged = staged
            if self.threaded:
                c.commit = asyncio.get_running_loop().run_in_executor(
                    self.thread, self.store.steps.finish, staged)
            else:
                c.commit = asyncio.get_running_loop().create_future()
                try:
                    c.commit.set_result(self.store.steps.finish(staged))
                except BaseException as e:
                    c.commit.set_exception(e)
            return True

    async def _finish(self, c: Cycle) -> None:
        """Wait for the cycle's commit (staging again after growing the map, or without a
        refused ingest), then apply and answer it."""
        store = self.store
        committed = False
        try:
            while c.commit is not None and c.staged is not None:
                try:
                    if await c.commit:
                        store.steps.committed(c.staged)
                        committed = True
                        break
                    store.steps.grow(c.staged)
                except StoreError as e:
                    if not c.refuse_ingest(e):
                        raise
                c.commit = None
                if not await self._begin(c):
                    break
        except BaseException as e:
            self._fail(c, e)
            if not isinstance(e, Exception):
                raise
            return
        if not committed:
            self._apply(c)
            return
        self.commits += 1
        await io_turn()
        if c.ingest_plan is not None:
            self.ingest_commits += bool(c.ingest_plan.admits)
            c.ingested = True
            # pulls waiting for work get each part of it as soon as it is dispatchable
            admitted = store.steps.apply_ingest(c.ingest_plan, self.clock())
            answer_chunks(c.chunks, await run_steps_async(admitted, self.on_commit),
                          c.ingest_plan.stored)
            if c.complete_plan is not None:
                await io_turn()
        if c.complete_plan is not None:
            self.complete_commits += 1
            c.answer_done(await run_steps_async(
                store.steps.apply_complete(c.complete_plan, self.clock())))
        if c.jobs_plan is not None:
            c.answer_ops(store.steps.apply_jobs(c.jobs_plan))
        self._settled(c)

    def _apply(self, c: Cycle) -> None:
        """Apply a cycle that wrote nothing (every item rejected, every batch late)."""
        store, now = self.store, self.clock()
        if c.ingest_plan is not None:
            answer_chunks(c.chunks, run_steps(store.steps.apply_ingest(c.ingest_plan, now)),
                          c.ingest_plan.stored)
        if c.complete_plan is not None:
            c.answer_done(run_steps(store.steps.apply_complete(c.complete_plan, now)))
        if c.jobs_plan is not None:
            c.answer_ops(store.steps.apply_jobs(c.jobs_plan))
        self._settled(c)

    def _settled(self, c: Cycle) -> None:
        if c.ingest_plan is None and c.chunks:
            fail_all([f for _, f in c.chunks], c.refused or StoreError("ingest refused"))
        self.intake.release(c)
        self.on_commit()

    def _fail(self, c: Cycle, e: BaseException) -> None:
        """The cycle failed: its completions are not settling any more, everyone hears why."""
        store, now = self.store, self.clock()
        if c.complete_plan is not None:
            store.steps.abort_complete(c.complete_plan, now)
        if c.jobs_plan is not None:
            store.steps.abort_jobs(c.jobs_plan)
        for (batch_id, _, _), _ in c.done:  # one whose consumer left: nobody else returns it
            f = store.view.inflight.get(batch_id)
            if (f is not None and batch_id not in store.view.settling
                    and f.batch.consumer not in store.view.consumers):
                store.fail(batch_id, now, "its completion could not be stored")
        c.failed = True
        fail_all([f for _, f in c.chunks], c.refused or e)
        fail_all([f for _, f in c.done], e)
        fail_all([f for _, f in c.ops], e)
        self.intake.release(c)
