"""JSONL → items: the streaming reader behind `fabricctl submit` and `fabricctl run`.

Contract:
- `parse_lines(lines)` takes raw lines (bytes, with or without their newline) and yields,
  in input order, a `Parsed(line_no, item, source)` for every good line and a
  `LineError(line_no, reason)` for every bad one. It never raises for bad input, keeps
  nothing per line but the ids seen (to refuse duplicates), and numbers lines from 1,
  blank ones included. Blank (whitespace-only) lines are skipped silently; a UTF-8 byte
  order mark on the first line is ignored.
- A line longer than `max_line_bytes` (default 1 MiB, newline excluded) is refused before
  it is decoded. `read_lines(fp)` reads a binary stream holding at most that many bytes
  of any line in memory, so a 10 MB line costs 1 MiB and is still refused.
- Each line's format is detected on its own: any of `custom_id`/`method`/`url`/`body`
  means an OpenAI batch request (`fabricctl.formats.openai_batch`), otherwise any of
  `id`/`model`/`prompt`/`prefix`/`max_tokens` means native (`fabricctl.formats.native`),
  otherwise the line is refused as of unknown format.
- A `LineError` says what could still be read of its line, so a caller can answer it in
  the line's own form (`fabricctl run` writes an OpenAI line's error row,
  `formats.results.refused_line`): `openai` is True for a refused OpenAI batch line,
  False for a native one, None when the form cannot be told (too long, not UTF-8, not
  JSON, not an object, neither form); `id` is the line's `custom_id` (OpenAI) or `id`
  (native) when that field is a string, else None.
- An item's `signature` is `fabricctl.core.signature.signature(components)`, its `payload`
  the msgpack `Payload(components, prompt, component_tokens, prompt_tokens, chat, body,
  path)` (`path`: the endpoint of an embeddings, score, rerank or responses request), its
  `input_tokens` the sum of those counts (see `fabricctl.formats.tokens` for where the
  counts come from), its `label` the native `label` (or OpenAI `body.metadata.label`, else "").
- With a `finder` (`fabricctl.formats.autoshape.ShapeFinder`, one per job: `[producer]
  shapes = "auto"`), a line that declares no shape gets the prefix the finder finds as its
  one component (lines fed to it in input order, duplicates and bad lines never); without
  one (`"declared"`) components are exactly what the line declares.
- `Item.source` (and `Parsed.source`, the same value as a `Source`) says which format the
  line came in; it travels with the item through the store into its `ResultRecord`, so
  the result goes back out in the same form (`fabricctl.formats.results.result_line`).
- `Item.endpoint` names where the request goes, as a `Source` value, on every item built:
  the url's (OpenAI), the named `endpoint`, else chat for `messages` and completions for
  `prompt` (native). The broker counts each job's items by it (`core.mix`) without
  reading the payload.

- With a counter that counts in batches (`formats.tokens.batches`: a tokenizer), lines
  are read in groups of at most `BATCH_LINES` lines (fewer once their text reaches
  `BATCH_CHARS` characters), and each group's texts are shaped and counted in one batch
  on every core (on a worker thread, while the next group is parsed) before its results
  are yielded: results, counts and errors are the same, in the same order, as one line
  at a time, and memory is bounded by a few groups, never the input. Without a
  shapes-found pass, the texts the counter counts cheaply (`cheap`: ASCII text counted by
  pieces, `formats.pieces`) are counted on the caller's thread instead, where that Python
  work does not contend for the GIL, and only the rest go to the worker. With the estimate
  lines go one at a time, on the caller's thread.

A reason is one short sentence naming the field, e.g. "max_tokens must be at least 1".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import msgspec

from fabricctl.core.defaults import MAX_LINE_BYTES
from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import signature
from fabricctl.core.types import Item
from fabricctl.formats.autoshape import ShapeFinder
from fabricctl.formats.common import URL_SOURCES, Draft, Invalid, Source, a_json_type
from fabricctl.formats.native import NATIVE_KEYS, parse_native
from fabricctl.formats.openai_batch import OPENAI_KEYS, parse_openai
from fabricctl.formats.results import (
    ResultRecord,
    make_record,
    native_line,
    openai_line,
    result_line,
)
from fabricctl.formats.tokens import (
    BatchCounter,
    ComponentCache,
    EstimateCounter,
    KnownCounts,
    TokenCounter,
    batches,
    estimate_tokens,
    load_counter,
    split_counts,
)

__all__ = [
    "MAX_LINE_BYTES",
    "LineError",
    "Parsed",
    "ResultRecord",
    "Source",
    "TokenCounter",
    "build_item",
    "estimate_tokens",
    "load_counter",
    "make_record",
    "native_line",
    "openai_line",
    "parse_lines",
    "parse_stream",
    "read_lines",
    "result_line",
]

_BOM = b"\xef\xbb\xbf"
_SKIP_CHUNK = 1 << 16
BATCH_LINES = 2048  # lines counted in one batch, with a batch counter (bench/tokenize_bench.py)
BATCH_CHARS = 1 << 23  # ...or fewer, once their text is 8M characters (memory stays flat)


class LineError(msgspec.Struct, frozen=True):
    """Why: a bad line is reported with its number and reason while the rest goes in."""

    line_no: int
    reason: str
    openai: bool | None = None  # the line's form: OpenAI batch, native, or None: unknown
    id: str | None = None  # its custom_id (OpenAI) or id (native), when a string

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.reason}"


class Parsed(msgspec.Struct, frozen=True):
    """Why: an item plus the format it came in, which decides the form of its result."""

    line_no: int
    item: Item
    source: Source


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


def parse_lines(
    lines: Iterable[bytes],
    *,
    counter: TokenCounter | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    first_line_no: int = 1,
    finder: ShapeFinder | None = None,
) -> Iterator[Parsed | LineError]:
    """Parsed items and line errors for raw JSONL lines, in input order; never raises."""
    counter = counter or EstimateCounter()
    drafts = _drafts(lines, max_line_bytes, first_line_no)
    batch = batches(counter)
    if batch is not None:
        yield from _batched(drafts, batch, finder)
        return
    cache = ComponentCache(counter)
    for got in drafts:
        if isinstance(got, LineError):
            yield got
            continue
        draft = got.draft
        if finder is not None:
            draft = finder.shape(draft, counter)
        item = build_item(draft, counter, cache)
        item.line = got.line_no  # results per job come back in this order
        yield Parsed(got.line_no, item, draft.source)


class _Good(msgspec.Struct, gc=False):
    """Why: a valid line's draft keeps its line number until its item is built."""

    line_no: int
    draft: Draft


