"""A batch's work in the broker: feeding its file in as items, and reading its output back.

Contract:
- `feed(backend, path, job, counter)` streams an uploaded file into its (validating) job:
  a reader thread parses it with `fabricctl.formats.reader.parse_stream` (the reader
  `submit` uses; at most `QUEUED` chunks of `CHUNK` items wait), each chunk goes in with
  `submit(items, job=...)`, and `seal_job` ends it with the refused lines' messages (a
  line the broker refused, a line the reader refused). Every item carries its input line.
  With `resume` (the daemon restarted while it fed) items the job already holds are
  skipped by the broker. A file with no request at all fails the job.
- `content(backend, job, which, path)` yields the output (`which="output"`: successful
  results) or error file (`"error"`: error results, then the requests cancelled or expired
  unrun as `batch_cancelled` / `batch_expired` lines, OpenAI's codes) in input-line order,
  each line in OpenAI batch output form (`fabricctl.formats.results.result_line`). It pages
  through `job_results` (`PAGE` records at a time) and, only when the job cancelled
  requests, walks the input file beside them for the custom_ids that have no result.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from fabricctl.api.backend import BatchBackend, line_of
from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import LENGTH_EXCEEDED, ResultRecord
from fabricctl.core.types import Item
from fabricctl.formats.reader import LineError, parse_stream
from fabricctl.formats.results import result_line
from fabricctl.formats.tokens import TokenCounter

CHUNK = 512
QUEUED = 4
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
    errors: list[str] = []
    accepted = 0
    while True:
        got = await queue.get()
        if got is None:
            break
        if isinstance(got, BaseException):
            raise got
        errors.extend(got.errors)
        if got.items:
            ack = await backend.submit(got.items, job=job.number, resume=resume)
            accepted += ack.accepted + ack.skipped
            errors.extend(f"line {got.items[r.index].line}: {r.reason}" for r in ack.rejects)
    if accepted == 0:
        errors = errors or ["the file has no requests"]
        return (await backend.seal_job(job.number, lines, errors=errors, failed=True)).job
    return (await backend.seal_job(job.number, lines, errors=errors)).job


# ---- output -------------------------------------------------------------------------------


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


class _CustomId(msgspec.Struct):
    """Why: reads only the custom_id of an input line."""

    custom_id: str = ""


_cid = msgspec.json.Decoder(_CustomId)
_enc = msgspec.json.Encoder()


def unrun_line(job: JobRecord, custom_id: str) -> bytes:
    if job.expired:
        err = _Unrun("batch_expired",
                     "This request could not be executed before the completion window expired.")
    else:
        err = _Unrun("batch_cancelled",
                     "This request could not be executed before the batch was cancelled.")
    h = xxhash.xxh3_128_hexdigest(f"{job.id}\x00{custom_id}".encode())
    return _enc.encode(_UnrunLine(f"batch_req_{h}", custom_id, None, err)) + b"\n"


def _input_ids(path: Path) -> Iterator[tuple[int, str]]:
    """(line, custom_id) of every request line of an input file, in order."""
    try:
        fp = open(path, "rb")  # noqa: SIM115 - closed by the generator
    except FileNotFoundError:
        return
    with fp:
        for n, raw in enumerate(fp, 1):
            if not raw.strip():
                continue
            if n == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            try:
                yield n, _cid.decode(raw).custom_id
            except msgspec.DecodeError:
                continue


async def content(backend: BatchBackend, job: JobRecord, which: str,
                  path: Path) -> AsyncIterator[bytes]:
    """The lines of a batch's output or error file, in input order (see the contract)."""
    want_errors = which == "error"
    unrun = want_errors and job.cancelled > 0
    inputs = _input_ids(path) if unrun else iter(())
    ahead = next(inputs, None)  # the next input request not yet accounted for
    after = 0
    while True:
        page = await backend.job_results(job.id, after_line=after, limit=PAGE)
        out = bytearray()
        for rec in page:
            line = line_of(rec)
            while ahead is not None and ahead[0] <= line:  # before this line: never ran
                if ahead[0] < line:
                    out += unrun_line(job, ahead[1])
                ahead = next(inputs, None)
            if is_error(rec) == want_errors:
                out += result_line(rec)
            after = max(after, line)
        if out:
            yield bytes(out)
        if len(page) < PAGE or not page or line_of(page[-1]) <= 0:
            break
    rest = bytearray()
    while ahead is not None:
        rest += unrun_line(job, ahead[1])
        if len(rest) > 1 << 16:
            yield bytes(rest)
            rest.clear()
        ahead = next(inputs, None)
    if rest:
        yield bytes(rest)
