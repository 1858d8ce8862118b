"""Tokenizing in batches (`formats/reader.py`, `formats/batched.py`, `formats/tokens.py`,
`formats/autoshape.py`):
with a tokenizer the reader counts a group of lines in one `encode_batch` (on every core),
or, for the texts it counts by pieces (`formats/pieces.py`), on the reading thread, and
gives exactly what one line at a time gives: the same items, counts, found shapes and
line-numbered errors in the same order; it reads a bounded number of lines ahead of what
it has yielded, whatever the input; and the estimate still goes one line at a time."""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
import types
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.formats import batched as grouping
from fabricctl.formats.autoshape import ShapeFinder
from fabricctl.formats.reader import LineError, Parsed, parse_lines
from fabricctl.formats.tokens import (
    EstimateCounter,
    TokenCounter,
    TokenizerCounter,
    batches,
    pieces_in_batches,
)

tokenizers = pytest.importorskip("tokenizers")

CORPUS = ["the broker routes the items to a lane", "You are a helpful assistant.",
          "every consumer warms its blocks", "0 1 2 3 4 5 6 7 8 9", "été, naïve café — ünïcode"]


_DIRS: list[tempfile.TemporaryDirectory[str]] = []  # the tokenizer's, kept until exit


@cache
def _tokenizer_path() -> str:
    """A byte-level BPE (any text encodes) trained here on a fixed corpus: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    _DIRS.append(tempfile.TemporaryDirectory(prefix="fabricctl-tok-"))  # removed at exit
    path = Path(_DIRS[-1].name) / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def tokenizer() -> TokenizerCounter:
    return TokenizerCounter(_tokenizer_path(), cores=2)  # a small host: batches by pieces


class CountingBatches:
    """Why: the tokenizer's batch counter, recording every batch it was asked to count."""

    def __init__(self, inner: TokenizerCounter) -> None:
        self.inner, self.name = inner, inner.name
        self.batched = True
        self.batches: list[list[str]] = []
        self.threads: list[str] = []  # the thread that counted each batch

    def count(self, text: str) -> int:
        return self.inner.count(text)

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self.inner.encode(text)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        self.batches.append(list(texts))
        self.threads.append(threading.current_thread().name)
        return self.inner.count_batch(texts)

    def cheap(self, text: str) -> bool:
        return self.inner.cheap(text)

    def encode_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        return self.inner.encode_batch(texts)


def j(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


texts = st.text(st.characters(codec="utf-8"), max_size=40)
# a few shared texts, so components repeat across lines (the cache) and prompts share heads
shared = st.sampled_from(["", "You are a helpful assistant. ", "the broker routes the items",
                          "été naïve café ", "0 1 2 3 4 5 6 7 8 9 "])


@st.composite
def a_line(draw: st.DrawFn, i: int) -> bytes:
    """A native, chat or completions line, or a bad one (blank, not JSON, a bad field, a
    duplicate id, too long)."""
    kind = draw(st.sampled_from(["native", "native", "chat", "completion", "completion",
                                 "blank", "json", "field", "duplicate", "long"]))
    ident = "dup" if kind == "duplicate" else f"r{i}"
    if kind == "blank":
        return b"  \n"
    if kind == "json":
        return b'{"id": "x", \n'
    if kind == "long":
        return b'{"id": "' + b"x" * 300 + b'"}\n'
    if kind == "field":
        return j({"id": ident, "model": "m", "prompt": "p", "max_tokens": 0})
    head = draw(shared) + draw(texts)
    if kind == "chat":
        return j({"custom_id": ident, "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "m", "messages": [
                      {"role": "system", "content": draw(shared)},
                      {"role": "user", "content": head}]}})
    if kind == "completion":
        return j({"custom_id": ident, "method": "POST", "url": "/v1/completions",
                  "body": {"model": "m", "prompt": head + draw(texts), "max_tokens": 4}})
    line: dict[str, object] = {"id": ident, "model": "m", "prompt": head, "max_tokens": 4,
                               "prefix": draw(st.lists(st.one_of(shared, texts), max_size=3))}
    if draw(st.booleans()) and draw(st.booleans()):
        line["input_tokens"] = draw(st.integers(1, 60))
    return j(line)


