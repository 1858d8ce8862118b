"""Writes in three steps (prepare, commit, apply) and the server's writer that runs them:
what may happen between the steps (a disconnect, a tick, a shape switch, an ingest into the
segment a completion empties, a refused commit) loses nothing and stores no second result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from server_helpers import make_items, running_server
from store_helpers import SyncStore

from fabricctl.core.types import Contract, Item, ItemResult, Work
from fabricctl.errors import BrokerError, StoreFullError
from fabricctl.server.writer import Writer
from fabricctl.store.durable import DurableBroker, StoreConfig
from fabricctl.store.env import MiB
from fabricctl.store.steps import run_steps
from fabricctl.wire.client import Client

MODEL = "m"
SIG = 0xBEEF
CONTRACT = Contract(MODEL, 4, 4096, 4096)


def items(n: int, prefix: str = "i", sig: int = SIG, tokens: int = 100,
          payload: bytes = b"p") -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, sig, tokens, 8, payload) for k in range(n)]


def answer(w: Work) -> list[ItemResult]:
    return [ItemResult(it.id, text=f"r:{it.id}") for it in w.items]


def result_ids(store: DurableBroker) -> list[str]:
    return [rec.id for _, rec in store.results_since(0, limit=1_000_000)]


def drain(store: DurableBroker, now: float = 1.0) -> int:
    if "drain" not in store.view.consumers:
        store.register("drain", Contract(MODEL, 64, 1 << 20, 4096), now)
    n = 0
    for name in list(store.view.consumers):  # "consumer" scope: a shape's holder drains it
        while (w := store.pull(name, now)) is not None:
            n += store.complete(w.id, answer(w), now)
    return n


@pytest.fixture
def store(tmp_path: Path) -> DurableBroker:
    s = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=64))
    yield s  # type: ignore[misc]
    s.close()


def test_a_disconnect_while_a_completion_commits_leaves_that_batch_to_it(
    store: DurableBroker,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(12), 0.0)
    settling = store.pull("gpu", 0.0)
    received = store.pull("gpu", 0.0)  # its completion arrived, not yet prepared
    held = store.pull("gpu", 0.0)  # nothing came back for this one
    assert settling and received and held
    plan = run_steps(store.steps.complete([(settling.id, answer(settling), None)], 0.0))
    assert store.disconnect("gpu", 0.0, "socket closed", keep={received.id}) == 4
    store.fail(settling.id, 0.0, "late fail")  # ignored: its completion is settling
    store.steps.commit(complete=plan)
    assert run_steps(store.steps.apply_complete(plan, 0.0)) == [4]
    assert store.complete_many([(received.id, answer(received), None)], 0.0) == [4]
    # only the batch nobody answered went back; every item ends with one result
    assert store.view.ledger.items_queued == 4
    assert drain(store) == 4
    assert sorted(result_ids(store)) == sorted(f"i{k}" for k in range(12))
    assert store.view.ledger.difference() == (0, 0)
    assert store.view.settling == set()


def test_a_failed_completion_commit_returns_an_orphaned_batch(
    store: DurableBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(4), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    plan = run_steps(store.steps.complete([(w.id, answer(w), None)], 0.0))
    store.disconnect("gpu", 0.0, "gone")
    assert w.id in store.view.inflight  # settling: the disconnect left it

    def broken(*a: object, **k: object) -> None:
        raise StoreFullError("write refused: disk full")

    monkeypatch.setattr(store.steps, "commit", broken)
    with pytest.raises(StoreFullError):
        store.steps.commit(complete=plan)
    store.steps.abort_complete(plan, 0.0)
    assert w.id not in store.view.inflight
    assert store.view.ledger.items_queued == 4  # back in its lane, nobody else would send it
    monkeypatch.undo()
    assert drain(store) == 4


def test_placements_retired_while_their_commit_runs_join_the_open_shape(
    store: DurableBroker,
) -> None:
    plan = run_steps(store.steps.ingest(items(10), 0.0))
    store.tick(100.0)  # the new shape is empty and staged: the tick drops it
    assert SIG not in store.view.models[MODEL].open
    store.steps.commit(ingest=plan)
    assert run_steps(store.steps.apply_ingest(plan, 100.0)) == []
    shape = store.view.models[MODEL].open[SIG]
    assert shape.items == 10
    assert sum(len(lane.queue) for lane in shape.lanes.lanes.values()) == 10
    assert drain(store, 101.0) == 10
    assert store.view.ledger.difference() == (0, 0)


def test_an_ingest_into_the_segment_a_completion_empties_keeps_it(
    store: DurableBroker,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(4), 0.0)
    (seg_id,) = store.segs
    w = store.pull("gpu", 0.0)
    assert w is not None and len(w.items) == 4
    cp = run_steps(store.steps.complete([(w.id, answer(w), None)], 0.0))
    ip = run_steps(store.steps.ingest(items(3, prefix="late"), 0.0))  # grows the same segment
    assert [r.seg_id for r in ip.runs] == [seg_id]
    store.steps.commit(ingest=ip, complete=cp)
    run_steps(store.steps.apply_ingest(ip, 0.0))
    run_steps(store.steps.apply_complete(cp, 0.0))
    assert store.segs[seg_id].count == 7 and store.segs[seg_id].deleted == 4
    store.close()
    again = SyncStore(store.env.data_dir, 1.0, store=StoreConfig(segment_entries=64))
    assert again.recovery.items == 3 and again.recovery.ledger_ok
    assert drain(again) == 3
    assert sorted(result_ids(again)) == sorted([f"i{k}" for k in range(4)]
                                               + [f"late{k}" for k in range(3)])
    again.close()


@pytest.mark.parametrize("threaded", [True, False])
async def test_the_writer_commits_submits_and_completions_together(
    store: DurableBroker, threaded: bool,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(4), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    commits: list[int] = []
    writer = Writer(store, lambda: 1.0, lambda: commits.append(1), max_items=64,
                    max_batches=4, max_wait_s=0.05, threaded=threaded)
    writer.start()
    bad = [Item("", MODEL, SIG, 1, 1, b"")]
    got = await asyncio.gather(writer.submit(items(5, prefix="a")),
                               writer.submit(bad + items(2, prefix="b")),
                               writer.complete((w.id, answer(w), 0)))
    await writer.stop()
    assert got[0] == [] and [r.index for r in got[1]] == [0] and got[2] == 4
    assert writer.commits == 1 and len(commits) == 1  # one transaction for all three
    assert store.view.ledger.items_queued == 7
    assert drain(store) == 7


async def test_a_refused_ingest_lets_the_completions_commit_alone(tmp_path: Path) -> None:
    cfg = StoreConfig(map_size=1 * MiB, map_ceiling=1 * MiB, segment_entries=64)
    store = SyncStore(tmp_path / "d", 0.0, store=cfg)
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(4), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    writer = Writer(store, lambda: 1.0, lambda: None, max_items=4096, max_batches=4,
                    max_wait_s=0.05)
    writer.start()
    huge = items(3000, prefix="big", payload=b"x" * 600)  # more than the map can take
    sub, done = await asyncio.gather(writer.submit(huge), writer.complete((w.id, answer(w), 0)),
                                     return_exceptions=True)
    await writer.stop()
    assert isinstance(sub, StoreFullError) and "ingest refused" in str(sub)
    assert done == 4
    assert sorted(result_ids(store)) == [f"i{k}" for k in range(4)]
    assert store.view.ledger.difference() == (0, 0)
    store.close()


async def test_a_refused_completion_commit_is_an_error_and_the_batch_goes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        producer = await Client.connect(path, "producer", "p")
        assert (await producer.submit(make_items(4))).accepted == 4
        first = await Client.connect(path, "consumer", "first")
        await first.register("first", CONTRACT)
        w = await first.pull(1.0)
        assert w is not None and len(w.items) == 4
        store = server.state.store
        real = store.env.finish

        def refuse(staged: Any, drain: bool = False) -> bool:  # as a failed LMDB commit does
            staged.txn.abort()
            raise StoreFullError("write refused: the disk is full (test)")

        monkeypatch.setattr(store.env, "finish", refuse)
        with pytest.raises(BrokerError, match="disk is full"):
            await first.complete(w.id, answer(w))
        monkeypatch.setattr(store.env, "finish", real)
        await first.close()  # its batch was not settled: it goes back when it leaves
        second = await Client.connect(path, "consumer", "second")
        await second.register("second", CONTRACT)
        again = await second.pull(5.0)
        assert again is not None and sorted(it.id for it in again.items) == sorted(
            it.id for it in w.items)
        assert await second.complete(again.id, answer(again)) == 4
        assert store.view.ledger.difference() == (0, 0)
        assert store.view.settling == set()
        for c in (producer, second):
            await c.close()
