"""A batch's work in the broker: feeding its file in as items, and reading its output back.

Contract:
- `feed(backend, path, job, counter)` streams an uploaded file into its (validating) job:
  a reader thread parses it with `fabricctl.formats.reader.parse_stream` (the reader
  `submit` uses; at most `QUEUED` chunks of `CHUNK` items wait), each chunk goes in with
  `submit(items, job=...)` (`IN_FLIGHT` awaiting their acks at once), and `seal_job` ends
  it with the refused lines' messages in line order (a line the broker refused, a line
  the reader refused). Every item carries its input line.
  With `resume` (the daemon restarted while it fed) items the job already holds are
  skipped by the broker. A file with no request at all fails the job.
- `content(backend, job, which)` yields the output (`which="output"`: successful results)
  or error file (`"error"`: error results, and the requests cancelled or expired unrun,
  which the store answers with a "cancelled" / "expired" record, as OpenAI's
  `batch_cancelled` / `batch_expired` lines) in input-line order, each result in OpenAI
  batch output form (`fabricctl.formats.results.result_line`). It pages through
  `job_results`, `PAGE` records at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from fabricctl.api.backend import BatchBackend
from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import LENGTH_EXCEEDED, ResultRecord
from fabricctl.core.types import Item
from fabricctl.formats.reader import LineError, parse_stream
from fabricctl.formats.results import result_line
from fabricctl.formats.tokens import TokenCounter

CHUNK = 512
QUEUED = 4  # parsed chunks waiting for a submit slot
IN_FLIGHT = 4  # submits awaiting their ack at once, as `submit` does
PAGE = 1000


@dataclass
class _Chunk:
    """Why: one Submit frame's items with their lines, plus the lines the reader refused."""

    items: list[Item] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    last_line: int = 0


def _read(path: Path, counter: TokenCounter, put: Any) -> None:
    try:
        with open(path, "rb") as fp:
            chunk = _Chunk()
            for p in parse_stream(fp, counter=counter):
                if isinstance(p, LineError):
                    chunk.errors.append(str(p))
                    chunk.last_line = p.line_no
                else:
                    p.item.line = p.line_no
                    chunk.items.append(p.item)
                    chunk.last_line = p.line_no
                if len(chunk.items) + len(chunk.errors) >= CHUNK:
                    put(chunk)
                    chunk = _Chunk()
            put(chunk)
        put(None)
    except BaseException as e:  # handed to the event loop, which re-raises it
        with contextlib.suppress(Exception):
            put(e)


async def feed(backend: BatchBackend, path: Path, job: JobRecord, counter: TokenCounter,
               lines: int, resume: bool = False) -> JobRecord:
    """Feed the file at `path` (of `lines` lines) into `job`, then seal it; its record."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[_Chunk | BaseException | None] = asyncio.Queue(QUEUED)

    def put(x: _Chunk | BaseException | None) -> None:
        asyncio.run_coroutine_threadsafe(queue.put(x), loop).result()

    threading.Thread(target=_read, args=(path, counter, put), daemon=True,
                     name=f"fabricctl-api-feed-{job.id}").start()
    errors: list[tuple[int, str]] = []  # (line, message): acks come back in any order
    accepted = 0
    slots = asyncio.Semaphore(IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()
    failure: list[BaseException] = []

    async def send(items: list[Item]) -> None:
        nonlocal accepted
        try:
            ack = await backend.submit(items, job=job.number, resume=resume)
        except BaseException as e:
            failure.append(e)
            return
        finally:
            slots.release()
        accepted += ack.accepted + ack.skipped
        errors.extend((items[r.index].line, r.reason) for r in ack.rejects)

    try:
        while not failure:
            got = await queue.get()
            if got is None:
                break
            if isinstance(got, BaseException):
                raise got
            errors.extend((_line_of(e), e) for e in got.errors)
            if got.items:
                await slots.acquire()
                task = loop.create_task(send(got.items))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(list(tasks))
    finally:
        for t in tasks:
            t.cancel()
    if failure:
        raise failure[0]
    messages = [m if m.startswith("line ") else f"line {n}: {m}" for n, m in sorted(errors)]
    if accepted == 0:
        messages = messages or ["the file has no requests"]
        return (await backend.seal_job(job.number, lines, errors=messages, failed=True)).job
    return (await backend.seal_job(job.number, lines, errors=messages)).job


def _line_of(message: str) -> int:
    """The N of a reader's "line N: reason"."""
    head = message.removeprefix("line ").partition(":")[0]
    return int(head) if head.isdigit() else 0


# ---- output -------------------------------------------------------------------------------

# The store answers a request withdrawn unrun with a record whose finish_reason (and error)
# says why; OpenAI writes such a request to the error file with these codes.
_UNRUN = {
    "cancelled": ("batch_cancelled",
                  "This request could not be executed before the batch was cancelled."),
    "expired": ("batch_expired",
                "This request could not be executed before the completion window expired."),
}


def unrun_code(rec: ResultRecord) -> str | None:
    """`batch_cancelled` / `batch_expired` for a request withdrawn before it ran, else None."""
    if rec.finish_reason in _UNRUN and rec.error == rec.finish_reason and not rec.response:
        return _UNRUN[rec.finish_reason][0]
    return None


def is_error(rec: ResultRecord) -> bool:
    return rec.error is not None or rec.status != 0 or rec.finish_reason == LENGTH_EXCEEDED


class _Unrun(msgspec.Struct):
    """Why: the error of a request cancelled or expired before it ran, as OpenAI writes it."""

    code: str
    message: str


class _UnrunLine(msgspec.Struct):
    """Why: OpenAI's error-file line for a request that never ran."""

    id: str
    custom_id: str
    response: None
    error: _Unrun


_enc = msgspec.json.Encoder()


def unrun_line(rec: ResultRecord) -> bytes:
    code, message = _UNRUN[rec.finish_reason or ""]
    h = xxhash.xxh3_128_hexdigest(f"{rec.id}\x00{rec.created}".encode())
    return _enc.encode(_UnrunLine(f"batch_req_{h}", rec.id, None, _Unrun(code, message))) + b"\n"


async def content(backend: BatchBackend, job: JobRecord, which: str) -> AsyncIterator[bytes]:
    """The lines of a batch's output or error file, in input order (see the contract)."""
    want_errors = which == "error"
    after = 0
    while True:
        page = await backend.job_results(job.id, after_line=after, limit=PAGE)
        out = bytearray()
        for rec in page:
            if unrun_code(rec) is not None:
                if want_errors:
                    out += unrun_line(rec)
            elif is_error(rec) == want_errors:
                out += result_line(rec)
        if out:
            yield bytes(out)
        if len(page) < PAGE or page[-1].line <= after:
            break
        after = page[-1].line
