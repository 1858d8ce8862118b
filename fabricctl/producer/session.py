"""A producer's session with a broker: open or attach a job, feed it, seal, cancel, follow.

Contract:
- `Producer.connect(address)` opens a producer connection (a data dir, a socket path, or
  `HOST:PORT` with `token`: `Client.connect`'s forms; no default, the library reads no
  configuration). `open_job(...)` opens a new job, or with `attach` (or `job=ID`) continues an
  earlier one (`Job.attached`); a `priority` given for an attached live job becomes its priority
  (`open_with_terms`), its window stays. A `Job` wraps any sink (the Batch API's backend).
- `Job.submit(lines, hooks=FeedHooks(...))` sends lines (bytes or str of JSONL, or dicts, each a
  native or OpenAI batch line) through `producer.feed.Feed` (every refused line counted and told
  to that call's hooks); called again, line numbers go on from the last call. An attached job's
  items go with `resume`: ids it already stored are skipped, not refused. `submit_file(path)`: the
  same for a file.
- Shapes where none is declared: `shapes="auto"` (the default, as `[producer] shapes`) gives each
  job a `formats.autoshape.ShapeFinder` cutting at `block_size` tokens, so a plain prompt gets the
  prefix it shares with earlier lines of its job; `"declared"` keeps the declared ones only.
- `Job.seal()` says the input ended; `Job.cancel()` withdraws its queued items (in-flight ones
  finish); both return the job's record. `Job.run(lines, hooks=..., write=...)` is the one
  orchestration of a job: follow, submit, seal, await every result.
- `Job.results()` yields each result of the job once, as the broker pushes them, until the job
  ends (`producer.follow.JobFollower`); `Job.follow(write)` is the same with a callback, returning
  the job's final record.
- Errors (`fabricctl.errors`): no broker or a lost one is `BackendMissing`, a refused request a
  `BrokerError`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, cast

import msgspec

from fabricctl.core.defaults import BLOCK_TOKENS, SHAPES
from fabricctl.core.jobs import JobRecord
from fabricctl.formats.autoshape import ShapeFinder, finder_for
from fabricctl.formats.reader import MAX_LINE_BYTES, read_lines
from fabricctl.formats.results import ResultRecord
from fabricctl.formats.tokens import TokenCounter
from fabricctl.producer.feed import NO_HOOKS, Feed, FeedHooks, Sink
from fabricctl.producer.follow import JobFollower, ResultSource
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import JobReply

_encode = msgspec.json.encode


async def open_with_terms(client: Client, kind: str, priority: int | None, **fields: Any
                          ) -> JobReply:
    """`open_job` with a priority: a new job's, or a live attached job's new one; an
    attached job keeps its window."""
    reply = await client.open_job(kind, priority=priority or 0, **fields)
    j = reply.job
    if reply.attached and priority is not None and priority != j.priority and not j.ended:
        reply = JobReply(reply.rid, (await client.set_job_priority(j.id, priority)).job,
                         attached=True)
    return reply


def file_digest(path: Path) -> tuple[str, int]:
    """sha256 and size of a file (read in 1 MiB blocks): a file submitted again joins its job.
    ("", 0) for a pipe or a device (`<(cmd)`): it can be read only once, so it joins none."""
    if not path.is_file():
        return "", 0
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest(), path.stat().st_size


def _as_line(line: bytes | str | dict[str, Any]) -> bytes:
    if isinstance(line, bytes):
        return line
    if isinstance(line, str):
        return line.encode()
    return _encode(line)


class JobSink(Sink, Protocol):
    """Why: a job needs the feed's two calls and `cancel_job`; a `Client` is one, and so is
    the Batch API's backend."""

    async def cancel_job(self, job: str) -> JobReply: ...


