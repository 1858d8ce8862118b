"""The broker's answers to producers and consumers: submit, register, pull, complete, fail.

Contract: a `Submit` is acknowledged only after the group commit that stored its accepted
items, with per-item rejects (its items join the frame's job; with `resume`, an id already
stored in that job is counted in `Ack.skipped`, not refused); `OpenJob`, `SealJob` and
`CancelJob` are answered with a `JobReply` once the writer committed the change (an attach
writes nothing), an unknown or ambiguous job with an `Error`; `SetPriority` too, refused
with `bad_priority` (out of 0..MAX_PRIORITY) or `job_ended` (the job ended: its priority no
longer matters); the tick's job operations (`tick_jobs`) go through the writer too; a
`Pull` long-polls up to its wait for a batch and the batch is handed back if the channel did
not take it; pre-warm pushes go out before any batch is sent; a `Complete` for a batch that
is not the caller's (late, duplicate, another consumer's) gets -1 and stores nothing; its
cache figures feed the shape's cache-truth audit; a consumer that is gone
(`disconnect_consumer`) gives its batches back, except those whose completion the writer
already holds. `BrokerServer` composes one `Handlers`, handing it the shared `ServerState`,
its writer and its `drop` (close a peer, disconnect its consumer)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fabricctl.core.jobs import JobRecord
from fabricctl.core.terms import check_priority
from fabricctl.errors import StoreError, StoreFullError
from fabricctl.server.departures import Departure
from fabricctl.server.signals import push_signals
from fabricctl.server.views import resolve_job
from fabricctl.store.jobs import CancelOp, FlushOp, JobOp, OpenOp, PriorityOp, SealOp
from fabricctl.store.placement import resume_skip
from fabricctl.wire.protocol import (
    Ack,
    CancelJob,
    Complete,
    Done,
    Error,
    Fail,
    JobReply,
    OpenJob,
    Pull,
    Register,
    Registered,
    Reject,
    SealJob,
    SetPriority,
    Submit,
    WorkReply,
)

if TYPE_CHECKING:
    from fabricctl.server.peer import Peer
    from fabricctl.server.state import ServerState
    from fabricctl.server.writer import Writer

log = logging.getLogger("fabricctl.server")


def _ticked(fut: asyncio.Future[JobRecord | str]) -> None:
    """A tick's job operation ended: a failure is logged (never left unretrieved)."""
    if not fut.cancelled() and (e := fut.exception()) is not None:
        log.error("a job operation of the tick failed: %s", e)


def _stored(r: Reject) -> bool:
    """A reject of an item already stored in its job (`resume_skip` skips it)."""
    return r.stored


