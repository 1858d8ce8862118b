"""A job's endpoint mix (issue 26): items counted per endpoint at ingest, once each, kept on
the job's record across restarts; how the views print it; the metrics family."""

from __future__ import annotations

from pathlib import Path

import msgspec
from store_helpers import MODEL, store

from fabricctl.core.jobs import JobRecord
from fabricctl.core.mix import count_endpoints, endpoint_of, mix
from fabricctl.core.records import Source
from fabricctl.core.types import Item
from fabricctl.fmt import endpoint_mix
from fabricctl.formats.reader import parse_lines


def mixed(n: int, first_line: int = 1) -> list[Item]:
    """n items cycling chat, chat, embeddings, rerank (stated endpoints, native source)."""
    cycle = [Source.CHAT, Source.CHAT, Source.EMBEDDINGS, Source.RERANK]
    return [Item(f"r-{k}", MODEL, 7 + k % 3, 20, 4, b"p", line=first_line + k,
                 endpoint=int(cycle[k % 4])) for k in range(n)]


def test_the_reader_states_every_lines_endpoint() -> None:
    lines = [b'{"id": "a", "model": "m", "prompt": "x", "max_tokens": 3}',
             b'{"id": "b", "model": "m", "messages": [{"role": "user", "content": "x"}], '
             b'"max_tokens": 3}',
             b'{"id": "c", "model": "m", "endpoint": "rerank", '
             b'"params": {"query": "q", "documents": ["a"]}}',
             b'{"id": "d", "model": "m", "endpoint": "responses", "params": {"input": "hi"}}',
             b'{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", '
             b'"body": {"model": "m", "input": "hi"}}',
             b'{"custom_id": "f", "method": "POST", "url": "/score", '
             b'"body": {"model": "m", "text_1": "q", "text_2": "d"}}',
             b'{"custom_id": "g", "method": "POST", "url": "/v1/completions", '
             b'"body": {"model": "m", "prompt": "q"}}']
    got = [p.item for p in parse_lines(lines)]  # type: ignore[union-attr]
    assert [it.endpoint for it in got] == [Source.COMPLETIONS, Source.CHAT, Source.RERANK,
                                           Source.RESPONSES, Source.EMBEDDINGS, Source.SCORE,
                                           Source.COMPLETIONS]
    assert [it.source for it in got][:4] == [0, 0, 0, 0]  # native: only `endpoint` says it


def test_an_unstated_endpoint_falls_back_to_the_source_else_unknown() -> None:
    hand = [Item("a", MODEL, 1, 5, 4), Item("b", MODEL, 1, 5, 4, source=Source.SCORE),
            Item("c", MODEL, 1, 5, 4, source=Source.CHAT, endpoint=Source.CHAT)]
    assert [endpoint_of(it) for it in hand] == [0, Source.SCORE, Source.CHAT]
    assert count_endpoints(hand) == {0: 1, Source.SCORE: 1, Source.CHAT: 1}
    assert count_endpoints([]) == {}


def test_counts_per_endpoint_once_per_item_and_across_a_restart(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("submit", 100.0, name="in.jsonl")
    assert j.endpoints == {}
    assert s.submit(mixed(40), 100.0, job=j.number) == ([], 0)
    want = {"chat": 20, "embeddings": 10, "rerank": 10}
    assert s.job(j.number).endpoints == want  # type: ignore[union-attr]
    # a resumed submit sends the same lines again: stored ones are skipped, not counted
    rejects, skipped = s.submit(mixed(40), 100.0, job=j.number, resume=True)
    assert (rejects, skipped) == ([], 40)
    assert s.job(j.number).endpoints == want  # type: ignore[union-attr]
    # duplicates refused within the job add nothing either
    dup, _ = s.submit(mixed(2), 100.0, job=j.number)
    assert len(dup) == 2 and s.job(j.number).endpoints == want  # type: ignore[union-attr]
    s.close()

    s = store(tmp_path, 200.0)  # the record is read back from LMDB
    assert s.job(j.number).endpoints == want  # type: ignore[union-attr]
    more = [Item(f"x-{k}", MODEL, 9, 20, 4, b"p", line=41 + k, source=int(Source.SCORE))
            for k in range(5)]  # an OpenAI score line built by hand: its source says it
    assert s.submit(more, 200.0, job=j.number) == ([], 0)
    rec = s.job(j.number)
    assert rec is not None and rec.total == 45
    assert rec.endpoints == {**want, "score": 5}
    assert sum(rec.endpoints.values()) == rec.total
    s.close()
    s = store(tmp_path, 300.0)
    assert s.job(j.number).endpoints == {**want, "score": 5}  # type: ignore[union-attr]
    s.close()


def test_a_record_written_before_the_mix_decodes_with_none() -> None:
    old = msgspec.msgpack.encode({"number": 3, "id": "batch_3", "kind": "submit", "total": 9})
    rec = msgspec.msgpack.decode(old, type=JobRecord)
    assert rec.endpoints == {} and rec.total == 9


def test_mix_parts_and_their_text() -> None:
    parts = mix({"embeddings": 20, "chat": 80, "score": 0})
    assert [(p.endpoint, p.items, p.share) for p in parts] == [("chat", 80, 0.8),
                                                               ("embeddings", 20, 0.2)]
    assert endpoint_mix({"chat": 80, "embeddings": 20}) == "chat 80% · embed 20%"
    assert endpoint_mix({"chat": 12}) == "chat"
    assert endpoint_mix({}) == "-"
    three = {"chat": 60, "embeddings": 30, "rerank": 9, "score": 1}
    assert endpoint_mix(three) == "chat 60% · embed 30% · +2"
    assert endpoint_mix(three, most=4) == "chat 60% · embed 30% · rerank 9% · score 1%"
    assert endpoint_mix({"chat": 999, "responses": 1}) == "chat >99% · responses <1%"
    assert endpoint_mix({"completions": 3, "embeddings": 1}) == "completions 75% · embed 25%"
    assert endpoint_mix(three, short=False, most=2) == "chat 60% · embeddings 30% · +2"
