"""Token counting in batches: the reader's groups of lines shaped and counted on a worker.

Contract:
- `counted_groups(drafts, counter, finder)` takes the reader's drafts and line errors in
  input order and yields them again in groups of at most `BATCH_LINES` lines (fewer once
  their text reaches `BATCH_CHARS` characters), each with its shaped drafts (the good
  lines', in order) and `KnownCounts` holding every text `build_item` will count for them;
  memory is bounded by a few groups, never the input.
- Each group's texts are shaped (with a `finder`) and counted in one `count_batch` on a
  worker thread while this thread parses the next group (the batch releases the GIL). The
  worker runs one group at a time, in order, and is the only one to touch `finder` and its
  component cache, so the finder sees the lines in input order.
- Without a finder, the texts the counter counts cheaply (`cheap`: ASCII text counted by
  pieces, `formats.pieces`, Python work that holds the GIL) are counted on this thread, with
  a component cache of its own, and only the rest go to the worker.
- Counts of components (which repeat across lines) are cached; prompts are not.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from fabricctl.formats.autoshape import ShapeFinder
from fabricctl.formats.common import Draft
from fabricctl.formats.lines import Drafted, LineError
from fabricctl.formats.tokens import BatchCounter, ComponentCache, KnownCounts

BATCH_LINES = 2048  # lines counted in one batch, with a batch counter (bench/tokenize_bench.py)
BATCH_CHARS = 1 << 23  # ...or fewer, once their text is 8M characters (memory stays flat)

Group = list[Drafted | LineError]
_Job = Future[tuple[list[Draft], dict[str, int]]]


def counted_groups(drafts: Iterator[Drafted | LineError], counter: BatchCounter,
                   finder: ShapeFinder | None
                   ) -> Iterator[tuple[Group, list[Draft], KnownCounts]]:
    """Each group of `drafts`, its shaped drafts and their counts, in input order; at most
    two groups are held besides the one being yielded."""
    cache = ComponentCache(counter)  # the worker's
    here = ComponentCache(counter)  # this thread's, for cheap components

    def shaped_counts(shaped: list[Draft]) -> tuple[list[Draft], dict[str, int]]:
        if finder is not None:
            shaped = finder.shape_all(shaped, counter)
        return shaped, _counted(_texts(shaped), counter, cache)

    def rest_counts(shaped: list[Draft], rest: dict[str, bool]
                    ) -> tuple[list[Draft], dict[str, int]]:
        return shaped, _counted(rest, counter, cache)

    def done(group: Group, job: _Job, counted_here: dict[str, int]
             ) -> tuple[Group, list[Draft], KnownCounts]:
        shaped, counts = job.result()
        counts.update(counted_here)
        return group, shaped, KnownCounts(counter.name, counts)

    with ThreadPoolExecutor(1, thread_name_prefix="fabricctl-tokens") as worker:
        ahead: tuple[Group, _Job, dict[str, int]] | None = None
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
                yield done(*ahead)
            ahead = group, job, counted_here
        if ahead is not None:
            yield done(*ahead)


def _groups(drafts: Iterator[Drafted | LineError]) -> Iterator[Group]:
    """`drafts` in groups of at most `BATCH_LINES` lines or about `BATCH_CHARS` characters
    of text, so memory stays bounded whatever the input."""
    group: Group = []
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


