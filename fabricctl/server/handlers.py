"""The broker's answers to producers and consumers: submit, register, pull, complete, fail.

Contract: a `Submit` is acknowledged only after the group commit that stored its accepted
items, with per-item rejects; a `Pull` long-polls up to its wait for a batch and the batch is
handed back if the channel did not take it; pre-warm pushes go out before any batch is sent;
a `Complete` for a batch that is not the caller's (late, duplicate, another consumer's) gets
-1 and stores nothing; its cache figures feed the shape's cache-truth audit. `BrokerServer`
inherits this and owns the state it uses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fabricctl.server import views
from fabricctl.server.peer import Peer
from fabricctl.server.writer import Writer
from fabricctl.store.errors import StoreError, StoreFullError
from fabricctl.wire.protocol import (
    Ack,
    Complete,
    Done,
    Error,
    Fail,
    Pull,
    Register,
    Registered,
    Submit,
    WorkReply,
)

if TYPE_CHECKING:
    from fabricctl.core.broker import Broker
    from fabricctl.server.config import ServerConfig
    from fabricctl.server.metrics import Metrics
    from fabricctl.server.wakeup import Wakeup
    from fabricctl.store.durable import DurableBroker

log = logging.getLogger("fabricctl.server")


class Handlers:
    """Why: what the broker does for producers and consumers, apart from connection plumbing."""

    store: DurableBroker
    core: Broker
    cfg: ServerConfig
    clock: Callable[[], float]
    consumers: dict[str, Peer]
    wakeup: Wakeup
    metrics: Metrics
    writer: Writer

    def _drop(self, peer: Peer, why: str, graceful: bool = False) -> None:
        raise NotImplementedError

    # -- producers ----------

    def _after_commit(self) -> None:
        """A commit landed: new items are dispatchable, settled batches may switch shapes."""
        self._push_signals()
        self.wakeup.notify()

    async def _submit(self, peer: Peer, frame: Submit) -> None:
        try:
            rejects = await self.writer.submit(frame.items)
        except StoreFullError as e:
            peer.send(Error("store_full", str(e), frame.rid))
            return
        except StoreError as e:
            peer.send(Error("store", str(e), frame.rid))
            return
        self.metrics.submitted(len(frame.items) - len(rejects))
        peer.send(Ack(frame.rid, len(frame.items) - len(rejects), rejects))

    # -- consumers ----------

    def _register(self, peer: Peer, frame: Register) -> None:
        old = self.consumers.get(frame.name)
        if old is not None and old is not peer:
            self._drop(old, "replaced by a new registration")
        if peer.consumer is not None and peer.consumer != frame.name:
            # the connection re-registers under another name: the old one holds nothing
            if self.consumers.get(peer.consumer) is peer:
                del self.consumers[peer.consumer]
            self._disconnect_consumer(peer.consumer, f"re-registered as {frame.name}")
        now = self.clock()
        self.core.register(frame.name, frame.contract, now)
        peer.role, peer.consumer, peer.gpu = "consumer", frame.name, frame.gpu
        peer.engine, peer.simulated = frame.engine, frame.simulated
        self.consumers[frame.name] = peer
        peer.send(Registered(frame.rid, frame.name, self.cfg.heartbeat_s,
                             self.cfg.heartbeat_timeout_s))
        log.info("consumer %s joined: %s gpu=%s engine=%s", frame.name, frame.contract.model,
                 frame.gpu, frame.engine or "?")
        self._push_signals()
        self.wakeup.notify()

    def _try_pull(self, peer: Peer, frame: Pull, t0: float) -> bool:
        """One attempt at a pull; True when it was answered (a batch, or an error)."""
        name = peer.consumer
        if name is None:
            peer.send(Error("not_registered", "register before pulling", frame.rid))
            return True
        if name not in self.core.consumers or peer.closed:
            return True  # dropped meanwhile: nobody to answer
        store = self.store
        work = store.pull(name, self.clock())
        if store.deferred:  # quarantined entries: their error results, committed next
            for d in store.deferred:
                self.writer.enqueue_complete(d)
            store.deferred.clear()
        self._push_signals()
        if work is None:
            return False
        self.metrics.pulled(time.perf_counter() - t0, work)
        if not peer.send(WorkReply(frame.rid, work)):
            store.fail(work.id, self.clock())  # the channel did not take it
            self.wakeup.notify()
        return True

    async def _pull(self, peer: Peer, frame: Pull, t0: float) -> None:
        """A pull that found nothing at once: long-poll until its wait runs out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(frame.wait_s, 30.0)) - (time.perf_counter() - t0)
        while not peer.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await self.wakeup.wait(remaining)
            if self._try_pull(peer, frame, t0):
                return
        peer.send(WorkReply(frame.rid, None))

    def _complete(self, peer: Peer, frame: Complete) -> None:
        c = self.core.consumers.get(peer.consumer or "")
        if c is None or frame.batch not in c.batches:
            peer.send(Done(frame.rid, -1))  # late, duplicate, or another consumer's batch
            return
        n = len(frame.results)
        if len(frame.cache) == 3:  # the cache-truth audit's evidence, while the batch is ours
            q, h, a = frame.cache
            self.core.record_cache(frame.batch, q, h, a, self.clock())
        consumer, rid = peer.consumer or "", frame.rid

        def answer(fut: asyncio.Future[int]) -> None:  # no task per completion: a callback
            if fut.cancelled():
                return
            e = fut.exception()
            if e is not None:
                log.error("completion of batch %d from %s failed: %s", frame.batch, consumer, e)
                peer.send(Error("internal", f"{type(e).__name__}: {e}", rid))
                return
            stored = fut.result()
            self.metrics.completed(consumer, n, stored)
            peer.send(Done(rid, stored))

        self.writer.enqueue_complete((frame.batch, frame.results, peer.gpu)).add_done_callback(
            answer)

    def _fail(self, peer: Peer, frame: Fail) -> None:
        c = self.core.consumers.get(peer.consumer or "")
        ours = c is not None and frame.batch in c.batches
        if ours:
            self.store.fail(frame.batch, self.clock(), frame.reason)
            log.warning("batch %d failed on %s: %s", frame.batch, peer.consumer, frame.reason)
            self.wakeup.notify()
        peer.send(Done(frame.rid, 0 if ours else -1))

    def _push_signals(self) -> None:
        for signal in self.core.take_signals():
            signal.sample = views.sample_item(self.store, signal.model, signal.signature)
            for peer in self.consumers.values():
                c = self.core.consumers.get(peer.consumer or "")
                if c is not None and c.contract.model == signal.model:
                    peer.send(views.prewarm_push(signal))

