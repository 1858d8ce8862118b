"""The OpenAI objects the Batch API answers with, and how a job and an upload map onto them.

Contract (pure: no I/O, no clock; every refusal an `ApiError` 400 in OpenAI's wording, its
param the field at fault):
- `parse_window("24h")` -> seconds (`<N>h`, `<N>m`, `<N>s`, N > 0 whole; `core.jobs`), param
  `completion_window`; `window_text(job)` writes it back.
- `parse_priority(metadata)`: the job's priority from the string `metadata["priority"]`
  (OpenAI has no priority field): 0 when absent, else 0..`MAX_PRIORITY`.
- `batch_object(job)` maps a `JobRecord` onto OpenAI's `Batch`: status the job's state,
  `*_at` the whole seconds it entered each (None if never), `request_counts.failed` =
  failed + cancelled + rejected (so `completed + failed == total` once ended), the output
  and error file ids (`output_file_id`, `error_file_id`, read back by `virtual_file`) once
  it ended with such lines, `model` (its first line's) and `usage` (`core.jobs.job_usage`:
  the sums over its successful results, exactly its output lines' usage).
- `parse_output_expires(value)`: `{"anchor": "created_at", "seconds": N}`, N in
  3600..2592000 -> N (None -> 0: never); the files expire at `output_expires_at(job)` (their
  creation, when the batch ended, + N) and are gone once `output_expired(job, now)`.
- `check_endpoint(endpoint)`: one of `ENDPOINTS` (every url the reader takes), else a 400
  (code `invalid_value`) naming them; `check_urls(endpoint, urls)`: every line's url names
  that endpoint (aliases count as their canonical one), else a 400 (code `mismatched_url`)
  naming the first line that does not.
- `job_errors(job)`: the job's "line N: reason" messages as `errors.data` with their `line`;
  `error_body` writes an `ApiError` as `{"error": {"message", "type", "param", "code"}}`.
What clients see: README.md, "The OpenAI Batch API".
"""

from __future__ import annotations

import re

import msgspec

from fabricctl.core import jobs as core_jobs
from fabricctl.core.jobs import WINDOW_UNITS as _UNIT
from fabricctl.core.jobs import JobRecord, JobState, JobUsage, job_usage
from fabricctl.core.records import URL_SOURCES
from fabricctl.core.terms import check_priority
from fabricctl.errors import ApiError
from fabricctl.formats.common import a_json_type
from fabricctl.store.files import FileRecord

# Every endpoint a batch may name: the urls an OpenAI batch line may name (the reader's),
# canonical ones first, then vLLM's short and v2 forms of score and rerank.
ENDPOINTS = tuple(URL_SOURCES)
ANCHOR = "created_at"  # the one anchor of `output_expires_after`: the file's creation
MIN_OUTPUT_EXPIRES_S, MAX_OUTPUT_EXPIRES_S = 3600, 2_592_000  # 1 hour .. 30 days
PRIORITY_KEY = "priority"  # the metadata key that sets a batch's priority
_LINE = re.compile(r"^line (\d+): (.*)$", re.S)
OUTPUT = "output"
ERROR = "error"


class ErrorInfo(msgspec.Struct):
    """Why: the inner object of OpenAI's error response."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    """Why: OpenAI's error response, which its SDK turns into `openai.APIStatusError`s."""

    error: ErrorInfo


def error_body(e: ApiError) -> bytes:
    return msgspec.json.encode(ErrorBody(ErrorInfo(e.message, e.type, e.param, e.code)))


def parse_window(text: object) -> float:
    """The completion window in seconds: "24h", "90m", "30s"."""
    try:
        return core_jobs.parse_window(text)
    except ValueError:
        raise ApiError(400, f"completion_window must be a whole number of hours, minutes or "
                       f"seconds such as \"24h\", \"90m\" or \"30s\", not {text!r}",
                       "completion_window", "invalid_value") from None


def parse_priority(metadata: dict[str, str]) -> int:
    """The batch's priority from its metadata (absent: 0)."""
    if PRIORITY_KEY not in metadata:
        return 0
    try:
        return check_priority(metadata[PRIORITY_KEY])
    except ValueError as e:
        raise ApiError(400, f"metadata.priority: {e}", f"metadata.{PRIORITY_KEY}",
                       "invalid_value") from None


