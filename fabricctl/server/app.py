"""The broker daemon: an asyncio server over a Unix socket (and optionally TCP).

Contract: producers `Submit` chunks and get one `Ack` after the durable (group) commit;
consumers `Register`, `Heartbeat`, long-poll with `Pull` and settle with `Complete`/`Fail`;
observers `Subscribe` to the stats stream or ask questions (`wire.queries`, one request type
each); producers follow results (`FollowResults`, pushed as stored: `server.streams`) and
open, seal, cancel and reprioritise jobs (answered by `JobReply` once durable); a job tick
(every `JOB_TICK_S`) commits the jobs' expiry and settling. A consumer silent past the
heartbeat timeout, or whose socket errors, is disconnected and its batches go back to the
front of their lanes at once. A malformed, unknown or oversized frame gets an `Error` and
closes that connection only. Pre-warm signals go to every consumer of the model before any
batch of the warming shape. A `Shutdown` (`fabricctl down`) is answered at once and sets
`stop_requested`: the owner stops as on SIGTERM (`server.drain`, then `stop()` closes the
sockets, the writer and the remaining peers); `stopped` is set once `stop()` is through.
Structure: `BrokerServer` holds one `ServerState` and composes the `Listeners`, the `Writer`
(group commit) and the `Handlers`, each given what it needs. It is the `Router` its
connections hand frames to (`welcome`, `dispatch`, `drop`). Writes go through the store's
steps, reads through its read-only view (`state.view`). A TCP listener without a shared
token is refused (`UsageError`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fabricctl import __version__
from fabricctl.core.broker import ShapeGuardError
from fabricctl.core.events import EventKind
from fabricctl.errors import UsageError
from fabricctl.server import views
from fabricctl.server.handlers import Handlers
from fabricctl.server.listeners import Listeners
from fabricctl.server.signals import push_signals
from fabricctl.server.state import ServerState
from fabricctl.server.streams import stop_stream, stream_results
from fabricctl.server.writer import Writer
from fabricctl.wire.protocol import (
    PROTOCOL_VERSION,
    CancelJob,
    Complete,
    Done,
    Error,
    Fail,
    Heartbeat,
    Hello,
    OpenJob,
    Pull,
    Register,
    SealJob,
    SetPriority,
    Shutdown,
    Submit,
    Subscribe,
    Welcome,
)
from fabricctl.wire.queries import QUERIES, FollowResults, StopFollow

if TYPE_CHECKING:
    from fabricctl.server.config import ServerConfig
    from fabricctl.server.peer import Peer
    from fabricctl.store.durable import DurableBroker

log = logging.getLogger("fabricctl.server")


class BrokerServer:
    """Why: the one owner of the store; every client talks to it over a socket."""

    def __init__(
        self, store: DurableBroker, cfg: ServerConfig, clock: Callable[[], float] = time.time
    ) -> None:
        if cfg.listen and not cfg.token:
            raise UsageError("--listen needs a shared token (server.token in the config)")
        self.writer = Writer(store, clock, self._after_commit, cfg.commit_items,
                             cfg.complete_batches, cfg.commit_wait_s, cfg.writer_thread)
        self.state = ServerState(store, cfg, clock, self.writer.pending_batches)
        self.stopped = asyncio.Event()
        self.stop_requested = asyncio.Event()  # a Shutdown came: the owner stops (fleet first)
        self.listeners = Listeners(self.state, self)
        self.on_fatal: Callable[[BaseException], None] = _stop_process
        self._tasks: list[asyncio.Task[None]] = []
        self.handlers = Handlers(self.state, self.writer, self.drop)

    @property
    def started(self) -> float:
        return self.state.started

    # -- lifecycle ----------

    async def start(self) -> None:
        await self.listeners.open()
        loop = asyncio.get_running_loop()
        self.writer.start()
        self._tasks = [loop.create_task(self._ticker()), loop.create_task(self._watchdog()),
                       loop.create_task(self._job_ticker())]
        cfg = self.state.cfg
        tcp = ""
        if cfg.listen:  # the bound port: the one to dial when `listen` asked for port 0
            host = cfg.listen.rpartition(":")[0] or "127.0.0.1"
            tcp = f" and {'tls' if cfg.tls_cert else 'tcp'} {host}:{self.tcp_port()}"
        log.info("broker listening on %s%s", cfg.socket_path, tcp)

    def tcp_port(self) -> int | None:
        """The TCP listener's bound port (useful with `listen="HOST:0"`), or None."""
        return self.listeners.tcp_port()

    def metrics_port(self) -> int | None:
        """The Prometheus endpoint's bound port (useful with `metrics_port=0`), or None."""
        return self.listeners.metrics_port()

    async def stop(self) -> None:
        self.listeners.close()
        for t in self._tasks:
            t.cancel()
        await self.writer.stop()
        for peer in list(self.state.peers):
            self.drop(peer, "broker stopping")
        self.stopped.set()

    def _after_commit(self) -> None:
        """A commit landed: new items are dispatchable, settled batches may switch shapes."""
        push_signals(self.state)
        self.state.wakeup.notify()

    # -- connections (the `Router` a `Connection` hands its frames to) ----------

    def welcome(self, peer: Peer, hello: object) -> bool:
        """Answer a connection's first frame; False: it is refused (and closed)."""
        if not isinstance(hello, Hello):
            peer.send(Error("no_hello", "the first frame must be Hello", fatal=True))
            return False
        if hello.version != PROTOCOL_VERSION:
            peer.send(Error("version", f"protocol {hello.version} unsupported; this broker "
                            f"speaks {PROTOCOL_VERSION}", fatal=True))
            return False
        if peer.transport_kind == "tcp" and not hmac.compare_digest(
                hello.token.encode(), self.state.cfg.token.encode()):
            peer.send(Error("auth", "wrong or missing token", fatal=True))
            log.warning("refused a tcp client with a wrong token")
            return False
        peer.role, peer.name = hello.role, hello.name
        return peer.send(Welcome(PROTOCOL_VERSION, f"fabricctl {__version__}",
                                 str(self.state.cfg.data_dir)))

    def drop(self, peer: Peer, why: str, graceful: bool = False) -> None:
        """Stop serving a peer; a consumer's batches go back (see `Handlers`)."""
        st = self.state
        if peer not in st.peers:
            return
        st.peers.discard(peer)
        peer.close(graceful)
        if peer.consumer is not None and st.consumers.get(peer.consumer) is peer:
            del st.consumers[peer.consumer]
            self.handlers.disconnect_consumer(peer.consumer, why)

    def _spawn(self, peer: Peer, coro: Any, rid: int) -> None:
        task = asyncio.get_running_loop().create_task(self._guarded(peer, coro, rid))
        peer.tasks.add(task)
        task.add_done_callback(peer.tasks.discard)

    async def _guarded(self, peer: Peer, coro: Any, rid: int) -> None:
        """Run one request; a failure answers it with an Error instead of leaving it hanging."""
        try:
            await coro
        except (ShapeGuardError, Exception) as e:
            self._failed(peer, rid, e)

    def _now(self, peer: Peer, fn: Callable[[], object], rid: int) -> object:
        """Run one request synchronously, as `_guarded` runs a task; True when answered."""
        try:
            return fn()
        except (ShapeGuardError, Exception) as e:
            self._failed(peer, rid, e)
        return True

    def _failed(self, peer: Peer, rid: int, e: BaseException) -> None:
        """A request failed: the hard guard stops the broker; anything else is answered."""
        if isinstance(e, ShapeGuardError):
            self.on_fatal(e)
            return
        log.error("request %d from %s failed", rid, peer.consumer or peer.name or "?",
                  exc_info=e)
        peer.send(Error("internal", f"{type(e).__name__}: {e}", rid))

    def dispatch(self, peer: Peer, frame: object) -> None:
        """Route one request frame of a welcomed peer to its handler."""
        h = self.handlers
        if isinstance(frame, Submit):
            self._spawn(peer, h.submit(peer, frame), frame.rid)
        elif isinstance(frame, Pull):  # answered at once when work waits, else long-polled
            t0 = time.perf_counter()  # not loop.time(): uvloop's counts whole milliseconds
            if not self._now(peer, lambda: h.try_pull(peer, frame, t0), frame.rid):
                self._spawn(peer, h.pull(peer, frame, t0), frame.rid)
        elif isinstance(frame, Complete):
            self._now(peer, lambda: h.complete(peer, frame), frame.rid)
        elif isinstance(frame, Heartbeat):
            peer.engine_stats = frame.stats
        elif isinstance(frame, Register):
            h.register(peer, frame)
        elif isinstance(frame, Fail):
            h.fail(peer, frame)
        elif isinstance(frame, Subscribe):
            self._spawn(peer, self._stream(peer, frame), frame.rid)
        elif isinstance(frame, QUERIES):  # a question: its one handler (`views.HANDLERS`)
            self._now(peer, lambda: peer.send(views.answer(self.state, frame)), frame.rid)
        elif isinstance(frame, FollowResults):
            self._spawn(peer, stream_results(self.state, peer, frame), frame.rid)
        elif isinstance(frame, StopFollow):
            stop_stream(peer, frame)
        elif isinstance(frame, OpenJob):
            self._spawn(peer, h.open_job(peer, frame), frame.rid)
        elif isinstance(frame, SealJob):
            self._spawn(peer, h.seal_job(peer, frame), frame.rid)
        elif isinstance(frame, CancelJob):
            self._spawn(peer, h.cancel_job(peer, frame), frame.rid)
        elif isinstance(frame, SetPriority):
            self._spawn(peer, h.set_priority(peer, frame), frame.rid)
        elif isinstance(frame, Shutdown):
            peer.send(Done(frame.rid))
            log.info("%s asked the broker to stop", peer.name or "a client")
            self.stop_requested.set()
        else:
            peer.send(Error("unexpected", f"{type(frame).__name__} is not a request",
                            fatal=True))
            peer.closed = True

    # -- observers ----------

    async def _stream(self, peer: Peer, frame: Subscribe) -> None:
        interval = max(0.05, min(frame.interval_s, 60.0))
        while not peer.closed:
            if not peer.send(views.stats_push(self.state, frame)):
                return
            await peer.drain()
            await asyncio.sleep(interval)

    # -- background ----------

    async def _ticker(self) -> None:
        st = self.state
        logged = st.view.events.seq  # events up to here were the previous run's or are known
        while True:
            await asyncio.sleep(st.cfg.tick_s)
            st.store.tick(st.clock())
            logged = self._log_warnings(logged)
            push_signals(st)
            st.wakeup.notify()

    def _log_warnings(self, since: int) -> int:
        """Log the events an operator must hear of without a dashboard (a job predicted to
        miss its window, a window given up); returns the last event seen."""
        events = self.state.view.events
        if events.seq == since:
            return since
        ids = self.state.live_job_ids()
        for e in events.since(since, limit=100_000):
            if e.kind is EventKind.JOB_AT_RISK:
                log.warning("job %s at risk: %s", ids.get(e.value, e.value), e.reason)
            elif e.kind is EventKind.JOB_HOPELESS:
                log.warning("job %s window out of reach: %s", ids.get(e.value, e.value),
                            e.reason)
        return events.seq

    async def _job_ticker(self) -> None:
        """The jobs' own tick, faster than the broker's: a finalizing job completes (and an
        expired window cancels) within `JOB_TICK_S`, so `submit --wait` and a batch's
        status do not wait a whole broker tick. Cheap: it looks at the live jobs only."""
        while True:
            await asyncio.sleep(min(JOB_TICK_S, self.state.cfg.tick_s))
            self.handlers.tick_jobs()

    async def _watchdog(self) -> None:
        """Drop consumers silent past the heartbeat timeout."""
        st = self.state
        while True:
            await asyncio.sleep(min(st.cfg.heartbeat_s, st.cfg.heartbeat_timeout_s) / 2)
            now = st.clock()
            for peer in list(st.consumers.values()):
                if now - peer.last_seen > st.cfg.heartbeat_timeout_s:
                    log.warning("consumer %s silent for %.1f s: disconnecting", peer.consumer,
                                now - peer.last_seen)
                    self.drop(peer, "heartbeat timeout")


JOB_TICK_S = 0.1


def _stop_process(e: BaseException) -> None:
    """The hard guard tripped: a poisoned prefix cache is worse than a restart."""
    log.critical("%s; stopping the broker process", e)
    logging.shutdown()
    os._exit(70)
