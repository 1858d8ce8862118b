"""Engine faults under a live broker: down, hung, aborting and poisoned engines.

Consumers (fabricctl.supervisor.consumer.Consumer) drive a `FaultyEngine` (a SimEngine that
misbehaves on purpose). Every item must end with exactly one result: the engine's own when
a retry could get it, else an error result that says why (a quarantined poison item). A
consumer that keeps dying on one batch is bounded by the broker's delivery count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rel_history import MODEL, History, check, make_item
from rel_inproc import FaultyEngine, Watched, live_broker, results, settled, submit, until

from fabricctl.core.types import Contract
from fabricctl.server.app import BrokerServer
from fabricctl.store.durable import StoreConfig
from fabricctl.wire.client import Client

N = 96


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BrokerServer]:
    async with live_broker(tmp_path / "data", StoreConfig(max_deliveries=3)) as srv:
        yield srv


async def drive(server: BrokerServer, engines: list[FaultyEngine], items: int = N,
                extra: list | None = None, **consumer_kw: object,
                ) -> tuple[History, list, list[Watched]]:
    """Submit the workload (one commit), then run one Consumer per engine until every item
    settled; returns the history, the result sequence and the consumers."""
    hist = History()
    work = [make_item(n) for n in range(items)] + list(extra or [])
    await submit(server.state.cfg.socket_path, work, hist, chunk=len(work))
    stop = asyncio.Event()
    consumers = [Watched(server.state.cfg.socket_path, f"c{i}", MODEL, eng, gpu=i,
                         pull_wait_s=0.2, **consumer_kw)  # type: ignore[arg-type]
                 for i, eng in enumerate(engines)]
    for c, eng in zip(consumers, engines, strict=True):
        c.on_fail_back = lambda eng=eng: setattr(eng, "down", False)
    tasks = [asyncio.ensure_future(c.run(stop)) for c in consumers]
    try:
        await until(settled(server, len(work)), 60, "every item settled")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    res = await results(server.state.cfg.socket_path)
    assert server.state.view.ledger.difference() == (0, 0)
    return hist, res, consumers


def errors(res: list) -> dict[str, str]:
    return {rec.id: rec.error or "" for _, rec in res if rec.finish_reason == "error"}


async def test_engine_down_then_back_fails_batches_back(server: BrokerServer) -> None:
    eng = FaultyEngine(down=True)  # back up once the consumer has failed a batch back
    hist, res, consumers = await drive(server, [eng])
    report = check(hist, res)
    assert report.clean(), str(report)
    assert consumers[0].failures == 1
    assert eng.errors >= 3  # the batch, then its items alone, twice
    assert errors(res) == {}  # nothing quarantined: the engine was down, not the items


async def test_hung_engine_times_out_and_items_rerun(server: BrokerServer) -> None:
    eng = FaultyEngine(hang_calls=3)
    hist, res, _ = await drive(server, [eng], run_timeout_s=0.3)
    report = check(hist, res)
    assert report.clean(), str(report)
    assert eng.hangs == 3
    assert errors(res) == {}


async def test_aborted_items_are_run_again(server: BrokerServer) -> None:
    eng = FaultyEngine(abort_every=3, abort_calls=4)
    hist, res, _ = await drive(server, [eng])
    report = check(hist, res)
    assert report.clean(), str(report)
    assert eng.aborts > 0
    assert not [rec.id for _, rec in res if rec.finish_reason == "abort"]
    assert errors(res) == {}


async def test_poison_items_quarantined_while_their_shape_flows(server: BrokerServer) -> None:
    poison = {"r5", "r17", "r40"}
    solo = make_item(0, tag="solo-")  # alone in its batch: only the broker's bound catches it
    solo = solo.__class__(solo.id, solo.model, 0x5010, solo.input_tokens, solo.max_tokens,
                          solo.payload)
    engines = [FaultyEngine("e0", poison=poison | {solo.id}),
               FaultyEngine("e1", poison=poison | {solo.id})]
    hist, res, consumers = await drive(server, engines, extra=[solo])
    report = check(hist, res)
    assert report.clean(), str(report)
    errs = errors(res)
    assert set(errs) == poison | {solo.id}, errs
    for pid in poison:  # isolated by a consumer, or (alone in its batch) bounded by the broker
        assert errs[pid].startswith(("quarantined after 2 attempts: e",
                                     "quarantined after 3 deliveries")), errs[pid]
        assert f"engine crashed on {pid}" in errs[pid]
    assert errs[solo.id].startswith("quarantined after 3 deliveries without a result"), errs
    assert "engine crashed on solo-0" in errs[solo.id]
    assert sum(c.quarantined for c in consumers) >= 1  # consumer-side isolation happened
    quarantined = server.state.store.counters().quarantined
    assert quarantined >= 1  # and the broker's bound did
    assert sum(c.quarantined for c in consumers) + quarantined == len(errs)
    # the poison items' shapes kept flowing: every other item has its engine's answer
    good = [rec for _, rec in res if rec.id not in errs]
    assert len(good) == N - len(poison)


async def test_consumer_crash_loop_is_bounded(server: BrokerServer) -> None:
    """A batch whose consumer dies every time is quarantined after max_deliveries."""
    hist = History()
    item = make_item(0, tag="crash-")
    await submit(server.state.cfg.socket_path, [item], hist)
    contract = Contract(MODEL, 16, 4096, 4096)
    for k in range(3):
        c = await Client.connect(server.state.cfg.socket_path, "consumer", f"doomed{k}")
        await c.register(f"doomed{k}", contract)
        work = await c.pull(5.0)
        assert work is not None and [it.id for it in work.items] == [item.id]
        hist.dispatch(f"doomed{k}", work.id, [item.id])
        await c.close()  # the consumer "crashes" holding the batch
        await until(lambda k=k: f"doomed{k}" not in server.state.consumers, 5, "disconnect seen")
        hist.crash("consumer died")
    c = await Client.connect(server.state.cfg.socket_path, "consumer", "survivor")
    await c.register("survivor", contract)
    assert await c.pull(0.3) is None  # quarantined instead of a fourth delivery
    await c.close()
    res = await results(server.state.cfg.socket_path)
    report = check(hist, res, text_ok=lambda rec: rec.finish_reason == "error")
    assert report.clean(), str(report)
    (_, rec), = res
    assert rec.error is not None and rec.error.startswith(
        "quarantined after 3 deliveries without a result; last: consumer doomed2 lost"), rec
    assert server.state.view.ledger.difference() == (0, 0)
    assert server.state.view.ledger.items_completed == 1