def check_endpoint(endpoint: str) -> None:
    """Refuse an endpoint no batch line may name (see the contract)."""
    if endpoint not in URL_SOURCES:
        raise ApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}, not "
                       f"{endpoint!r}", "endpoint", "invalid_value")


def check_urls(endpoint: str, urls: dict[str, int]) -> None:
    """Refuse a file with a line for another endpoint than the batch's (see the contract)."""
    want = URL_SOURCES[endpoint]
    for url, line in sorted(urls.items(), key=lambda u: u[1]):
        if URL_SOURCES.get(url) is not want:
            raise ApiError(400, f"line {line}: url {url} does not match the batch's endpoint "
                           f"{endpoint}: every line of a batch must be for its endpoint",
                           "endpoint", "mismatched_url")


def window_text(job: JobRecord) -> str:
    if job.deadline is None:
        return "24h"
    seconds = round(job.deadline - job.created)
    for unit in ("h", "m"):
        if seconds % _UNIT[unit] == 0:
            return f"{seconds // _UNIT[unit]}{unit}"
    return f"{seconds}s"


class RequestCounts(msgspec.Struct):
    """Why: OpenAI's `BatchRequestCounts`."""

    total: int
    completed: int
    failed: int


class BatchError(msgspec.Struct):
    """Why: one entry of a batch's `errors.data`."""

    code: str | None
    line: int | None
    message: str
    param: str | None = None


class BatchErrors(msgspec.Struct):
    """Why: OpenAI's `errors` list object of a batch."""

    data: list[BatchError]
    object: str = "list"


class BatchObject(msgspec.Struct):
    """Why: OpenAI's `Batch` object, field for field."""

    id: str
    object: str
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    model: str | None = None
    usage: JobUsage | None = None


class FileObject(msgspec.Struct):
    """Why: OpenAI's `FileObject`."""

    id: str
    object: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class Deleted(msgspec.Struct):
    """Why: OpenAI's answer to a file delete."""

    id: str
    object: str = "file"
    deleted: bool = True


class ListPage(msgspec.Struct):
    """Why: OpenAI's cursor page (`first_id`, `last_id`, `has_more`), which the SDK pages by."""

    data: list[BatchObject] | list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"


def _at(job: JobRecord, state: JobState) -> int | None:
    t = job.times.get(state.value)
    return None if t is None else int(t)


def job_errors(job: JobRecord) -> BatchErrors | None:
    if not job.errors:
        return None
    data = []
    for text in job.errors:
        m = _LINE.match(text)
        if m:
            data.append(BatchError("invalid_request", int(m.group(1)), m.group(2)))
        else:
            data.append(BatchError("invalid_request", None, text))
    return BatchErrors(data)


def has_output(job: JobRecord) -> bool:
    return job.ended and job.completed > 0


def has_errors(job: JobRecord) -> bool:
    return job.ended and (job.failed + job.cancelled) > 0


def output_file_id(batch_id: str) -> str:
    return f"file-{batch_id}-{OUTPUT}"


def error_file_id(batch_id: str) -> str:
    return f"file-{batch_id}-{ERROR}"


def virtual_file(file_id: str) -> tuple[str, str] | None:
    """(batch id, "output" | "error") of a derived file id, or None for an upload's id."""
    if not file_id.startswith("file-batch_"):
        return None
    batch, _, which = file_id.removeprefix("file-").rpartition("-")
    return (batch, which) if batch and which in (OUTPUT, ERROR) else None


def batch_object(job: JobRecord) -> BatchObject:
    failed = job.failed + job.cancelled + job.rejected
    return BatchObject(
        id=job.id,
        object="batch",
        endpoint=job.endpoint,
        errors=job_errors(job),
        input_file_id=job.input_file_id or job.name,
        completion_window=window_text(job),
        status=job.state.value,
        output_file_id=output_file_id(job.id) if has_output(job) else None,
        error_file_id=error_file_id(job.id) if has_errors(job) else None,
        created_at=int(job.created),
        in_progress_at=_at(job, JobState.IN_PROGRESS),
        expires_at=None if job.deadline is None else int(job.deadline),
        finalizing_at=_at(job, JobState.FINALIZING),
        completed_at=_at(job, JobState.COMPLETED),
        failed_at=_at(job, JobState.FAILED),
        expired_at=_at(job, JobState.EXPIRED),
        cancelling_at=_at(job, JobState.CANCELLING),
        cancelled_at=_at(job, JobState.CANCELLED),
        request_counts=RequestCounts(job.total + job.rejected, job.completed, failed),
        metadata=job.metadata or None,
        model=job.model or None,
        usage=job_usage(job),
    )