class Handlers:
    """Why: what the broker does for producers and consumers, apart from connection plumbing."""

    def __init__(self, state: ServerState, writer: Writer,
                 drop: Callable[[Peer, str], None]) -> None:
        self.state = state
        self.writer = writer
        self._flushing = False  # a FlushOp is on its way to a commit
        self.drop = drop  # the server's: close a peer, and disconnect its consumer

    # -- producers ----------

    async def submit(self, peer: Peer, frame: Submit) -> None:
        job = frame.job
        for it in frame.items:  # the broker sets each item's job: the frame's
            it.job = job
        try:
            rejects = await self.writer.submit(frame.items)
        except StoreFullError as e:
            peer.send(Error("store_full", str(e), frame.rid))
            return
        except StoreError as e:
            peer.send(Error("store", str(e), frame.rid))
            return
        skipped = 0
        if frame.resume and rejects:
            rejects, skipped = resume_skip(rejects, _stored)
        accepted = len(frame.items) - len(rejects) - skipped
        self.state.metrics.submitted(accepted)
        peer.send(Ack(frame.rid, accepted, rejects, skipped))

    # -- jobs ----------

    def _resolve(self, ref: str, rid: int) -> int | Error:
        """The one job an id or unique prefix names, or the Error to answer."""
        return resolve_job(self.state, ref, rid)

    async def _job_op(self, peer: Peer, rid: int, op: JobOp, attached: bool = False,
                      refused: str = "not_found") -> None:
        """Run one job operation through the writer and answer it; a refusal (the store's
        message) is an `Error` of code `refused`."""
        try:
            got = await self.writer.job(op)
        except StoreFullError as e:
            peer.send(Error("store_full", str(e), rid))
            return
        except StoreError as e:
            peer.send(Error("store", str(e), rid))
            return
        if isinstance(got, str):
            peer.send(Error(refused, got, rid))
        else:
            peer.send(JobReply(rid, got, attached))

    async def open_job(self, peer: Peer, frame: OpenJob) -> None:
        """A new job once its record is durable, or one to attach to: the one `job` names,
        else (with `attach`) the newest job of the same kind, name and sha256 that is not
        cancelled, failed or expired (nothing is written for an attach)."""
        store = self.state.store
        number: int | None = None
        if frame.job:
            found = self._resolve(frame.job, frame.rid)
            if isinstance(found, Error):
                peer.send(found)
                return
            number = found
        elif frame.attach:
            number = store.attach_to(frame.kind, frame.name, frame.sha256)
        if number is not None:
            rec = store.job(number)
            if rec is not None:
                peer.send(JobReply(frame.rid, rec, True))
                return
        try:
            priority = check_priority(frame.priority)
        except ValueError as e:
            peer.send(Error("bad_priority", str(e), frame.rid))
            return
        await self._job_op(peer, frame.rid, OpenOp(
            frame.kind, frame.name, frame.sha256, frame.size, frame.endpoint,
            dict(frame.metadata), frame.window_s, frame.validating, priority=priority,
            output_expires_s=max(0, frame.output_expires_s)))

    async def seal_job(self, peer: Peer, frame: SealJob) -> None:
        if self.state.store.job(frame.job) is None:
            peer.send(Error("not_found", f"no job {frame.job}", frame.rid))
            return
        await self._job_op(peer, frame.rid, SealOp(frame.job, frame.lines, list(frame.errors),
                                                   frame.failed, frame.sha256, frame.refused))

    async def cancel_job(self, peer: Peer, frame: CancelJob) -> None:
        found = self._resolve(frame.job, frame.rid)
        if isinstance(found, Error):
            peer.send(found)
            return
        await self._job_op(peer, frame.rid, CancelOp(found))

    async def set_priority(self, peer: Peer, frame: SetPriority) -> None:
        """A live job's new priority; a job that ended keeps its record (`job_ended`)."""
        try:
            priority = check_priority(frame.priority)
        except ValueError as e:
            peer.send(Error("bad_priority", str(e), frame.rid))
            return
        found = self._resolve(frame.job, frame.rid)
        if isinstance(found, Error):
            peer.send(found)
            return
        await self._job_op(peer, frame.rid, PriorityOp(found, priority), refused="job_ended")

    def tick_jobs(self) -> None:
        """The tick's job operations (expiry, finalize, a cancel's leftovers), committed by
        the writer; nobody waits on them."""
        st = self.state
        ops: list[JobOp] = list(st.store.jobs_due(st.clock()))
        if not ops and not self._flushing and st.store.finished_waiting():
            ops.append(FlushOp())  # an idle broker still makes a finished shape's record durable
            self._flushing = True
        for op in ops:
            fut = self.writer.job(op)
            fut.add_done_callback(_ticked)
            if isinstance(op, FlushOp):
                fut.add_done_callback(self._flushed)

    def _flushed(self, fut: asyncio.Future[JobRecord | str]) -> None:
        self._flushing = False

    # -- consumers ----------

    def register(self, peer: Peer, frame: Register) -> None:
        st = self.state
        old = st.consumers.get(frame.name)
        if old is not None and old is not peer:
            self.drop(old, "replaced by a new registration")
        if peer.consumer is not None and peer.consumer != frame.name:
            # the connection re-registers under another name: the old one holds nothing
            if st.consumers.get(peer.consumer) is peer:
                del st.consumers[peer.consumer]
            self.disconnect_consumer(peer.consumer, f"re-registered as {frame.name}")
        now = st.clock()
        st.store.register(frame.name, frame.contract, now)
        peer.role, peer.consumer, peer.gpu = "consumer", frame.name, frame.gpu
        peer.engine, peer.simulated = frame.engine, frame.simulated
        st.consumers[frame.name] = peer
        peer.send(Registered(frame.rid, frame.name, st.cfg.heartbeat_s,
                             st.cfg.heartbeat_timeout_s))
        log.info("consumer %s joined: %s gpu=%s engine=%s", frame.name, frame.contract.model,
                 frame.gpu, frame.engine or "?")
        push_signals(st)
        st.wakeup.notify()

    def disconnect_consumer(self, name: str, why: str) -> None:
        """A consumer is gone: its batches go back, but not those whose completion the
        writer already received (they stay, to be settled; the log line counts them)."""
        st = self.state
        keep = self.writer.pending_batches()
        c = st.view.consumers.get(name)
        settling = len(c.batches & (st.view.settling | keep)) if c is not None else 0
        note = f"; {settling} answered batches settle" if settling else ""
        batches = len(c.batches) - settling if c is not None else 0
        items = st.store.disconnect(name, st.clock(), why, keep)
        if st.draining and items:  # the stop's report says it (`server.drain`)
            st.departures.append(Departure(name, why, batches, items, st.clock()))
        if items:
            log.warning("consumer %s lost (%s): %d items back to their lanes%s", name, why,
                        items, note)
        else:
            log.info("consumer %s left (%s), holding no batches%s", name, why, note)
        st.wakeup.notify()

    def try_pull(self, peer: Peer, frame: Pull, t0: float) -> bool:
        """One attempt at a pull; True when it was answered (a batch, or an error)."""
        name = peer.consumer
        if name is None:
            peer.send(Error("not_registered", "register before pulling", frame.rid))
            return True
        st = self.state
        if name not in st.view.consumers or peer.closed:
            return True  # dropped meanwhile: nobody to answer
        if st.draining:
            return False  # the stop's drain: consumers finish what they hold, take nothing
        store = st.store
        work = store.pull(name, st.clock())
        # quarantined entries: their error results, committed next
        for d in store.take_deferred():
            self.writer.enqueue_complete(d)
        push_signals(st)
        if work is None:
            return False
        st.metrics.pulled(time.perf_counter() - t0, work)
        if not peer.send(WorkReply(frame.rid, work)):
            store.fail(work.id, st.clock())  # the channel did not take it
            st.wakeup.notify()
        return True

    async def pull(self, peer: Peer, frame: Pull, t0: float) -> None:
        """A pull that found nothing at once: long-poll until its wait runs out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(frame.wait_s, 30.0)) - (time.perf_counter() - t0)
        wakeup = self.state.wakeup
        while not peer.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await wakeup.wait(remaining)
            if self.try_pull(peer, frame, t0):
                return
        peer.send(WorkReply(frame.rid, None))

    def complete(self, peer: Peer, frame: Complete) -> None:
        st = self.state
        c = st.view.consumers.get(peer.consumer or "")
        if c is None or frame.batch not in c.batches:
            peer.send(Done(frame.rid, -1))  # late, duplicate, or another consumer's batch
            return
        n = len(frame.results)
        if len(frame.cache) == 3:  # the cache-truth audit's evidence, while the batch is ours
            q, h, a = frame.cache
            st.store.record_cache(frame.batch, q, h, a, st.clock())
        consumer, rid = peer.consumer or "", frame.rid
        metrics = st.metrics

        def answer(fut: asyncio.Future[int]) -> None:  # no task per completion: a callback
            if fut.cancelled():
                return
            e = fut.exception()
            if e is not None:
                log.error("completion of batch %d from %s failed: %s", frame.batch, consumer, e)
                peer.send(Error("internal", f"{type(e).__name__}: {e}", rid))
                return
            stored = fut.result()
            metrics.completed(consumer, n, stored)
            peer.send(Done(rid, stored))

        self.writer.enqueue_complete((frame.batch, frame.results, peer.gpu)).add_done_callback(
            answer)

    def fail(self, peer: Peer, frame: Fail) -> None:
        st = self.state
        c = st.view.consumers.get(peer.consumer or "")
        ours = c is not None and frame.batch in c.batches
        if ours:
            st.store.fail(frame.batch, st.clock(), frame.reason)
            log.warning("batch %d failed on %s: %s", frame.batch, peer.consumer, frame.reason)
            st.wakeup.notify()
        peer.send(Done(frame.rid, 0 if ours else -1))
