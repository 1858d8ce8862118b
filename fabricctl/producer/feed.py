"""The one submit pipeline: input lines read on a thread, sent into one job with flow control.

Contract (`fabricctl submit`, `fabricctl run` and the Batch API's feeder all run it):
- `Feed(sink, job, resume=..., finder=...)` sends raw JSONL lines into job number `job` (`sink`:
  anything with `Client.submit`'s signature). `run(lines, hooks=..., counter=...)` starts a reader
  thread that parses them (`formats.reader`, tokens counted by `counter`) into `Chunk`s of at most
  `CHUNK` lines, handed over through a queue of `QUEUED` chunks; the event loop sends each chunk
  as one Submit frame, at most `IN_FLIGHT` awaiting their acks. Only the reader's set of ids seen
  (duplicates are refused) grows with the input.
- Every refused line, the reader's or the broker's, is counted in `refusals` (the first
  `MAX_ERRORS` messages kept in line order, for the job's record) and given to `on_refused` once,
  as `line N: reason`. `accepted` and `skipped` (stored in the job before: a `resume`) sum the
  acks; `lines` is the last input line read.
- `FeedHooks`, given to each `run` (never kept for a later one), are called on the event loop in
  input order: `prepare(chunk)` before a chunk goes (it may take items out of `chunk.items`;
  `chunk.errors` are the reader's `LineError`s), `on_ack(items, ack)` (`ack.rejects` index
  `items`), `on_progress()` after each chunk read and each ack.
- The reader never outlives its feed: once the feed stops reading (done, or failed), it stops at
  its next hand-off, and nothing is left on a closing loop. A failed send fails the feed with that
  error once the sends in flight end; the first failure is the one raised.
- `finder` (a `formats.autoshape.ShapeFinder`, one per feed, so per job, kept across its `run`s,
  fed every line in order on the reader thread) gives shapes to lines declaring none; None keeps
  the declared shapes only.
- `seal(sealed_before=..., fail_empty=...)` ends the job with the line count and the refusals.
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


@dataclass(frozen=True)
class FeedHooks:
    """Why: what a caller of one `Feed.run` hears of it, typed and given per call (never
    left on the feed for a later call)."""

    on_refused: Callable[[str], object] | None = None  # `line N: reason`, once per line
    prepare: Callable[[Chunk], object] | None = None  # right before a chunk goes
    on_ack: Callable[[list[Item], Ack], object] | None = None  # a chunk's ack came
    on_progress: Callable[[], object] | None = None  # after each chunk read and each ack


NO_HOOKS = FeedHooks()


class Feed:
    """Why: submit, run and the Batch API send input into a job the same way; this is it."""

    def __init__(self, sink: Sink, job: int, *, resume: bool = False,
                 finder: ShapeFinder | None = None) -> None:
        self.sink, self.job, self.resume = sink, job, resume
        self.finder = finder
        self.refusals = Refusals()
        self.accepted = self.skipped = self.lines = self.bytes_read = 0
        self.done = False  # every line read went in (or was refused)
        self.failure: BaseException | None = None

    def refuse(self, line: int, reason: str, hooks: FeedHooks = NO_HOOKS) -> None:
        message = f"line {line}: {reason}"
        self.refusals.add(line, message)
        if hooks.on_refused is not None:
            hooks.on_refused(message)

    async def run(self, lines: Iterable[bytes], *, hooks: FeedHooks = NO_HOOKS,
                  counter: TokenCounter | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                  position: Callable[[], int] | None = None) -> None:
        """Send every line of `lines` (read on a thread of its own) into the job, telling
        `hooks` (this call's only)."""
        queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue(QUEUED)
        stop = threading.Event()  # set once this feed stops reading, failed or done
        threading.Thread(target=_read, args=(lines, counter, max_line_bytes, self.lines + 1,
                                             position, _handoff(queue, stop), self.finder),
                         daemon=True, name=f"fabricctl-feed-{self.job}").start()
        try:
            await self._send_all(queue, hooks)
        finally:
            stop.set()

    async def _send_all(self, queue: asyncio.Queue[Chunk | BaseException | None],
                        hooks: FeedHooks) -> None:
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
                    self.refuse(e.line_no, e.reason, hooks)
                # an input of a whole number of chunks ends with an empty one (last_line 0)
                self.lines = max(self.lines, got.last_line)
                self.bytes_read = max(self.bytes_read, got.bytes_read)
                _tick(hooks)
                await slots.acquire()
                self._check()
                if hooks.prepare is not None:
                    hooks.prepare(got)
                if not got.items:
                    slots.release()
                    continue
                task = asyncio.ensure_future(self._send(got.items, slots, hooks))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)
        finally:
            for t in tasks:
                t.cancel()
        self._check()
        self.done = True
        _tick(hooks)

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def _send(self, items: list[Item], slots: asyncio.Semaphore, hooks: FeedHooks
                    ) -> None:
        try:
            ack = await self.sink.submit(items, job=self.job, resume=self.resume)
        except BaseException as e:
            self.failure = self.failure or e
            return
        finally:
            slots.release()
        for r in ack.rejects:
            self.refuse(items[r.index].line, r.reason, hooks)
        self.accepted += ack.accepted
        self.skipped += ack.skipped
        if hooks.on_ack is not None:
            hooks.on_ack(items, ack)
        _tick(hooks)

    async def seal(self, *, sealed_before: bool = False, fail_empty: bool = False,
                   lines: int | None = None) -> JobReply:
        """Seal the job with what was read (`lines`: the input's line count when the caller
        knows it better); `sealed_before`: an attached job already sealed once, whose
        refusals were counted then; `fail_empty`: an input that put no item in the job
        fails it (an API batch), with the refusals' messages, or "the file has no
        requests"."""
        count = self.lines if lines is None else lines
        if fail_empty and self.accepted + self.skipped == 0:
            messages = self.refusals.messages() or ["the file has no requests"]
            return await self.sink.seal_job(self.job, count, errors=messages, failed=True)
        messages = [] if sealed_before else self.refusals.messages()
        refused = 0 if sealed_before else self.refusals.count - len(messages)
        return await self.sink.seal_job(self.job, count, errors=messages, refused=refused)


def _tick(hooks: FeedHooks) -> None:
    if hooks.on_progress is not None:
        hooks.on_progress()
