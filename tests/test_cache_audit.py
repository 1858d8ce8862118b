"""The cache-truth audit: a shape whose engines hit far below what its prefix allows is flagged."""

from __future__ import annotations

from fabricctl.core.broker import Broker
from fabricctl.core.events import EventKind
from fabricctl.core.types import Contract, Item


def setup() -> tuple[Broker, int]:
    b = Broker()
    b.register("c", Contract("m", 64, 100_000, 8192), 0.0)
    b.ingest([Item(f"i{k}", "m", 7, 1000, 8) for k in range(64)], 0.0)
    batch = b.pull("c", 0.0)
    assert batch is not None
    return b, batch.id


def test_honest_prefix_is_not_flagged() -> None:
    b, batch = setup()
    b.record_cache(batch, queries=64_000, hits=50_000, achievable=51_200, now=1.0)
    [view] = b.snapshot(1.0).shapes
    assert (view.cache_hit_rate, view.cache_achievable, view.cache_flagged) == (
        0.7812, 0.8, False)
    assert [e for e in b.events.since(0) if e.kind is EventKind.GUARD] == []


def test_a_declared_prefix_that_is_not_a_real_prefix_is_flagged_once() -> None:
    b, batch = setup()
    b.record_cache(batch, queries=64_000, hits=1_024, achievable=51_200, now=1.0)
    b.record_cache(batch, queries=64_000, hits=1_024, achievable=51_200, now=2.0)
    [view] = b.snapshot(2.0).shapes
    assert view.cache_flagged is True
    [ev] = [e for e in b.events.since(0) if e.kind is EventKind.GUARD]
    assert ev.critical is True
    assert ev.t == 1.0
    assert "not a token-identical prefix" in ev.reason


def test_too_few_lookups_are_not_judged() -> None:
    b, batch = setup()
    b.record_cache(batch, queries=1_000, hits=0, achievable=800, now=1.0)
    assert b.snapshot(1.0).shapes[0].cache_flagged is False


def test_unknown_batch_is_ignored() -> None:
    b, _ = setup()
    b.record_cache(999, queries=64_000, hits=0, achievable=50_000, now=1.0)
    assert b.snapshot(1.0).shapes[0].cache_hit_rate == 0.0
