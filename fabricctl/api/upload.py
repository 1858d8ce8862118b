"""A file upload, streamed: multipart parsed as it arrives, each line checked as it completes.

Contract:
- `LineChecker` takes the file's bytes in chunks of any size (`feed`, then `end`) and checks
  every line as an OpenAI batch request (`fabricctl.formats.openai_batch.parse_openai`, the
  same rules `submit` applies): a JSON object with `custom_id`, `method` POST, `url` one the
  reader takes (completions, chat, embeddings, score, rerank, responses, and vLLM's short
  forms), `body` that endpoint's request with a `model`; `custom_id` unique in the file.
  `urls` maps each url the file names to its first line (a batch's endpoint must match them
  all). Lines are numbered from 1, blank ones included and skipped; CRLF and a BOM on the
  first line are accepted. It holds at most one line (a line longer than `max_line_bytes`
  is refused without being held) plus one 8-byte hash (xxh3-64) per custom_id:
  `duplicate(path)`, once the file is whole, finds the hashes seen twice and only then reads
  the file again for those ids, comparing them exactly (a hash collision is no duplicate),
  to name the line and the line it repeats. `error` is the first refusal ("line N: reason")
  of the streaming checks.
- `receive_upload(stream, content_type, sink_path)` reads a multipart/form-data body
  from an async byte stream through python-multipart's streaming parser: the `file` part
  goes through a `LineChecker`, a sha256 and into `sink_path` as it arrives (memory: one
  chunk, one line, 8 bytes per request); small fields (`purpose`) are kept up to 1 KiB. After
  the first bad line the rest of the body is read and dropped unchecked; a file that passed
  is then checked for duplicate custom_ids. Returns an `Upload`; the caller
  decides (purpose, error) and keeps or removes the file. A body that is not multipart, or
  lacks a `file` part, raises `ApiError` (400).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import xxhash
from python_multipart.multipart import MultipartParser, parse_options_header

from fabricctl.errors import ApiError
from fabricctl.formats.common import Invalid, a_json_type
from fabricctl.formats.openai_batch import parse_openai
from fabricctl.formats.reader import MAX_LINE_BYTES

_BOM = b"\xef\xbb\xbf"
_FIELD_MAX = 1024
_BUCKETS = 64  # the hashes of custom_ids, spread so each set built to check one is small
_decode = msgspec.json.decode


class _CustomId(msgspec.Struct):
    """Why: reads only the custom_id of a line that already passed the checks."""

    custom_id: str = ""


_cid = msgspec.json.Decoder(_CustomId)


class LineChecker:
    """Why: a 1 GB upload is checked line by line as it streams, never held whole."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.lines = 0  # complete lines seen, blank ones included
        self.requests = 0
        self.urls: dict[str, int] = {}
        self.error: str | None = None
        self._buf = bytearray()
        self._overlong = False  # the line being read is past the limit: drop until "\n"
        self._hashes = [array("Q") for _ in range(_BUCKETS)]

    def feed(self, data: bytes) -> None:
        if self.error is not None:
            return
        start = 0
        while self.error is None:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._hold(data[start:])
                return
            self._hold(data[start:nl])
            self._line()
            start = nl + 1

    def end(self) -> None:
        """The file ended: a last line without its newline is a line too."""
        if self.error is None and (self._buf or self._overlong):
            self._line()

    def _hold(self, part: bytes) -> None:
        if self._overlong:
            return
        if len(self._buf) + len(part) > self.max_line_bytes + 1:  # +1: a "\r" before "\n"
            self._overlong = True
            self._buf.clear()
            return
        self._buf += part

    def _line(self) -> None:
        self.lines += 1
        n = self.lines
        if self._overlong:
            self._overlong = False
            self.error = f"line {n}: line is longer than {self.max_line_bytes} bytes"
            return
        line = bytes(self._buf).rstrip(b"\r")
        self._buf.clear()
        if n == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        if not line.strip():
            return
        reason = self._check(line, n)
        if reason is not None:
            self.error = f"line {n}: {reason}"

    def _check(self, line: bytes, n: int) -> str | None:
        try:
            obj: Any = _decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return "line is not valid JSON (the file must be JSONL: one JSON object a line)"
        if not isinstance(obj, dict):
            return f"line must be a JSON object, not {a_json_type(obj)}"
        try:
            draft = parse_openai(obj)
        except Invalid as bad:
            return bad.reason
        key = xxhash.xxh3_64_intdigest(draft.id.encode())
        self._hashes[key % _BUCKETS].append(key)
        self.urls.setdefault(obj["url"], n)
        self.requests += 1
        return None


    def duplicate(self, path: Path) -> str | None:
        """After the file passed: "line N: custom_id ... is a duplicate of line M", or None."""
        twice: set[int] = set()
        for bucket in self._hashes:
            seen: set[int] = set()
            for h in bucket:
                if h in seen:
                    twice.add(h)
                seen.add(h)
        if not twice:
            return None
        first: dict[str, int] = {}
        with open(path, "rb") as fp:
            for n, raw in enumerate(fp, 1):
                if not raw.strip():
                    continue
                cid = _cid.decode(raw.removeprefix(_BOM) if n == 1 else raw).custom_id
                if xxhash.xxh3_64_intdigest(cid.encode()) not in twice:
                    continue
                if cid in first:
                    return f"line {n}: custom_id {cid!r} is a duplicate of line {first[cid]}"
                first[cid] = n
        return None  # only a hash collision: the ids differ


