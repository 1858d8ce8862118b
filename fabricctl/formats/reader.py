"""JSONL -> items: the streaming reader behind `fabricctl submit` and `fabricctl run`.

Contract:
- `parse_lines(lines)` takes raw lines (bytes, with or without their newline) and yields,
  in input order, a `Parsed(line_no, item, source)` for every good line and a `LineError`
  for every bad one (`formats.lines`: never raises, duplicates refused, lines numbered
  from 1, blank ones included); `parse_stream(fp)` the same over `read_lines(fp)`.
- An item's `signature` is `fabricctl.core.signature.signature(components)`, its `payload`
  the msgpack `Payload(components, prompt, component_tokens, prompt_tokens, chat, body,
  path)` (`path`: the endpoint of an embeddings, score, rerank or responses request), its
  `input_tokens` the sum of those counts (`formats.tokens`), its `label` the native
  `label` (or OpenAI `body.metadata.label`, else "").
- With a `finder` (`formats.autoshape.ShapeFinder`, one per job: `[producer] shapes =
  "auto"`), a line that declares no shape gets the prefix the finder finds as its one
  component (lines fed in input order, duplicates and bad lines never); without one
  components are exactly what the line declares.
- `Item.source` (and `Parsed.source`) says which format the line came in; it travels into
  its `ResultRecord`, so the result goes back out in the same form (`results.result_line`).
  `Item.endpoint` names where the request goes (the url's, the named `endpoint`, else chat
  for `messages`, completions for `prompt`); the broker counts items by it (`core.mix`).
- With a counter that counts in batches (a tokenizer), lines are shaped and counted a group
  at a time on a worker (`formats.batched`): the same results, counts and errors in the
  same order as one line at a time, memory bounded by a few groups. With the estimate,
  lines go one at a time on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import BinaryIO

import msgspec

from fabricctl.core.defaults import MAX_LINE_BYTES
from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import signature
from fabricctl.core.types import Item
from fabricctl.formats.autoshape import ShapeFinder
from fabricctl.formats.batched import counted_groups
from fabricctl.formats.common import URL_SOURCES, Draft, Source
from fabricctl.formats.lines import Drafted, LineError, drafts, read_lines
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


class Parsed(msgspec.Struct, frozen=True):
    """Why: an item plus the format it came in, which decides the form of its result."""

    line_no: int
    item: Item
    source: Source


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
    drafted = drafts(lines, max_line_bytes, first_line_no)
    batch = batches(counter)
    if batch is not None:
        yield from _batched(drafted, batch, finder)
        return
    cache = ComponentCache(counter)
    for got in drafted:
        if isinstance(got, LineError):
            yield got
            continue
        draft = got.draft
        if finder is not None:
            draft = finder.shape(draft, counter)
        item = build_item(draft, counter, cache)
        item.line = got.line_no  # results per job come back in this order
        yield Parsed(got.line_no, item, draft.source)


def _batched(drafted: Iterator[Drafted | LineError], counter: BatchCounter,
             finder: ShapeFinder | None) -> Iterator[Parsed | LineError]:
    """`parse_lines` with a batch counter: items built from each group's shaped drafts and
    counts (`formats.batched`), errors in their place, in line order."""
    for group, shaped, known in counted_groups(drafted, counter, finder):
        todo = iter(shaped)
        for got in group:
            if isinstance(got, LineError):
                yield got
                continue
            draft = next(todo)
            item = build_item(draft, known)
            item.line = got.line_no
            yield Parsed(got.line_no, item, draft.source)


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