@st.composite
def files(draw: st.DrawFn) -> list[bytes]:
    n = draw(st.integers(0, 40))
    return [draw(a_line(i)) for i in range(n)]


@settings(max_examples=80, deadline=None)
@given(files(), st.integers(1, 9), st.booleans(), st.sampled_from([(True, 2), (True, 16),
                                                                   (False, 2)]))
def test_batch_counts_are_the_one_at_a_time_counts(lines: list[bytes], group: int,
                                                   auto: bool, mode: tuple[bool, int]) -> None:
    # the reference encodes one text at a time; the batches count ASCII texts by pieces on
    # the reading thread and the rest on the worker (pieces, few cores), or encode every
    # text there (many cores, or no pieces)
    pieces, cores = mode
    tok = TokenizerCounter(_tokenizer_path(), pieces=pieces, cores=cores)
    one = TokenizerCounter(_tokenizer_path(), batched=False, pieces=False)
    assert batches(tok) is tok and batches(one) is None

    def parse(counter: TokenCounter) -> list[Parsed | LineError]:
        finder = ShapeFinder(2) if auto else None
        return list(parse_lines(lines, counter=counter, max_line_bytes=200, finder=finder))

    single = parse(one)
    with mock.patch.object(grouping, "BATCH_LINES", group):  # groups end inside the file
        batched = parse(tok)
    assert batched == single  # items (counts, signatures, payloads), errors, order
    numbers = [p.line_no for p in batched]
    assert numbers == sorted(numbers)


@pytest.mark.parametrize(("pieces", "cores"), [(True, 2), (True, 16), (False, 2)])
def test_the_batch_counts_are_the_tokenizers_own(pieces: bool, cores: int) -> None:
    tok = TokenizerCounter(_tokenizer_path(), pieces=pieces, cores=cores)
    words = ["", "a", "été naïve", "the broker routes the items " * 30, "0 1 2"]
    own = [len(tok.encode(w)[0]) for w in words]
    assert tok.count_batch(words) == [tok.count(w) for w in words] == own
    assert tok.encode_batch(words) == [tok.encode(w) for w in words]
    inline = pieces and cores == 2  # batches count by pieces only on a small host
    assert [tok.cheap(w) for w in words] == [inline, inline, False, inline, inline]


def test_batches_count_by_pieces_on_small_hosts_only() -> None:
    assert pieces_in_batches(1) and pieces_in_batches(2) and pieces_in_batches(5)
    assert not pieces_in_batches(6) and not pieces_in_batches(64)


@pytest.mark.parametrize("pieces", [True, False])
def test_a_component_is_counted_once_across_batches(pieces: bool) -> None:
    system = "You are a helpful assistant. " * 10
    lines = [j({"id": f"q{i}", "model": "m", "prefix": [system], "prompt": f"question {i}",
                "max_tokens": 4}) for i in range(50)]
    counter = CountingBatches(TokenizerCounter(_tokenizer_path(), pieces=pieces, cores=2))
    with mock.patch.object(grouping, "BATCH_LINES", 8):
        got = list(parse_lines(lines, counter=counter))
    assert len(got) == 50 and all(isinstance(p, Parsed) for p in got)
    assert len(counter.batches) == 7  # ceil(50 / 8): one batch a group
    counted = [t for b in counter.batches for t in b]
    assert counted.count(system) == 1  # the first group counted it, the others looked it up
    assert sorted(t for t in counted if t != system) == sorted(f"question {i}" for i in range(50))