def output_created_at(job: JobRecord) -> int:
    """When a batch's output and error files were created: when it ended."""
    return int(job.times.get(job.state.value, job.created))


def output_expires_at(job: JobRecord) -> int | None:
    """When its output and error files expire (`output_expires_after`), or None: never."""
    if not job.output_expires_s:
        return None
    return output_created_at(job) + job.output_expires_s


def output_expired(job: JobRecord, now: float) -> bool:
    """Whether its output and error files are gone: it ended and they expired by `now`."""
    at = output_expires_at(job)
    return job.ended and at is not None and now >= at


def parse_output_expires(value: object) -> int:
    """`output_expires_after` ({"anchor": "created_at", "seconds": N}) -> N; None -> 0."""
    if value is None:
        return 0
    name = "output_expires_after"
    if not isinstance(value, dict):
        raise ApiError(400, f"Invalid type for '{name}': expected an object, but got "
                       f"{_kind(value)} instead.", name, "invalid_type")
    for key in ("anchor", "seconds"):
        if key not in value:
            raise ApiError(400, f"Missing required parameter: '{name}.{key}'.",
                           f"{name}.{key}", "missing_required_parameter")
    extra = sorted(set(value) - {"anchor", "seconds"})
    if extra:
        raise ApiError(400, f"Unrecognized request argument supplied: {name}.{extra[0]}",
                       f"{name}.{extra[0]}", "unknown_parameter")
    anchor, seconds = value["anchor"], value["seconds"]
    if anchor != ANCHOR:
        raise ApiError(400, f"Invalid value: {anchor!r}. Supported values are: "
                       f"'{ANCHOR}'.", f"{name}.anchor", "invalid_value")
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise ApiError(400, f"Invalid type for '{name}.seconds': expected an integer, but "
                       f"got {_kind(seconds)} instead.", f"{name}.seconds", "invalid_type")
    if seconds < MIN_OUTPUT_EXPIRES_S:
        raise ApiError(400, f"Invalid '{name}.seconds': integer below minimum value. "
                       f"Expected a value >= {MIN_OUTPUT_EXPIRES_S}, but got {seconds} "
                       "instead.", f"{name}.seconds", "integer_below_min_value")
    if seconds > MAX_OUTPUT_EXPIRES_S:
        raise ApiError(400, f"Invalid '{name}.seconds': integer above maximum value. "
                       f"Expected a value <= {MAX_OUTPUT_EXPIRES_S}, but got {seconds} "
                       "instead.", f"{name}.seconds", "integer_above_max_value")
    return seconds


def _kind(value: object) -> str:
    """A JSON value's kind, as OpenAI's type errors name it (numbers told apart)."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, int) and not isinstance(value, bool):
        return "an integer"
    return a_json_type(value)


def file_object(rec: FileRecord) -> FileObject:
    return FileObject(id=rec.id, object="file", bytes=rec.bytes, created_at=rec.created_at,
                      filename=rec.filename, purpose=rec.purpose)


def virtual_file_object(job: JobRecord, which: str, size: int) -> FileObject:
    fid = output_file_id(job.id) if which == OUTPUT else error_file_id(job.id)
    return FileObject(id=fid, object="file", bytes=size, created_at=output_created_at(job),
                      filename=f"{job.id}_{which}.jsonl", purpose="batch_output",
                      expires_at=output_expires_at(job))


def page(items: list[BatchObject] | list[FileObject], ids: list[str], after: str | None,
         limit: int) -> ListPage:
    """The page of `limit` items after the one whose id is `after` (None: from the start)."""
    start = 0
    if after:
        if after not in ids:
            raise ApiError(400, f"after: no object with id {after!r}", "after")
        start = ids.index(after) + 1
    chunk = items[start:start + limit]
    chunk_ids = ids[start:start + limit]
    return ListPage(data=chunk, first_id=chunk_ids[0] if chunk_ids else None,
                    last_id=chunk_ids[-1] if chunk_ids else None,
                    has_more=start + limit < len(items))