@dataclass
class Upload:
    """Why: what one multipart upload brought: its fields, and what its file part was."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str = ""
    size: int = 0
    sha256: str = ""
    has_file: bool = False
    checker: LineChecker = field(default_factory=LineChecker)


class _Parts:
    """Why: python-multipart calls back per piece; this routes each piece to its part."""

    def __init__(self, up: Upload, sink: Any) -> None:
        self.up, self.sink = up, sink
        self.hash = hashlib.sha256()
        self.name = self.filename = ""
        self.value = bytearray()
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.headers: dict[str, bytes] = {}
        self.in_file = False

    def callbacks(self) -> Any:  # python-multipart's MultipartCallbacks (a TypedDict)
        return {
            "on_part_begin": self.part_begin,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
            "on_header_field": lambda d, s, e: self.header_field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self.header_value.extend(d[s:e]),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
        }

    def part_begin(self) -> None:
        self.headers.clear()
        self.value.clear()
        self.name = self.filename = ""
        self.in_file = False

    def header_end(self) -> None:
        self.headers[bytes(self.header_field).decode("latin-1").lower()] = bytes(
            self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def headers_finished(self) -> None:
        _, opts = parse_options_header(self.headers.get("content-disposition", b""))
        self.name = opts.get(b"name", b"").decode("utf-8", "replace")
        filename = opts.get(b"filename")
        if self.name == "file" and not self.up.has_file:
            self.in_file = True
            self.up.has_file = True
            self.up.filename = (filename or b"upload.jsonl").decode("utf-8", "replace")

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self.in_file:
            piece = data[start:end]
            self.up.size += len(piece)
            self.hash.update(piece)
            self.up.checker.feed(piece)
            if self.up.checker.error is None:  # a refused file is not kept: stop writing it
                self.sink.write(piece)
        elif len(self.value) < _FIELD_MAX:
            self.value.extend(data[start:min(end, start + _FIELD_MAX - len(self.value))])

    def part_end(self) -> None:
        if self.in_file:
            self.up.checker.end()
            self.up.sha256 = self.hash.hexdigest()
            self.in_file = False
        elif self.name:
            self.up.fields[self.name] = bytes(self.value).decode("utf-8", "replace")


async def receive_upload(stream: AsyncIterator[bytes], content_type: str,
                         sink_path: Path) -> Upload:
    """Parse a multipart upload from `stream`, its file part into `sink_path` (fsynced)."""
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise ApiError(400, "an upload must be multipart/form-data with a 'file' and a "
                       "'purpose' field", None, "invalid_request")
    up = Upload()
    with open(sink_path, "wb") as sink:
        parts = _Parts(up, sink)
        parser = MultipartParser(boundary, parts.callbacks())
        async for chunk in stream:
            if chunk:
                parser.write(chunk)
        parser.finalize()
        sink.flush()
        await asyncio.to_thread(os.fsync, sink.fileno())  # seconds for a big file: off the loop
    if not up.has_file:
        raise ApiError(400, "the upload has no 'file' part", "file", "invalid_request")
    if up.checker.error is None:
        up.checker.error = await asyncio.to_thread(up.checker.duplicate, sink_path)
    return up
