"""Broker.withdraw: queued entries leave their lanes unrun (a cancelled job's), in-flight ones
stay, and the ledger balances at every step (fabricctl.core.withdrawal)."""

from __future__ import annotations

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Contract, Item


def loaded() -> Broker:
    b = Broker(CoreConfig(lifecycle=False))
    b.register("c", Contract("m", 4, 100_000, 4096), 0.0)
    b.ingest([Item(f"a{i}", "m", 1, 10 + i, 4) for i in range(10)], 0.0)
    b.ingest([Item(f"b{i}", "m", 2, 500, 4) for i in range(6)], 0.0)
    return b


def queued_keys(b: Broker) -> set[int]:
    return {e.key for s in b.shapes() for la in s.lanes.lanes.values() for e in la.queue}


def test_withdraw_takes_queued_only_and_the_ledger_balances() -> None:
    b = loaded()
    batch = b.pull("c", 1.0)
    assert batch is not None
    flying = {e.key for e in batch.entries}
    before = queued_keys(b)
    assert not before & flying
    out = b.withdraw(lambda e: e.key % 2 == 0)
    taken = {e.key for _, _, e in out}
    assert taken == {k for k in before if k % 2 == 0}  # every even queued key, none in flight
    assert queued_keys(b) == before - taken
    assert b.ledger.difference() == (0, 0) and b.ledger.consistent()
    assert b.ledger.items_queued == len(before) - len(taken)
    assert sum(s.items for s in b.shapes()) == len(before) - len(taken)
    assert sum(s.tokens for s in b.shapes()) == sum(
        e.tokens for s in b.shapes() for la in s.lanes.lanes.values() for e in la.queue)
    b.settle_withdrawn(out)
    assert b.ledger.items_completed == len(taken) and b.ledger.consistent()
    b.complete(batch.id, 2.0)
    while (nb := b.pull("c", 3.0)) is not None:  # what is left goes out; nothing taken does
        assert not {e.key for e in nb.entries} & taken
        b.complete(nb.id, 3.0)
    assert b.ledger.items_completed == 16 and b.ledger.consistent()


def test_withdraw_limited_to_models_and_returned_to_the_front() -> None:
    b = loaded()
    assert b.withdraw(lambda e: True, models=["other"]) == []
    out = b.withdraw(lambda e: True, models=["m"])
    assert len(out) == 16 and queued_keys(b) == set()
    assert b.pull("c", 1.0) is None
    b.return_withdrawn(out, 2.0)
    assert b.ledger.items_queued == 16 and b.ledger.consistent()
    lanes = {(s.signature, la.id): [e.key for e in la.queue]
             for s in b.shapes() for la in s.lanes.lanes.values()}
    for (sig, lane_id), keys in lanes.items():
        want = [e.key for s, la, e in out if s.signature == sig and la.id == lane_id]
        assert keys == want  # their order kept
    got = 0
    while (nb := b.pull("c", 3.0)) is not None:
        got += len(nb.entries)
        b.complete(nb.id, 3.0)
    assert got == 16
