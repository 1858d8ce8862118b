"""A batch's work in the broker: feeding its file in as items, and reading its output back.

Contract:
- `feed(backend, path, job, counter)` streams an uploaded file into its (validating) job
  through `fabricctl.producer.Job.run`, the orchestration `submit` and `run` use, and seals it
  with the refused lines' first messages in line order (a line the broker refused, a line
  the reader refused) and their count. Every item carries its input line.
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

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import xxhash

from fabricctl.api.backend import BatchBackend
from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import LENGTH_EXCEEDED, ResultRecord
from fabricctl.formats.autoshape import ShapeFinder
from fabricctl.formats.reader import read_lines
from fabricctl.formats.results import result_line
from fabricctl.formats.tokens import TokenCounter
from fabricctl.producer.session import Job

PAGE = 1000


async def feed(backend: BatchBackend, path: Path, job: JobRecord, counter: TokenCounter,
               lines: int, resume: bool = False, finder: ShapeFinder | None = None
               ) -> JobRecord:
    """Feed the file at `path` (of `lines` lines) into `job`, then seal it; its record.
    `finder`: the job's shapes found where none is declared (None: declared only)."""
    run = Job(backend, job, attached=resume, finder=finder, counter=counter)
    with open(path, "rb") as fp:  # the one orchestration, with the Batch API's seal rule
        return await run.run(read_lines(fp), fail_empty=True, line_count=lines)


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
