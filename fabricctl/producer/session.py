"""A producer's session with a broker: open or attach a job, feed it, seal, cancel, follow.

Contract:
- `Producer.connect(address)` opens a producer connection (a data dir, a socket path, or
  `HOST:PORT` with `token`; `Client.connect`'s forms). `open_job(...)` opens a new job, or
  with `attach` (or `job=ID`) continues an earlier one (`Job.attached`); a `priority` given
  for an attached live job becomes its priority (`open_with_terms`), its window stays.
- `Job.submit(lines)` sends lines (bytes or str of JSONL, or dicts, each one native or
  OpenAI batch line) through the one submit pipeline (`producer.feed.Feed`: chunked, flow
  controlled, every refused line counted and reported). It may be called more than once:
  line numbers go on from the last call. An attached job's items go with `resume`: ids it
  already stored are skipped, not refused. `submit_file(path)` does the same for a file.
- Shapes where none is declared: `shapes="auto"` (the default, as `[producer] shapes`)
  gives each job a `formats.autoshape.ShapeFinder` cutting at `block_size` tokens, so a
  plain prompt gets the prefix it shares with earlier lines of its job; `"declared"`
  keeps only the shapes lines declare.
- `Job.seal()` says the input ended (nothing more joins the job); `Job.cancel()` withdraws
  its queued items (in-flight ones finish); both return the job's record.
- `Job.results()` yields every result of the job once each, as the broker stores them, and
  ends when the job has ended and every result was yielded (`producer.follow.JobFollower`;
  the results stored before the job was opened are never missed: the follower starts from
  the result count read before the open). `Job.follow(write)` is the same with a callback;
  it returns the job's final record.
- Errors are fabricctl's (`fabricctl.errors`): no broker or a lost one is `BackendMissing`,
  a refused request a `BrokerError`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from fabricctl.core.defaults import BLOCK_TOKENS, SHAPES
from fabricctl.core.jobs import JobRecord
from fabricctl.formats.autoshape import finder_for
from fabricctl.formats.reader import MAX_LINE_BYTES, read_lines
from fabricctl.formats.results import ResultRecord
from fabricctl.formats.tokens import TokenCounter
from fabricctl.producer.feed import Feed
from fabricctl.producer.follow import JobFollower, results_stored
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
    """sha256 and size of a file (read in 1 MiB blocks): a file submitted again joins its job."""
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


class Job:
    """Why: one job's calls for a producer, with the feed's running line count and the
    result sequence number its follower must start from."""

    def __init__(self, producer: Producer, reply: JobReply, since: int) -> None:
        self.producer, self.record, self.attached = producer, reply.job, reply.attached
        self.since = since
        self.feed = Feed(producer.client, self.record.number, resume=reply.attached,
                         finder=finder_for(producer.shapes, producer.block_size))

    @property
    def id(self) -> str:
        return self.record.id

    async def submit(self, lines: Iterable[bytes | str | dict[str, Any]], *,
                     position: Callable[[], int] | None = None, **hooks: Any) -> Feed:
        """Send `lines` into the job; the feed, with its running counts and refusals.
        `hooks`: the feed's (`on_refused`, `prepare`, `on_ack`, `on_progress`)."""
        for name, hook in hooks.items():
            if name not in Feed.HOOKS:
                raise TypeError(f"submit() got an unexpected keyword argument {name!r}")
            setattr(self.feed, name, hook)
        await self.feed.run((_as_line(x) for x in lines), counter=self.producer.counter,
                            max_line_bytes=self.producer.max_line_bytes, position=position)
        return self.feed

    async def submit_file(self, path: Path, **hooks: Any) -> Feed:
        """Send a JSONL file's lines into the job."""
        with path.open("rb") as fp:
            return await self.submit(read_lines(fp, self.producer.max_line_bytes), **hooks)

    async def seal(self) -> JobRecord:
        self.record = (await self.feed.seal(sealed_before=self.attached
                                            and self.record.sealed)).job
        return self.record

    async def cancel(self) -> JobRecord:
        self.record = (await self.producer.client.cancel_job(self.record.id)).job
        return self.record

    def follower(self, write: Callable[[ResultRecord], object]) -> JobFollower:
        """The job's results through `write`, once each, once its `run()` is awaited."""
        return JobFollower(self.producer.client, self.record.id, self.record.number, write,
                           since=self.since)

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
        since = await results_stored(self.client)  # before the open: no result of it is older
        reply = await open_with_terms(self.client, kind, priority, name=name, sha256=sha256,
                                      size=size, window_s=window_s,
                                      attach=attach or bool(job), job=job)
        return Job(self, reply, since)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
