"""Raw JSONL lines -> drafts or line errors: the reader's first stage, one line at a time.

Contract:
- `read_lines(fp)` reads a binary stream holding at most `max_line_bytes` + 2 bytes of any
  line in memory: a longer line is yielded cut (and refused), its rest read and dropped.
- `drafts(lines)` yields, in input order, a `Drafted(line_no, draft)` per good line and a
  `LineError(line_no, reason)` per bad one; it never raises for bad input, keeps nothing
  per line but the ids seen (a duplicate is refused; `formats.seen_ids`: the newest in RAM,
  the rest in a temporary LMDB), numbers lines from `first_line_no`,
  blank ones included, skips blank lines and a UTF-8 byte order mark on the first.
- A line longer than `max_line_bytes` (newline excluded) is refused before it is decoded.
- Each line's form is detected on its own: any of `custom_id`/`method`/`url`/`body` is an
  OpenAI batch request (`formats.openai_batch`), else any of `id`/`model`/`prompt`/
  `prefix`/`max_tokens` native (`formats.native`), else refused as of unknown format.
- A `LineError` says what could still be read of its line, so a caller can answer it in
  its own form: `openai` True (OpenAI batch), False (native) or None (too long, not
  UTF-8, not JSON, not an object, neither form); `id` its `custom_id` or `id` if a string.
A reason is one short sentence naming the field, e.g. "max_tokens must be at least 1".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import msgspec

from fabricctl.core.defaults import MAX_LINE_BYTES
from fabricctl.formats.common import Draft, Invalid, a_json_type
from fabricctl.formats.native import NATIVE_KEYS, parse_native
from fabricctl.formats.openai_batch import OPENAI_KEYS, parse_openai
from fabricctl.formats.seen_ids import SeenIds

_BOM = b"\xef\xbb\xbf"
_SKIP_CHUNK = 1 << 16


class LineError(msgspec.Struct, frozen=True):
    """Why: a bad line is reported with its number and reason while the rest goes in."""

    line_no: int
    reason: str
    openai: bool | None = None  # the line's form: OpenAI batch, native, or None: unknown
    id: str | None = None  # its custom_id (OpenAI) or id (native), when a string

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.reason}"


def read_lines(fp: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, each cut to at most `max_line_bytes` + 2 bytes.

    A longer line is yielded as its first `max_line_bytes + 2` bytes (so `parse_lines`
    refuses it as too long) and the rest is read in 64 KiB chunks and dropped.
    """
    limit = max_line_bytes + 2  # room for "\r\n" after a line of exactly the maximum
    while True:
        line = fp.readline(limit)
        if not line:
            return
        if len(line) == limit and not line.endswith(b"\n"):
            while True:
                rest = fp.readline(_SKIP_CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
        yield line


class Drafted(msgspec.Struct, gc=False):
    """Why: a valid line's draft keeps its line number until its item is built."""

    line_no: int
    draft: Draft


def drafts(lines: Iterable[bytes], max_line_bytes: int = MAX_LINE_BYTES,
           first_line_no: int = 1) -> Iterator[Drafted | LineError]:
    """Each line's draft or error, in input order (duplicate ids refused)."""
    seen = SeenIds()
    try:
        yield from _drafts(lines, max_line_bytes, first_line_no, seen)
    finally:
        seen.close()


def _drafts(lines: Iterable[bytes], max_line_bytes: int, first_line_no: int,
            seen: SeenIds) -> Iterator[Drafted | LineError]:
    for line_no, raw in enumerate(lines, first_line_no):
        line = raw.rstrip(b"\r\n")
        if line_no == first_line_no and line.startswith(_BOM):
            line = line[len(_BOM) :]
        if len(line) > max_line_bytes:
            yield LineError(line_no, f"line is longer than {max_line_bytes} bytes")
            continue
        if not line.strip():
            continue
        draft = _draft(line, line_no)
        if isinstance(draft, LineError):
            yield draft
            continue
        first = seen.first(draft.id)
        if first is not None:
            openai = draft.source.is_openai
            field = "custom_id" if openai else "id"
            yield LineError(line_no, f"{field} {draft.id!r} is a duplicate of line {first}",
                            openai, draft.id)
            continue
        seen.add(draft.id, line_no)
        yield Drafted(line_no, draft)

def _draft(line: bytes, line_no: int) -> Draft | LineError:
    """The draft of a line, or its error with what could be read of it (form, id)."""
    try:
        obj = _object(line)
    except Invalid as bad:
        return LineError(line_no, bad.reason)
    if any(k in obj for k in OPENAI_KEYS):
        parse, openai, key = parse_openai, True, "custom_id"
    elif any(k in obj for k in NATIVE_KEYS):
        parse, openai, key = parse_native, False, "id"
    else:
        return LineError(line_no, "line is neither a native item nor an OpenAI batch request")
    try:
        return parse(obj)
    except Invalid as bad:
        ident = obj.get(key)
        return LineError(line_no, bad.reason, openai, ident if isinstance(ident, str) else None)


def _object(line: bytes) -> dict[str, Any]:
    try:
        obj: Any = msgspec.json.decode(line)
    except UnicodeDecodeError:
        raise Invalid("line is not valid UTF-8") from None
    except msgspec.DecodeError as exc:
        if not _is_utf8(line):
            raise Invalid("line is not valid UTF-8") from None
        detail = str(exc).removeprefix("JSON is malformed: ")
        raise Invalid(f"line is not valid JSON: {detail[:1].lower()}{detail[1:]}") from None
    if not isinstance(obj, dict):
        raise Invalid(f"line must be a JSON object, not {a_json_type(obj)}")
    return obj


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
