"""What the broker stores per item's result, and where an item came from.

Contract: `ResultRecord` is the one result kept per item id (msgpack, array_like: new
fields go at the end with a default, so older records still decode); `make_record(item,
result, ...)` builds it from the item and its engine's `ItemResult`, with the engine's own
prompt count when it gave one, and the item's job and input line (results per job are read
in line order); `usage_of(record)` is what a result adds to its job's token usage.
`Source` (from `fabricctl.core.endpoints`) records which input form an item came in
(native, or the OpenAI endpoint its batch line named), because its result goes back out in
the same form (`fabricctl.formats.results`). Pure data: the store writes these, the
formats read them.
"""

from __future__ import annotations

import msgspec

from fabricctl.core.endpoints import URL_SOURCES, Source
from fabricctl.core.types import Item, ItemResult

__all__ = ["LENGTH_EXCEEDED", "URL_SOURCES", "ResultRecord", "Source", "make_record",
           "usage_of"]

LENGTH_EXCEEDED = "length_exceeded"
_SOURCES: dict[int, Source] = {int(s): s for s in Source}  # an enum call costs more than this


class ResultRecord(msgspec.Struct, array_like=True, gc=False):
    """Why: what the broker stores per item so either output form can be written later."""

    id: str
    model: str
    text: str = ""
    finish_reason: str | None = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    signature: int = 0
    lane: int = -1
    epoch: int = 0
    gpu: int | None = None
    error: str | None = None
    source: Source = Source.NATIVE
    created: int = 0  # unix seconds when the result was recorded
    response: bytes = b""  # the engine's response body (JSON) as it sent it, when kept
    status: int = 0  # the HTTP status of an engine's refusal (4xx), else 0
    job: int = 0  # the job its item belonged to (its number; 0: none)
    line: int = 0  # its item's input line within that job


def usage_of(rec: ResultRecord) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens a result adds to its job's usage: the engine's
    counts for a successful one (the one that goes to an output file), zeros for an error
    result, an engine's refusal, an item too long to send, or a request withdrawn unrun.
    For an OpenAI line the engine's counts are its body's usage (`prompt_tokens` or
    `input_tokens`, the cached tokens its details report, `completion_tokens` or
    `output_tokens`; a pooling body reports no output and, from vLLM, no cached tokens), so
    a job's sums are its output lines' sums."""
    if rec.error is not None or rec.status or rec.finish_reason == LENGTH_EXCEEDED:
        return 0, 0, 0
    return rec.prompt_tokens, rec.cached_tokens or 0, rec.completion_tokens


def make_record(
    item: Item,
    result: ItemResult,
    *,
    source: Source | int | None = None,
    lane: int = -1,
    epoch: int = 0,
    gpu: int | None = None,
    created: int = 0,
) -> ResultRecord:
    """The record of one item's result, with the item's own counts, shape and source.

    `source` defaults to `item.source`; a plain int is turned into a `Source`.
    """
    raw = item.source if source is None else source
    prompt = item.input_tokens if result.prompt_tokens is None else result.prompt_tokens
    # positional: this runs once per completed item, and keywords cost more
    return ResultRecord(
        item.id, item.model, result.text, result.finish_reason, prompt,
        result.tokens_out, result.cached_tokens, item.signature, lane, epoch, gpu,
        result.error, _SOURCES[raw] if raw in _SOURCES else Source(raw), created,
        result.body, result.status, item.job, item.line)
