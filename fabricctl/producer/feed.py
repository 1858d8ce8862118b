"""The one submit pipeline: input lines read on a thread, sent into one job with flow control.

Contract:
- `Feed(sink, job, resume=...)` sends raw JSONL lines into job number `job` of a broker
  (`sink`: anything with `Client.submit`'s signature). `run(lines, counter=...)` starts a
  reader thread that parses the lines (`formats.reader.parse_lines`, token counts by
  `counter`) into `Chunk`s of at most `CHUNK` lines and hands them over through a queue of
  `QUEUED` chunks; the event loop sends each chunk's items as one Submit frame, with at most
  `IN_FLIGHT` awaiting their acks. Memory is bounded by these three constants, not by the
  input: what grows with it is the reader's set of ids seen (duplicates are refused).
  `fabricctl submit`, `fabricctl run` and the Batch API's feeder all run this pipeline.
- Every refused line, the reader's or the broker's, is counted in `refusals` (the first
  `MAX_ERRORS` messages kept, in line order, for the job's record) and passed to
  `on_refused` as `line N: reason`, once. `accepted` and `skipped` (stored in the job
  before: a `resume`) sum the acks; `lines` is the last input line read.
- Hooks, all called on the event loop, in input order: `prepare(chunk)` right before a
  chunk goes (it may take items out of `chunk.items`: they are not sent; `chunk.errors`
  are the reader's refusals among its lines, each a `formats.reader.LineError` with the
  line's form and id when they could be read); `on_ack(items, ack)` when its ack comes
  (`ack.rejects`: the broker's refusals, by index into `items`); `on_progress()` after
  each chunk read and each ack.
- The reader never outlives its feed: once the feed stops reading (done, or failed when the
  broker went away), the reader stops at its next hand-off, and nothing is left on a
  closing loop (no task pending, no coroutine unawaited). A send that fails fails the feed
  with that error after the sends in flight end; the first failure is the one raised.
- Shapes found where none is declared (`finder`, a `formats.autoshape.ShapeFinder`: one
  per feed, so per job, kept across its `run`s and fed every line in input order on the
  reader thread): None keeps each line's declared shape only.
- `seal(sink)` ends the job with the line count and the refusals (an attached job that was
  sealed before keeps its counts: its refusals were counted then).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fabricctl.core.jobs import MAX_ERRORS
from fabricctl.core.types import Item
from fabricctl.formats.autoshape import ShapeFinder
from fabricctl.formats.reader import MAX_LINE_BYTES, LineError, parse_lines
from fabricctl.formats.tokens import TokenCounter
from fabricctl.wire.protocol import Ack, JobReply

CHUNK = 512  # lines per Submit frame: big enough to amortise a commit, small on the wire
IN_FLIGHT = 4  # Submit frames awaiting their ack at once
QUEUED = 4  # parsed chunks waiting for a submit slot


class Sink(Protocol):
    """Why: the feed needs only these two broker calls, so a test can stand in for one."""

    async def submit(self, items: list[Item], job: int = 0, resume: bool = False) -> Ack: ...

    async def seal_job(self, job: int, lines: int, errors: list[str] | None = None,
                       failed: bool = False, sha256: str = "", refused: int = 0
                       ) -> JobReply: ...


@dataclass
class Chunk:
    """Why: one Submit frame's items (each knows its input line), plus the bad lines read."""

    items: list[Item] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    bytes_read: int = 0  # of the input so far, when the reader can tell (`position`)
    last_line: int = 0


@dataclass
class Refusals:
    """Why: every refused line counts, but a job's record keeps only the first few, in
    input order, whatever order the acks came back in."""

    count: int = 0
    _first: list[tuple[int, str]] = field(default_factory=list)  # max-heap on the line

    def add(self, line: int, message: str) -> None:
        self.count += 1
        if len(self._first) < MAX_ERRORS:
            heapq.heappush(self._first, (-line, message))
        elif -self._first[0][0] > line:
            heapq.heapreplace(self._first, (-line, message))

    def messages(self) -> list[str]:
        """The first `MAX_ERRORS` messages in line order."""
        return [m for _, m in sorted(self._first, reverse=True)]


class _Stopped(Exception):
    """Why: tells the reader thread that its feed stopped reading, so it stops too."""


def _handoff(queue: asyncio.Queue[Any], stop: threading.Event) -> Callable[[Any], None]:
    """The reader thread's `put`: waits for room in `queue` on the running loop; raises
    `_Stopped` once `stop` is set or the loop is gone, creating nothing on a loop that is
    closing (no coroutine left unawaited, no task left pending to be logged at exit)."""
    loop = asyncio.get_running_loop()

    def put(x: Chunk | BaseException | None) -> None:
        if stop.is_set():
            raise _Stopped
        coro = queue.put(x)
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise _Stopped from None
        try:
            fut.result()
        except BaseException:  # cancelled as the loop shut down
            raise _Stopped from None

    return put