class Job:
    """Why: one job's calls for a producer (or the Batch API, whose sink is its backend),
    with the feed's running line count and the one orchestration of a job's input."""

    def __init__(self, client: JobSink, record: JobRecord, *, attached: bool = False,
                 finder: ShapeFinder | None = None, counter: TokenCounter | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.client, self.record, self.attached = client, record, attached
        self.counter, self.max_line_bytes = counter, max_line_bytes
        self.feed = Feed(client, record.number, resume=attached, finder=finder)

    @property
    def id(self) -> str:
        return self.record.id

    async def submit(self, lines: Iterable[bytes | str | dict[str, Any]], *,
                     hooks: FeedHooks = NO_HOOKS, position: Callable[[], int] | None = None
                     ) -> Feed:
        """Send `lines` into the job, telling `hooks` (this call's); the feed, with its
        running counts and refusals."""
        await self.feed.run((_as_line(x) for x in lines), hooks=hooks, counter=self.counter,
                            max_line_bytes=self.max_line_bytes, position=position)
        return self.feed

    async def submit_file(self, path: Path, *, hooks: FeedHooks = NO_HOOKS) -> Feed:
        """Send a JSONL file's lines into the job."""
        with path.open("rb") as fp:
            return await self.submit(read_lines(fp, self.max_line_bytes), hooks=hooks)

    async def seal(self, *, fail_empty: bool = False, lines: int | None = None) -> JobRecord:
        """The input ended (`Feed.seal`: `fail_empty`, `lines`)."""
        self.record = (await self.feed.seal(sealed_before=self.attached and self.record.sealed,
                                            fail_empty=fail_empty, lines=lines)).job
        return self.record

    async def run(self, lines: Iterable[bytes | str | dict[str, Any]], *,
                  hooks: FeedHooks = NO_HOOKS, position: Callable[[], int] | None = None,
                  write: Callable[[ResultRecord], object] | None = None,
                  timeout: float | None = None,
                  before_seal: Callable[[], Awaitable[object]] | None = None,
                  fail_empty: bool = False, line_count: int | None = None) -> JobRecord:
        """The one orchestration of a job's input: follow its results through `write` (when
        given: each once, from before the first line goes), submit `lines` (`hooks`),
        `before_seal()`, seal (`fail_empty`, `line_count`: `seal`'s), then await every
        result (`timeout` seconds at most after the seal: `TimeoutError`, the follower
        stopped); the job's record, final when followed."""
        collector = None
        if write is not None:
            follower = self.follower(write)
            collector = asyncio.ensure_future(follower.run())
        try:
            await self.submit(lines, hooks=hooks, position=position)
            if before_seal is not None:
                await before_seal()
            await self.seal(fail_empty=fail_empty, lines=line_count)
            if collector is not None:
                self.record = await asyncio.wait_for(asyncio.shield(collector), timeout)
            return self.record
        finally:
            if collector is not None:
                _settle(collector)

    async def cancel(self) -> JobRecord:
        self.record = (await self.client.cancel_job(self.record.id)).job
        return self.record

    def follower(self, write: Callable[[ResultRecord], object]) -> JobFollower:
        """The job's results through `write`, once each, once its `run()` is awaited."""
        return JobFollower(cast(ResultSource, self.client), self.record.id,
                           self.record.number, write)

    async def follow(self, write: Callable[[ResultRecord], object]) -> JobRecord:
        """Every result of the job through `write`, once each; the job's final record."""
        self.record = await self.follower(write).run()
        return self.record

    async def results(self) -> AsyncIterator[ResultRecord]:
        """Every result of the job, once each, until it has ended."""
        queue: asyncio.Queue[ResultRecord | None] = asyncio.Queue()

        async def follow() -> None:
            try:
                await self.follow(queue.put_nowait)
            finally:
                queue.put_nowait(None)

        task = asyncio.ensure_future(follow())
        try:
            while (rec := await queue.get()) is not None:
                yield rec
            await task  # its error, if it failed
        finally:
            if not task.done():
                task.cancel()


def _settle(task: asyncio.Future[Any]) -> None:
    """A task nobody waits for any more: cancelled, or its exception marked as seen (the
    error that matters was raised already), so asyncio logs nothing at exit."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


class Producer:
    """Why: a Python program feeding a broker needs jobs, flow control and results, not the
    CLI's layers: this is its one entry."""

    def __init__(self, client: Client, counter: TokenCounter | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES, shapes: str = SHAPES,
                 block_size: int = BLOCK_TOKENS) -> None:
        self.client, self.counter, self.max_line_bytes = client, counter, max_line_bytes
        finder_for(shapes, block_size)  # a bad value fails here, not at the first job
        self.shapes, self.block_size = shapes, block_size

    @classmethod
    async def connect(cls, address: str | Path, *, name: str = "fabricctl-producer",
                      counter: TokenCounter | None = None,
                      max_line_bytes: int = MAX_LINE_BYTES, shapes: str = SHAPES,
                      block_size: int = BLOCK_TOKENS, **connect: Any) -> Producer:
        """A producer connected to the broker at `address` (`connect`: `Client.connect`'s
        keywords, e.g. `token`, `tls`, `timeout`)."""
        finder_for(shapes, block_size)
        client = await Client.connect(address, "producer", name, **connect)
        return cls(client, counter, max_line_bytes, shapes, block_size)

    async def open_job(self, kind: str = "producer", *, name: str = "", sha256: str = "",
                       size: int = 0, priority: int | None = None, window_s: float = 0.0,
                       attach: bool = False, job: str = "") -> Job:
        """A new job (or, with `attach` or `job`, the earlier one to continue)."""
        reply = await open_with_terms(self.client, kind, priority, name=name, sha256=sha256,
                                      size=size, window_s=window_s,
                                      attach=attach or bool(job), job=job)
        return Job(self.client, reply.job, attached=reply.attached,
                   finder=finder_for(self.shapes, self.block_size), counter=self.counter,
                   max_line_bytes=self.max_line_bytes)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
