"""The one client the CLI, the dashboard and the consumers use to reach a broker.

Contract: `Client.connect(address, role)` opens a Unix socket (a path, or a data dir holding
`broker.sock`) or TCP (`HOST:PORT`, with a token) and exchanges Hello/Welcome. Requests are
matched to replies by request id, so a consumer can have pulls, completions and queries in
flight at once; pushes (pre-warm, stats) arrive on `pushes`. An error frame raises
`BrokerError` (an unknown or ambiguous job too); a lost connection fails every pending
request with `BackendMissing`, and only once, to the caller awaiting it: a request whose
write fails leaves no reply future behind with an unseen exception (no "Future exception was
never retrieved" at exit). With a `tls` context a TCP connection is TLS (`wire.tls`): a
certificate that does not verify, or a broker that does not speak TLS, is a `BrokerError`
with code "tls"; a refused token is code "auth" ("broker refused the token"); a plain TCP
connection closed before any answer (a TLS listener, most likely) is code "no_answer".
Jobs: `open_job` (-> `JobReply`), `submit(items, job, resume)`, `seal_job`, `cancel_job`,
`set_job_priority`, `jobs`, `job` (-> `JobView`) and `job_results` (-> `ResultRecord`s in
input order); `follow_results(job, since)` yields the `ResultsPush`es of a subscription.
Every question has its own typed method (`wire.queries`), none is named by a string.
`run_sync` runs one coroutine for synchronous callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec

from fabricctl.core.snapshot import Snapshot
from fabricctl.core.types import Contract, Item, ItemResult, Work
from fabricctl.errors import BackendMissing, BrokerError, ProtocolError
from fabricctl.wire.flow import WriteFlow
from fabricctl.wire.protocol import (
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    SOCKET_NAME,
    Ack,
    CancelJob,
    Complete,
    Done,
    Error,
    Fail,
    Frame,
    FrameReader,
    FrameTooLarge,
    Heartbeat,
    Hello,
    JobReply,
    OpenJob,
    PrewarmPush,
    Pull,
    Register,
    Registered,
    Role,
    SealJob,
    SetPriority,
    Shutdown,
    StatsPush,
    Submit,
    Subscribe,
    Welcome,
    WorkReply,
    encode,
)
from fabricctl.wire.queries import (
    FollowResults,
    ResultsPush,
    StopFollow,
)
from fabricctl.wire.questions import Questions
from fabricctl.wire.tls import handshake_error

T = TypeVar("T")
Q = TypeVar("Q")
_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)


def socket_path(address: str | Path) -> Path:
    """A data dir or a socket path -> the socket path."""
    p = Path(address)
    return p / SOCKET_NAME if p.is_dir() else p


def is_tcp(address: str | Path) -> bool:
    s = str(address)
    host, sep, port = s.rpartition(":")
    return bool(sep and host and port.isdigit() and "/" not in s)


class _Wire(WriteFlow):
    """Why: replies are matched to their requests in the callback that read them, with no
    reader task, so a reply reaches its waiter one event-loop turn sooner."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.frames = FrameReader(client._max_frame)
        self.received = 0  # bytes from the broker, all told

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            for frame in self.frames.feed(data):
                if not self.client._on_frame(frame):
                    break
        except (msgspec.DecodeError, msgspec.ValidationError, FrameTooLarge) as e:
            self.client._lost(ProtocolError("protocol", f"undecodable frame from the broker: {e}"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        self.client._lost(BackendMissing(f"the broker closed the connection{why}"))
        self.resume_writing()


class Client(Questions):
    """Why: one implementation of the wire, shared by every command, consumer and dashboard."""

    def __init__(self, max_frame: int) -> None:
        self._max_frame = max_frame
        self._rids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[Frame]] = {}  # FollowResults, by rid
        self._first: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._wire = _Wire(self)
        self._transport: asyncio.Transport | None = None
        self.pushes: asyncio.Queue[Frame] = asyncio.Queue()
        self.welcome: Welcome | None = None
        self.closed = asyncio.Event()
        self.closed_error: BaseException | None = None

    @classmethod
    async def connect(
        cls, address: str | Path, role: Role, name: str = "", token: str = "",
        max_frame: int = DEFAULT_MAX_FRAME, timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
    ) -> Client:
        """Connect and say Hello; `tls` (a `wire.tls.client_context`) wraps a TCP connection."""
        client = cls(max_frame)
        loop = asyncio.get_running_loop()
        tcp = is_tcp(address)
        try:
            if tcp:
                host, _, port = str(address).rpartition(":")
                conn = loop.create_connection(lambda: client._wire, host, int(port), ssl=tls)
            else:
                conn = loop.create_unix_connection(lambda: client._wire,
                                                   str(socket_path(address)))
            transport, _ = await asyncio.wait_for(conn, timeout)
        except (OSError, TimeoutError) as e:
            if tls is not None and (refused := handshake_error(e, str(address))) is not None:
                raise refused from e
            raise BackendMissing(f"no broker at {address}: {e.__class__.__name__}: {e}. "
                                 f"Start one with `fabricctl up`.") from e
        client._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        transport.write(encode(Hello(PROTOCOL_VERSION, role, name, token)))
        try:
            first = await asyncio.wait_for(asyncio.shield(client._first), timeout)
        except BackendMissing as e:
            transport.abort()
            if tcp and tls is None and not client._wire.received:  # closed without a word
                raise BrokerError("no_answer", f"the broker at {address} closed the connection "
                                  "without answering Hello: is it a TLS listener? (connect "
                                  "with --tls-ca FILE)") from e
            raise
        except BaseException:
            transport.abort()
            raise
        if isinstance(first, Error):
            transport.close()
            if first.code == "auth":
                raise BrokerError("auth", f"broker refused the token ({first.message}): give "
                                  "it with --token, FABRICCTL_TOKEN or server.token")
            raise BrokerError(first.code, first.message)
        if not isinstance(first, Welcome):
            transport.close()
            raise ProtocolError("protocol", f"expected Welcome, got {type(first).__name__}")
        client.welcome = first
        return client

    def _on_frame(self, frame: Frame) -> bool:
        """Route one frame from the broker; False when it ended the connection."""
        if not self._first.done():
            self._first.set_result(frame)
            return True
        rid = getattr(frame, "rid", 0)
        if isinstance(frame, PrewarmPush | StatsPush):
            self.pushes.put_nowait(frame)
        elif isinstance(frame, Error) and (frame.fatal or not rid):
            self._lost(BrokerError(frame.code, frame.message))
            return False
        elif rid in self._streams:  # a FollowResults stream's push, or the Error ending it
            self._streams[rid].put_nowait(frame)
        elif rid in self._waiting:
            fut = self._waiting.pop(rid)
            if not fut.done():
                if isinstance(frame, Error):
                    fut.set_exception(BrokerError(frame.code, frame.message))
                else:
                    fut.set_result(frame)
        return True

    def _lost(self, error: BaseException) -> None:
        """The connection ended: every pending request fails with `error` (the first cause)."""
        if self.closed.is_set():
            return
        self.closed_error = error
        if not self._first.done():
            self._first.set_exception(error)
            self._first.exception()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(error)
        self._waiting.clear()
        self.closed.set()
        if self._transport is not None:
            self._transport.close()

    def send(self, frame: Frame) -> None:
        if self.closed.is_set() or self._transport is None:
            raise self.closed_error or BackendMissing("connection closed")
        self._transport.write(encode(frame))

    async def request(self, build: Any) -> Any:
        """Send `build(rid)` and wait for the reply with that rid."""
        rid = next(self._rids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            self.send(build(rid))
            await self._drain()
        except BaseException:
            self._waiting.pop(rid, None)
            _settle(fut)
            raise
        return await fut

    async def _drain(self) -> None:
        """Wait for the socket to take what was written; a socket error is a lost broker."""
        await self._wire.drain()
        if self.closed.is_set():
            raise self.closed_error or BackendMissing("connection closed")

    # -- producers ----------
    async def submit(self, items: list[Item], job: int = 0, resume: bool = False) -> Ack:
        """Store items (in job number `job`; `resume`: ids already stored in that job are
        counted in `Ack.skipped`, not refused)."""
        return await self.request(lambda rid: Submit(rid, items, job, resume))

    # -- jobs ----------
    async def open_job(self, kind: str, name: str = "", sha256: str = "", size: int = 0,
                       endpoint: str = "", metadata: dict[str, str] | None = None,
                       window_s: float = 0.0, attach: bool = True, job: str = "",
                       validating: bool = False, priority: int = 0,
                       output_expires_s: int = 0) -> JobReply:
        """A new job, or the one to attach to (`job`: an id or unique prefix; else, with
        `attach`, the newest job of the same kind, name and sha256 still going or done).
        `window_s` (0: none), `priority` and `output_expires_s` (an API batch's output files'
        lifetime, 0: none) are a new job's; an attached one keeps its own."""
        return await self.request(lambda rid: OpenJob(
            rid, kind, name, sha256, size, endpoint, dict(metadata or {}), window_s, attach,
            job, validating, priority, output_expires_s))

    async def seal_job(self, job: int, lines: int, errors: list[str] | None = None,
                       failed: bool = False, sha256: str = "", refused: int = 0) -> JobReply:
        """The job's input ended after `lines` lines (`errors`: the refused lines' messages,
        `refused` how many more were refused; `failed`: refuse the whole job)."""
        return await self.request(lambda rid: SealJob(rid, job, lines, list(errors or []),
                                                      failed, sha256, refused))

    async def cancel_job(self, job: str) -> JobReply:
        """Cancel a job by id or unique prefix: queued items are cancelled, in-flight ones
        finish."""
        return await self.request(lambda rid: CancelJob(rid, job))

    async def set_job_priority(self, job: str, priority: int) -> JobReply:
        """Change a live job's priority (id or unique prefix); `BrokerError` for a job that
        ended (code `job_ended`), none, or a priority out of range."""
        return await self.request(lambda rid: SetPriority(rid, job, priority))

    async def follow_results(self, job: int = 0, since: int = -1
                             ) -> AsyncGenerator[ResultsPush, None]:
        """The results of job number `job` (0: every job) stored after sequence number
        `since` (-1: from the moment the broker reads the request), pushed as they are
        stored; the first push (rows or none) says where the stream starts, the last one
        carries the ended job's record. A lost connection raises `BackendMissing`: follow
        again from the last push's `seq` to miss nothing."""
        rid = next(self._rids)
        queue: asyncio.Queue[Frame] = asyncio.Queue()
        self._streams[rid] = queue
        ended = False
        try:
            self.send(FollowResults(rid, job, since))
            await self._drain()
            while True:
                push = await self._next(queue)
                if isinstance(push, Error):
                    ended = True
                    raise BrokerError(push.code, push.message)
                if not isinstance(push, ResultsPush):
                    continue
                ended = push.ended is not None
                yield push
                if ended:
                    return
        finally:
            self._streams.pop(rid, None)
            if not ended and not self.closed.is_set():  # stopped early: the broker stops too
                with contextlib.suppress(BackendMissing):
                    self.send(StopFollow(rid))

    # -- consumers ----------
    async def register(self, name: str, contract: Contract, gpu: int | None = None,
                       engine: str = "", simulated: bool = False) -> Registered:
        return await self.request(
            lambda rid: Register(rid, name, contract, gpu, engine, simulated))

    async def heartbeat(self, stats: dict[str, Any] | None = None) -> None:
        self.send(Heartbeat(stats or {}))
        await self._drain()

    async def pull(self, wait_s: float = 1.0) -> Work | None:
        reply: WorkReply = await self.request(lambda rid: Pull(rid, wait_s))
        return reply.work

    async def complete(self, batch: int, results: list[ItemResult],
                       cache: tuple[int, int, int] | None = None) -> int:
        """Settle a batch; `cache` is the engine's (queries, hits, achievable) tokens for it."""
        extra = list(cache) if cache else []
        done: Done = await self.request(lambda rid: Complete(rid, batch, results, extra))
        return done.stored

    async def fail(self, batch: int, reason: str) -> int:
        done: Done = await self.request(lambda rid: Fail(rid, batch, reason))
        return done.stored

    # -- observers ----------
    async def snapshots(self, interval_s: float = 1.0, lanes: list[tuple[str, int]] | None = None,
                        all_lanes: bool = False) -> AsyncIterator[Snapshot]:
        self.send(Subscribe(0, interval_s, lanes or [], all_lanes))
        while True:
            push = await self._next_push(StatsPush)
            yield _snapshot_decoder.decode(push.snapshot)

    async def _next_push(self, kind: type[T]) -> T:
        while True:
            frame = await self._next(self.pushes)
            if isinstance(frame, kind):
                return frame

    async def _next(self, queue: asyncio.Queue[Q]) -> Q:
        """The next frame of `queue`; `BackendMissing` (or the cause) once the connection
        is lost."""
        while True:
            get = asyncio.ensure_future(queue.get())
            closed = asyncio.ensure_future(self.closed.wait())
            done, _ = await asyncio.wait({get, closed}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                raise self.closed_error or BackendMissing("connection closed")
            closed.cancel()
            return get.result()

    async def shutdown(self) -> None:
        with contextlib.suppress(BackendMissing):
            await self.request(lambda rid: Shutdown(rid))

    async def close(self) -> None:
        self._lost(BackendMissing("the connection was closed by this client"))


def _settle(fut: asyncio.Future[Any]) -> None:
    """A reply future nobody will await: its exception (the lost connection that `_lost`
    set while the request was still being written) counts as seen, or it is cancelled,
    so asyncio logs no "Future exception was never retrieved" at exit."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()


def run_sync(coro: Awaitable[T]) -> T:
    """Run one coroutine to completion for a synchronous caller."""
    return asyncio.run(coro)  # type: ignore[arg-type]
