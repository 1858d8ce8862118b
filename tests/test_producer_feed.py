"""The one submit pipeline (fabricctl.producer.feed): bounds, refusals, failure, one definition.

Promises checked: a feed sends chunks of at most CHUNK lines with at most IN_FLIGHT awaiting
their acks, and its memory does not grow with the input; every refused line, the reader's
or the broker's, reaches `on_refused` once and the job's record keeps the first MAX_ERRORS
in line order, whatever order the acks came in; a send that fails fails the feed, and its
reader thread stops; `prepare` can keep items from being sent; the pipeline's constants are
defined once in the code base (submit, run and the Batch API use them).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
from pathlib import Path

import pytest

from fabricctl.core.jobs import MAX_ERRORS
from fabricctl.errors import BackendMissing
from fabricctl.producer import CHUNK, IN_FLIGHT, Chunk, Feed, FeedHooks, Refusals
from fabricctl.wire.protocol import Ack, JobReply, Reject

ROOT = Path(__file__).resolve().parent.parent


def line(ident: str, **over: object) -> bytes:
    obj = {"id": ident, "model": "fabric-demo", "prefix": ["SYS"], "prompt": "hi",
           "max_tokens": 8}
    obj.update(over)
    return json.dumps(obj).encode() + b"\n"


class _Sink:
    """Acks every chunk after a short delay, refusing ids in `refuse`, and records how many
    submits were in flight at once and what the seal said."""

    def __init__(self, refuse: frozenset[str] = frozenset(), delays: list[float] | None = None,
                 fail_after: int = -1) -> None:
        self.inflight = self.most = 0
        self.sizes: list[int] = []
        self.refuse, self.delays, self.fail_after = refuse, delays or [], fail_after
        self.sealed: tuple[int, list[str], int] | None = None

    async def submit(self, items: list, job: int = 0, resume: bool = False) -> Ack:
        self.inflight += 1
        self.most = max(self.most, self.inflight)
        n = len(self.sizes)
        self.sizes.append(len(items))
        try:
            await asyncio.sleep(self.delays[n] if n < len(self.delays) else 0.005)
            if n == self.fail_after:
                raise BackendMissing("broker gone")
        finally:
            self.inflight -= 1
        rejects = [Reject(k, "refused here") for k, it in enumerate(items) if it.id in self.refuse]
        return Ack(0, len(items) - len(rejects), rejects)

    async def seal_job(self, job: int, lines: int, errors: list[str] | None = None,
                       failed: bool = False, sha256: str = "", refused: int = 0) -> JobReply:
        from fabricctl.core.jobs import JobRecord

        self.sealed = (lines, list(errors or []), refused)
        return JobReply(0, JobRecord(number=job, id="j", kind="test"))


def test_sends_bounded_chunks_with_bounded_submits_in_flight() -> None:
    data = b"".join(line(f"m{i}") for i in range(20 * CHUNK + 7))
    sink = _Sink()
    feed = Feed(sink, 1)
    asyncio.run(feed.run(io.BytesIO(data)))
    assert feed.accepted == 20 * CHUNK + 7 and feed.refusals.count == 0 and feed.done
    assert max(sink.sizes) == CHUNK and sum(sink.sizes) == 20 * CHUNK + 7
    assert 1 < sink.most <= IN_FLIGHT


class _Lines(io.RawIOBase):
    """`n` native lines made on the fly, so the input itself never sits in memory."""

    def __init__(self, n: int, prompt_bytes: int) -> None:
        self.n, self.i, self.buf, self.size = n, 0, b"", prompt_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        while len(self.buf) < len(b) and self.i < self.n:
            self.buf += line(f"id-{self.i:08d}", prompt="x" * self.size)
            self.i += 1
        k = min(len(b), len(self.buf))
        b[:k], self.buf = self.buf[:k], self.buf[k:]
        return k


def test_memory_does_not_grow_with_the_input() -> None:
    """36 MB of input through the pipeline peaks far below its size (ids seen aside)."""
    import tracemalloc

    from fabricctl.formats.reader import read_lines

    n, size = 12_000, 3000
    feed = Feed(_Sink(), 1)
    tracemalloc.start()
    try:
        asyncio.run(feed.run(read_lines(io.BufferedReader(_Lines(n, size)))))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert feed.accepted == n
    assert peak < n * size / 3, f"peak {peak / 1e6:.1f} MB for {n * size / 1e6:.0f} MB of input"


def test_every_refusal_is_reported_once_and_the_record_keeps_the_first_in_line_order() -> None:
    """Reader refusals (bad JSON) and broker refusals (ids in `refuse`), over chunks whose
    acks come back in reverse order: each is reported once; the seal carries the first
    MAX_ERRORS messages sorted by line and the count of the rest."""
    lines, refuse = [], set()
    for i in range(3 * CHUNK):
        if i % 50 == 7:
            lines.append(b"not json\n")
        else:
            lines.append(line(f"i{i}"))
            if i % 50 == 20:
                refuse.add(f"i{i}")
    sink = _Sink(frozenset(refuse), delays=[0.06, 0.03, 0.0])  # the last chunk acks first
    reported: list[str] = []
    feed = Feed(sink, 1)

    async def go() -> None:
        await feed.run(iter(lines), hooks=FeedHooks(on_refused=reported.append))
        await feed.seal()

    asyncio.run(go())
    bad = [n + 1 for n in range(3 * CHUNK) if n % 50 in (7, 20)]
    assert sorted(int(m.split()[1].rstrip(":")) for m in reported) == bad
    assert len(reported) == len(set(reported)) == feed.refusals.count == len(bad)
    assert sink.sealed is not None
    sealed_lines, messages, rest = sink.sealed
    assert sealed_lines == 3 * CHUNK
    assert [int(m.split()[1].rstrip(":")) for m in messages] == bad[:MAX_ERRORS]
    assert rest == len(bad) - MAX_ERRORS
    assert feed.accepted == 3 * CHUNK - len(bad)


def test_refusals_keep_the_first_lines_whatever_the_order() -> None:
    r = Refusals()
    for n in [50, 3, 40, 1, 2, *range(100, 100 + MAX_ERRORS)]:
        r.add(n, f"line {n}: x")
    assert r.count == 5 + MAX_ERRORS
    assert r.messages()[:5] == ["line 1: x", "line 2: x", "line 3: x", "line 40: x",
                                "line 50: x"]
    assert len(r.messages()) == MAX_ERRORS


def test_a_failed_send_fails_the_feed_and_stops_its_reader() -> None:
    """The second chunk's send fails: the feed raises that error, and the reader thread,
    which would have read 100 chunks, stops at its next hand-off."""
    sink = _Sink(fail_after=1)
    feed = Feed(sink, 1)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(BackendMissing):
        asyncio.run(feed.run(line(f"m{i}") for i in range(100 * CHUNK)))
    readers = [t for t in threading.enumerate()
               if t.ident not in before and t.name.startswith("fabricctl-feed")]
    for t in readers:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in readers)
    assert len(sink.sizes) < 100


def test_prepare_keeps_items_from_being_sent() -> None:
    seen: list[int] = []

    def prepare(chunk: Chunk) -> None:
        seen.append(len(chunk.items))
        chunk.items = [i for i in chunk.items if not i.id.endswith("3")]

    sink = _Sink()
    feed = Feed(sink, 1)
    asyncio.run(feed.run((line(f"m{i}") for i in range(40)), hooks=FeedHooks(prepare=prepare)))
    assert seen == [40] and sink.sizes == [36] and feed.accepted == 36


def test_the_pipeline_constants_are_defined_once() -> None:
    """CHUNK, IN_FLIGHT and QUEUED of the submit pipeline exist in one module only: a copy
    in submit, run or the API would let them drift apart again."""
    pattern = re.compile(r"^(CHUNK|IN_FLIGHT|QUEUED|_?CHUNK_SIZE)\s*[:=]", re.MULTILINE)
    where = {str(p.relative_to(ROOT)): pattern.findall(p.read_text())
             for p in (ROOT / "fabricctl").rglob("*.py")}
    assert {p: names for p, names in where.items() if names} == {
        "fabricctl/producer/feed.py": ["CHUNK", "IN_FLIGHT", "QUEUED"]}