def test_cheap_texts_are_counted_on_the_reading_thread_the_rest_on_the_worker() -> None:
    # ASCII text is counted by pieces where it is read (Python work, holding the GIL);
    # text the pieces do not cover (here: not ASCII) is encoded on the worker, on every core
    system, other = "You are terse. " * 5, "Réponds en français. " * 5
    lines = [j({"id": f"q{i}", "model": "m", "prefix": [system if i % 2 else other],
                "prompt": f"question {i}" if i % 3 else f"question numéro {i}",
                "max_tokens": 4}) for i in range(40)]
    counter = CountingBatches(tokenizer())
    with mock.patch.object(grouping, "BATCH_LINES", 8):
        got = list(parse_lines(lines, counter=counter))
    reference = list(parse_lines(lines, counter=TokenizerCounter(_tokenizer_path(),
                                                                 batched=False, pieces=False)))
    assert got == reference
    worker = [t for b, th in zip(counter.batches, counter.threads, strict=True)
              if th.startswith("fabricctl-tokens") for t in b]
    here = [t for b, th in zip(counter.batches, counter.threads, strict=True)
            if th == threading.current_thread().name for t in b]
    assert len(worker) + len(here) == sum(map(len, counter.batches))
    assert worker and all(not t.isascii() for t in worker)
    assert here and all(t.isascii() for t in here)
    assert sorted(worker + here) == sorted({system, other} | {
        f"question {i}" if i % 3 else f"question numéro {i}" for i in range(40)})


def _endless(read: list[int], size: int = 20) -> Iterator[bytes]:
    for i in itertools.count():
        read[0] = i + 1
        yield j({"id": f"x{i}", "model": "m", "prompt": f"{i} " + "w" * size, "max_tokens": 4})


def test_reading_is_streaming_two_groups_ahead_at_most() -> None:
    read = [0]
    got = parse_lines(_endless(read), counter=tokenizer())
    first = list(itertools.islice(got, 3 * grouping.BATCH_LINES + 1))
    assert len(first) == 3 * grouping.BATCH_LINES + 1
    # the group being yielded and the next one, read while the worker counted: not the file
    assert read[0] <= len(first) + 2 * grouping.BATCH_LINES
    assert isinstance(got, types.GeneratorType)
    got.close()  # the worker thread ends with the reading
    assert not [t for t in threading.enumerate() if t.name.startswith("fabricctl-tokens")]


def test_long_lines_make_smaller_groups() -> None:
    read = [0]
    with mock.patch.object(grouping, "BATCH_CHARS", 10_000):
        got = parse_lines(_endless(read, size=4_000), counter=tokenizer())
        first = next(got)
    assert isinstance(first, Parsed) and first.line_no == 1
    # each line's text is ~4,000 characters: three reach 10,000, a group is 3 lines, not
    # 2048; the first is yielded once the second group is read
    assert read[0] == 6


def test_the_estimate_goes_one_line_at_a_time() -> None:
    assert batches(EstimateCounter()) is None
    read = [0]
    got = parse_lines(_endless(read), counter=EstimateCounter())
    next(got)
    assert read[0] == 1


def test_shape_all_with_a_batch_counter_finds_what_shape_finds() -> None:
    from fabricctl.formats.common import Draft, Source

    head = "You are a helpful assistant. Answer in one word please. "
    drafts = [Draft(f"c{i}", "m", [], head + f"question {i}", 4, Source.COMPLETIONS)
              for i in range(6)]
    drafts.insert(2, Draft("n", "m", ["declared"], head + "x", 4, Source.NATIVE))
    tok = tokenizer()
    one = ShapeFinder(2)
    alone = [one.shape(d, tok) for d in drafts]
    many = ShapeFinder(2)
    together = many.shape_all(drafts, tok)
    assert together == alone
    assert sum(1 for d in together if d.components and d.components[0].startswith(head[:8])) >= 4
    assert (many.lines, many.found) == (one.lines, one.found) == (6, 5)