def _read(lines: Iterable[bytes], counter: TokenCounter | None, max_line_bytes: int,
          first_line: int, position: Callable[[], int] | None,
          put: Callable[[Any], None], finder: ShapeFinder | None = None) -> None:
    """Reader thread: parse `lines` and `put` chunks, then None (or the exception)."""
    try:
        chunk = Chunk()
        for p in parse_lines(lines, counter=counter, max_line_bytes=max_line_bytes,
                             first_line_no=first_line, finder=finder):
            if isinstance(p, LineError):
                chunk.errors.append(p)
                chunk.last_line = p.line_no
            else:
                chunk.items.append(p.item)
                chunk.last_line = p.line_no
            if len(chunk.items) + len(chunk.errors) >= CHUNK:
                chunk.bytes_read = position() if position is not None else 0
                put(chunk)
                chunk = Chunk()
        chunk.bytes_read = position() if position is not None else 0
        put(chunk)
        put(None)
    except _Stopped:
        return  # the feed is over (it failed, e.g. the broker died): nobody reads on
    except BaseException as e:  # handed to the event loop, which re-raises it
        with contextlib.suppress(Exception):  # the loop may be gone already
            put(e)


class Feed:
    """Why: submit, run and the Batch API send input into a job the same way; this is it."""

    HOOKS = ("on_refused", "prepare", "on_ack", "on_progress")

    def __init__(self, sink: Sink, job: int, *, resume: bool = False,
                 on_refused: Callable[[str], object] | None = None,
                 prepare: Callable[[Chunk], object] | None = None,
                 on_ack: Callable[[list[Item], Ack], object] | None = None,
                 on_progress: Callable[[], object] | None = None,
                 finder: ShapeFinder | None = None) -> None:
        self.sink, self.job, self.resume = sink, job, resume
        self.finder = finder
        self.on_refused, self.prepare, self.on_ack = on_refused, prepare, on_ack
        self.on_progress = on_progress
        self.refusals = Refusals()
        self.accepted = self.skipped = self.lines = self.bytes_read = 0
        self.done = False  # every line read went in (or was refused)
        self.failure: BaseException | None = None

    def refuse(self, line: int, reason: str) -> None:
        message = f"line {line}: {reason}"
        self.refusals.add(line, message)
        if self.on_refused is not None:
            self.on_refused(message)

    async def run(self, lines: Iterable[bytes], *, counter: TokenCounter | None = None,
                  max_line_bytes: int = MAX_LINE_BYTES,
                  position: Callable[[], int] | None = None) -> None:
        """Send every line of `lines` (read on a thread of its own) into the job."""
        queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue(QUEUED)
        stop = threading.Event()  # set once this feed stops reading, failed or done
        threading.Thread(target=_read, args=(lines, counter, max_line_bytes, self.lines + 1,
                                             position, _handoff(queue, stop), self.finder),
                         daemon=True, name=f"fabricctl-feed-{self.job}").start()
        try:
            await self._send_all(queue)
        finally:
            stop.set()

    async def _send_all(self, queue: asyncio.Queue[Chunk | BaseException | None]) -> None:
        slots = asyncio.Semaphore(IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                got = await queue.get()
                if got is None:
                    break
                if isinstance(got, BaseException):
                    raise got
                self._check()
                for e in got.errors:
                    self.refuse(e.line_no, e.reason)
                # an input of a whole number of chunks ends with an empty one (last_line 0)
                self.lines = max(self.lines, got.last_line)
                self.bytes_read = max(self.bytes_read, got.bytes_read)
                self._tick()
                await slots.acquire()
                self._check()
                if self.prepare is not None:
                    self.prepare(got)
                if not got.items:
                    slots.release()
                    continue
                task = asyncio.ensure_future(self._send(got.items, slots))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)
        finally:
            for t in tasks:
                t.cancel()
        self._check()
        self.done = True
        self._tick()

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def _send(self, items: list[Item], slots: asyncio.Semaphore) -> None:
        try:
            ack = await self.sink.submit(items, job=self.job, resume=self.resume)
        except BaseException as e:
            self.failure = self.failure or e
            return
        finally:
            slots.release()
        for r in ack.rejects:
            self.refuse(items[r.index].line, r.reason)
        self.accepted += ack.accepted
        self.skipped += ack.skipped
        if self.on_ack is not None:
            self.on_ack(items, ack)
        self._tick()

    def _tick(self) -> None:
        if self.on_progress is not None:
            self.on_progress()

    async def seal(self, *, sealed_before: bool = False) -> JobReply:
        """Seal the job with what was read; `sealed_before`: an attached job already sealed
        once, whose refusals were counted then."""
        messages = [] if sealed_before else self.refusals.messages()
        refused = 0 if sealed_before else self.refusals.count - len(messages)
        return await self.sink.seal_job(self.job, self.lines, errors=messages, refused=refused)
