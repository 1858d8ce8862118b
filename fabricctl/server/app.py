"""The broker daemon: an asyncio server over a Unix socket (and optionally TCP).

Contract: producers `Submit` chunks and get one `Ack` after the durable commit (group-committed
with other chunks); consumers `Register` their contract, `Heartbeat`, long-poll with `Pull`,
and settle batches with `Complete`/`Fail`; observers `Subscribe` to the stats stream or send
one-shot `Query`s. A consumer silent past the heartbeat timeout, or whose socket errors, is
disconnected and its batches go back to the front of their lanes at once. A malformed,
unknown or oversized frame gets an `Error` and closes that connection only. Pre-warm signals
are pushed to every consumer of the model before any batch of the warming shape is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabricctl import __version__
from fabricctl.core.broker import ShapeGuardError
from fabricctl.server import views
from fabricctl.server.config import ServerConfig
from fabricctl.server.connection import Connection
from fabricctl.server.handlers import Handlers
from fabricctl.server.metrics import Metrics
from fabricctl.server.peer import Peer
from fabricctl.server.wakeup import Wakeup
from fabricctl.server.writer import Writer
from fabricctl.store.durable import DurableBroker
from fabricctl.wire.protocol import (
    PROTOCOL_VERSION,
    Complete,
    Done,
    Error,
    Fail,
    Heartbeat,
    Hello,
    Pull,
    Query,
    Register,
    Shutdown,
    Submit,
    Subscribe,
    Welcome,
)

log = logging.getLogger("fabricctl.server")


class BrokerServer(Handlers):
    """Why: the one owner of the store; every client talks to it over a socket."""

    def __init__(
        self, store: DurableBroker, cfg: ServerConfig, clock: Callable[[], float] = time.time
    ) -> None:
        if cfg.listen and not cfg.token:
            raise ValueError("--listen needs a shared token (server.token in the config)")
        self.store = store
        self.core = store.core
        self.cfg = cfg
        self.clock = clock
        self.peers: set[Peer] = set()
        self.consumers: dict[str, Peer] = {}
        self.wakeup = Wakeup()
        self.metrics = Metrics(self)
        self.extra: dict[str, Callable[[], Any]] = {}  # snapshot extras: gpus, processes, ...
        self.started = clock()
        self.stopped = asyncio.Event()
        self._servers: list[asyncio.AbstractServer] = []
        self._tcp: asyncio.AbstractServer | None = None
        self._metrics: asyncio.AbstractServer | None = None
        self._stopping: asyncio.Task[None] | None = None
        self.on_fatal: Callable[[BaseException], None] = _stop_process
        self._tasks: list[asyncio.Task[None]] = []
        store.deferred = []  # quarantine results go through the writer too
        self.writer = Writer(store, clock, self._after_commit, cfg.commit_items,
                             cfg.complete_batches, cfg.commit_wait_s, cfg.writer_thread)

    # -- lifecycle ----------

    async def start(self) -> None:
        path = self.cfg.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # the data dir's lock proves no live broker owns it
        old = os.umask(0o177)
        try:
            srv = await loop.create_unix_server(lambda: Connection(self, "unix"), str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._servers.append(srv)
        if self.cfg.listen:
            host, _, port = self.cfg.listen.rpartition(":")
            self._tcp = await loop.create_server(lambda: Connection(self, "tcp"),
                                                 host or "127.0.0.1", int(port))
            self._servers.append(self._tcp)
        if self.cfg.metrics_port is not None:
            self._metrics = await self.metrics.serve(self.cfg.metrics_host,
                                                     self.cfg.metrics_port)
            self._servers.append(self._metrics)
        self.writer.start()
        self._tasks = [loop.create_task(self._ticker()), loop.create_task(self._watchdog())]
        log.info("broker listening on %s%s", path,
                 f" and tcp {self.cfg.listen}" if self.cfg.listen else "")

    def tcp_port(self) -> int | None:
        """The TCP listener's bound port (useful with `listen="HOST:0"`), or None."""
        return _bound_port(self._tcp)

    def metrics_port(self) -> int | None:
        """The Prometheus endpoint's bound port (useful with `metrics_port=0`), or None."""
        return _bound_port(self._metrics)

    async def stop(self) -> None:
        for srv in self._servers:
            srv.close()
        for t in self._tasks:
            t.cancel()
        await self.writer.stop()
        for peer in list(self.peers):
            self._drop(peer, "broker stopping")
        self.stopped.set()

    # -- connections ----------

    def _welcome(self, peer: Peer, hello: object) -> bool:
        if not isinstance(hello, Hello):
            peer.send(Error("no_hello", "the first frame must be Hello", fatal=True))
            return False
        if hello.version != PROTOCOL_VERSION:
            peer.send(Error("version", f"protocol {hello.version} unsupported; this broker "
                            f"speaks {PROTOCOL_VERSION}", fatal=True))
            return False
        if peer.transport_kind == "tcp" and not hmac.compare_digest(
                hello.token.encode(), self.cfg.token.encode()):
            peer.send(Error("auth", "wrong or missing token", fatal=True))
            log.warning("refused a tcp client with a wrong token")
            return False
        peer.role, peer.name = hello.role, hello.name
        return peer.send(Welcome(PROTOCOL_VERSION, f"fabricctl {__version__}",
                                 str(self.cfg.data_dir)))

    def _drop(self, peer: Peer, why: str, graceful: bool = False) -> None:
        if peer not in self.peers:
            return
        self.peers.discard(peer)
        peer.close(graceful)
        if peer.consumer is not None and self.consumers.get(peer.consumer) is peer:
            del self.consumers[peer.consumer]
            self._disconnect_consumer(peer.consumer, why)

    def _disconnect_consumer(self, name: str, why: str) -> None:
        # completions already received still count: those batches stay to be settled
        keep = self.writer.pending_batches()
        items = self.store.disconnect(name, self.clock(), why, keep)
        if items:
            log.warning("consumer %s lost (%s): %d items back to their lanes", name, why, items)
        self.wakeup.notify()

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

    def _dispatch(self, peer: Peer, frame: object) -> None:
        if isinstance(frame, Submit):
            self._spawn(peer, self._submit(peer, frame), frame.rid)
        elif isinstance(frame, Pull):  # answered at once when work waits, else long-polled
            t0 = time.perf_counter()  # not loop.time(): uvloop's counts whole milliseconds
            if not self._now(peer, lambda: self._try_pull(peer, frame, t0), frame.rid):
                self._spawn(peer, self._pull(peer, frame, t0), frame.rid)
        elif isinstance(frame, Complete):
            self._now(peer, lambda: self._complete(peer, frame), frame.rid)
        elif isinstance(frame, Heartbeat):
            peer.engine_stats = frame.stats
        elif isinstance(frame, Register):
            self._register(peer, frame)
        elif isinstance(frame, Fail):
            self._fail(peer, frame)
        elif isinstance(frame, Subscribe):
            self._spawn(peer, self._stream(peer, frame), frame.rid)
        elif isinstance(frame, Query):
            peer.send(views.answer(self, frame))
        elif isinstance(frame, Shutdown):
            peer.send(Done(frame.rid))
            self._stopping = asyncio.get_running_loop().create_task(self.stop())
        else:
            peer.send(Error("unexpected", f"{type(frame).__name__} is not a request",
                            fatal=True))
            peer.closed = True

    # -- observers ----------

    async def _stream(self, peer: Peer, frame: Subscribe) -> None:
        interval = max(0.05, min(frame.interval_s, 60.0))
        while not peer.closed:
            if not peer.send(views.stats_push(self, frame)):
                return
            await peer.drain()
            await asyncio.sleep(interval)

    # -- background ----------

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.tick_s)
            self.core.tick(self.clock())
            self._push_signals()
            self.wakeup.notify()

    async def _watchdog(self) -> None:
        """Drop consumers silent past the heartbeat timeout."""
        while True:
            await asyncio.sleep(min(self.cfg.heartbeat_s, self.cfg.heartbeat_timeout_s) / 2)
            now = self.clock()
            for peer in list(self.consumers.values()):
                if now - peer.last_seen > self.cfg.heartbeat_timeout_s:
                    log.warning("consumer %s silent for %.1f s: disconnecting", peer.consumer,
                                now - peer.last_seen)
                    self._drop(peer, "heartbeat timeout")


def _stop_process(e: BaseException) -> None:
    """The hard guard tripped: a poisoned prefix cache is worse than a restart."""
    log.critical("%s; stopping the broker process", e)
    logging.shutdown()
    os._exit(70)


def _bound_port(srv: asyncio.AbstractServer | None) -> int | None:
    for sock in getattr(srv, "sockets", None) or ():
        if sock.family.name.startswith("AF_INET"):
            return int(sock.getsockname()[1])
    return None


def data_dir_socket(data_dir: Path) -> Path:
    return Path(data_dir) / "broker.sock"