def _drafts(lines: Iterable[bytes], max_line_bytes: int,
            first_line_no: int) -> Iterator[_Good | LineError]:
    """Each line's draft or error, in input order (duplicate ids refused)."""
    seen: dict[str, int] = {}
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
        first = seen.get(draft.id)
        if first is not None:
            openai = draft.source.is_openai
            field = "custom_id" if openai else "id"
            yield LineError(line_no, f"{field} {draft.id!r} is a duplicate of line {first}",
                            openai, draft.id)
            continue
        seen[draft.id] = line_no
        yield _Good(line_no, draft)


def _batched(drafts: Iterator[_Good | LineError], counter: BatchCounter,
             finder: ShapeFinder | None) -> Iterator[Parsed | LineError]:
    """`parse_lines` with a batch counter: each group's lines (`_groups`) shaped and counted
    in one batch on a worker thread, while this thread parses the next group (the batch
    releases the GIL); then built and yielded in order. Same results; at most two groups
    are held besides the one being yielded. Without a finder, the texts the counter counts
    cheaply (`cheap`: by pieces, Python work that holds the GIL) are counted on this thread
    instead, and only the rest go to the worker.

    The worker runs one group at a time, in order, and is the only one to touch `finder`
    and its component cache, so the finder sees the lines in input order. The cheap texts'
    components have a cache of their own, on this thread (a text is cheap or not whatever
    the thread counts it).
    """
    cache = ComponentCache(counter)  # the worker's
    here = ComponentCache(counter)  # this thread's, for cheap components

    def shaped_counts(shaped: list[Draft]) -> tuple[list[Draft], dict[str, int]]:
        if finder is not None:
            shaped = finder.shape_all(shaped, counter)
        return shaped, _counted(_texts(shaped), counter, cache)

    def rest_counts(shaped: list[Draft], rest: dict[str, bool]
                    ) -> tuple[list[Draft], dict[str, int]]:
        return shaped, _counted(rest, counter, cache)

    with ThreadPoolExecutor(1, thread_name_prefix="fabricctl-tokens") as worker:
        ahead: tuple[list[_Good | LineError], Future[tuple[list[Draft], dict[str, int]]],
                     dict[str, int]] | None = None
        for group in _groups(drafts):
            shaped = [g.draft for g in group if not isinstance(g, LineError)]
            counted_here: dict[str, int] = {}
            if finder is not None:
                job = worker.submit(shaped_counts, shaped)
            else:
                todo = _texts(shaped)
                cheap = counter.cheap
                rest = {t: comp for t, comp in todo.items() if not cheap(t)}
                job = worker.submit(rest_counts, shaped, rest)
                counted_here = _counted({t: comp for t, comp in todo.items() if t not in rest},
                                        counter, here)
            if ahead is not None:
                yield from _built(*ahead, counter.name)
            ahead = group, job, counted_here
        if ahead is not None:
            yield from _built(*ahead, counter.name)


def _built(group: list[_Good | LineError],
           job: Future[tuple[list[Draft], dict[str, int]]], counted_here: dict[str, int],
           name: str) -> Iterator[Parsed | LineError]:
    """A group's items (from its shaped drafts and counts) and errors, in line order."""
    shaped, counts = job.result()
    counts.update(counted_here)
    known = KnownCounts(name, counts)
    todo = iter(shaped)
    for got in group:
        if isinstance(got, LineError):
            yield got
            continue
        draft = next(todo)
        item = build_item(draft, known)
        item.line = got.line_no
        yield Parsed(got.line_no, item, draft.source)


def _groups(drafts: Iterator[_Good | LineError]) -> Iterator[list[_Good | LineError]]:
    """`drafts` in groups of at most `BATCH_LINES` lines or about `BATCH_CHARS` characters
    of text, so memory stays bounded whatever the input."""
    group: list[_Good | LineError] = []
    chars = 0
    for got in drafts:
        group.append(got)
        if not isinstance(got, LineError):
            d = got.draft
            chars += len(d.prompt) + len(d.body) + sum(map(len, d.components))
        if len(group) >= BATCH_LINES or chars >= BATCH_CHARS:
            yield group
            group, chars = [], 0
    if group:
        yield group


def _texts(drafts: list[Draft]) -> dict[str, bool]:
    """Every text `build_item` will count for `drafts`, once each: text -> whether it is a
    component (counts of components are cached)."""
    todo: dict[str, bool] = {}
    for d in drafts:
        for c in d.components:
            todo[c] = True
        if d.input_tokens is None:
            todo.setdefault(d.prompt, False)
    return todo


def _counted(todo: dict[str, bool], counter: BatchCounter, cache: ComponentCache
             ) -> dict[str, int]:
    """The counts of `todo`'s texts (`_texts`): cached components looked up, the rest
    counted in one `count_batch` (new components then cached)."""
    counts: dict[str, int] = {}
    texts: list[str] = []
    for text, component in todo.items():
        n = cache.known(text) if component else None
        if n is None:
            texts.append(text)
        else:
            counts[text] = n
    if not texts:
        return counts
    for text, n in zip(texts, counter.count_batch(texts), strict=True):
        counts[text] = n
        if todo[text]:
            cache.remember(text, n)
    return counts


def parse_stream(
    fp: BinaryIO,
    *,
    counter: TokenCounter | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    finder: ShapeFinder | None = None,
) -> Iterator[Parsed | LineError]:
    """`parse_lines` over a binary stream read with bounded memory per line."""
    return parse_lines(
        read_lines(fp, max_line_bytes), counter=counter, max_line_bytes=max_line_bytes,
        finder=finder,
    )


def build_item(draft: Draft, counter: TokenCounter, cache: ComponentCache | None = None) -> Item:
    """The item of a valid draft: token counts, signature and payload.

    `cache`, when given, counts the components (which repeat across lines); the prompt,
    which rarely repeats, is always counted by `counter` directly.
    """
    count_component = (cache or counter).count
    comp = [count_component(c) for c in draft.components]
    prompt = None if draft.input_tokens is not None else counter.count(draft.prompt)
    comp, prompt_tokens, total = split_counts(comp, prompt, draft.input_tokens)
    payload = Payload(draft.components, draft.prompt, comp, prompt_tokens, draft.chat,
                      draft.body, draft.path)
    return Item(
        id=draft.id,
        model=draft.model,
        signature=signature(draft.components),
        input_tokens=total,
        max_tokens=draft.max_tokens,
        payload=encode_payload(payload),
        label=draft.label,
        source=int(draft.source),
        endpoint=int(URL_SOURCES.get(draft.path)
                     or (Source.CHAT if draft.chat else Source.COMPLETIONS)),
    )


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
