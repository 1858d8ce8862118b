"""The broker over real sockets: many producers and consumers, pre-warm order, the edges.

Every test starts a `BrokerServer` over a `DurableBroker` in a temporary data dir inside
its own event loop (tests/server_helpers.py) and talks to it through `Client`.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from server_helpers import (
    MODEL,
    SIG_A,
    SIG_B,
    Tally,
    WireConsumer,
    all_results,
    make_items,
    results_by_id,
    run_consumer,
    running_server,
)
from store_helpers import SyncStore

from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Contract, Item, Prewarm
from fabricctl.errors import BrokerError
from fabricctl.server.signals import push_signals
from fabricctl.wire.client import Client


async def produce(address: Path, items: list[Item], chunk: int) -> int:
    client = await Client.connect(address, "producer", "p")
    accepted = 0
    try:
        for k in range(0, len(items), chunk):
            ack = await client.submit(items[k:k + chunk])
            assert ack.rejects == []
            accepted += ack.accepted
    finally:
        await client.close()
    return accepted


async def test_many_producers_and_consumers_give_one_result_per_item(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        batches = [
            make_items(300, SIG_A, 100, "a"),
            make_items(300, SIG_B, 260, "b"),
            [Item(f"c{k}", MODEL, SIG_A, 20 + (k * 37) % 900, 8) for k in range(300)],
        ]
        total = sum(len(b) for b in batches)
        tally = Tally(total)
        clients = [await Client.connect(path, "consumer", f"c{k}") for k in range(3)]
        consumers = [
            asyncio.ensure_future(run_consumer(c, f"c{k}", f"by c{k}", tally.reached, tally))
            for k, c in enumerate(clients)
        ]
        accepted = await asyncio.gather(*(produce(path, b, 25) for b in batches))
        assert accepted == [300, 300, 300]
        await asyncio.wait_for(tally.reached.wait(), 30.0)
        done = await asyncio.gather(*consumers)
        assert sum(done) == total
        assert all(n > 0 for n in done)  # every consumer took part

        observer = await Client.connect(path, "observer")
        results = await all_results(observer)
        by_id = results_by_id(results)
        wanted = {it.id for b in batches for it in b}
        assert set(by_id) == wanted
        assert all(len(recs) == 1 for recs in by_id.values())
        assert len(results) == total
        ledger = await observer.ledger()
        assert ledger["difference"] == [0, 0]
        assert server.state.store.counters().results_stored == total
        for c in [*clients, observer]:
            await c.close()


async def test_every_consumer_gets_the_prewarm_before_the_warming_shapes_batches(
    tmp_path: Path,
) -> None:
    # B = 1024 tokens: shape A (8000 tokens) activates first, B (6000) warms when A falls
    # below 4 B, A drains below 1 B, then B activates with the next epoch.
    contract = Contract(MODEL, 8, 1024, 4096)
    # "model" scope: every consumer of the model warms; these wire consumers are no
    # simulated engine, so pre-warm is on rather than "auto"
    async with running_server(tmp_path, CoreConfig(shape_scope="model", prewarm="on")) as server:
        path = server.state.cfg.socket_path
        wires = [await WireConsumer.connect(path, f"w{k}", contract) for k in range(3)]
        items = make_items(80, SIG_A, 100, "a") + make_items(60, SIG_B, 100, "b")
        tally = Tally(len(items))

        async def drive(wc: WireConsumer) -> None:
            while not tally.reached.is_set():
                work = await wc.pull(0.2)
                if work is not None:
                    tally.add(await wc.complete(work, wc.name))

        loops = [asyncio.ensure_future(drive(wc)) for wc in wires]
        assert await produce(path, items, len(items)) == len(items)
        await asyncio.wait_for(asyncio.gather(*loops), 30.0)

        works = [entry for wc in wires for entry in wc.log if entry[0] == "work"]
        assert {sig for _, sig, _ in works} == {SIG_A, SIG_B}  # the model switched shapes
        assert {epoch for _, sig, epoch in works if sig == SIG_A} == {1}
        assert {epoch for _, sig, epoch in works if sig == SIG_B} == {2}
        for wc in wires:
            assert ("push", SIG_B, 2) in wc.log, f"{wc.name} never got the pre-warm: {wc.log}"
            first_push = wc.log.index(("push", SIG_B, 2))
            b_works = [k for k, e in enumerate(wc.log) if e == ("work", SIG_B, 2)]
            assert all(first_push < k for k in b_works), f"{wc.name}: {wc.log}"
        observer = await Client.connect(path, "observer")
        by_id = results_by_id(await all_results(observer))
        assert set(by_id) == {it.id for it in items}
        assert all(len(recs) == 1 for recs in by_id.values())
        await observer.close()
        for wc in wires:
            await wc.close()


def test_a_shape_of_one_queued_item_gets_no_prewarm_push(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its batch computes the prefix a pre-warm would: the signal is dropped, not pushed;
    a shape of two items (one batch, two prefills without it) is still pre-warmed."""
    store = SyncStore(tmp_path / "data", 0.0, CoreConfig(prewarm="on"))
    try:
        store.register("w", Contract(MODEL, 8, 1024, 4096), 0.0)
        assert store.ingest(make_items(1, SIG_A, prefix="a") + make_items(2, SIG_B, prefix="b"),
                            0.0) == []
        sent: list[Any] = []
        peer = SimpleNamespace(consumer="w", simulated=False, send=sent.append)
        state: Any = SimpleNamespace(view=store.view, store=store, consumers={"w": peer})
        signals = [Prewarm(MODEL, sig, "", 1, [], consumer="w") for sig in (SIG_A, SIG_B)]
        monkeypatch.setattr(store, "take_signals", lambda: signals)
        push_signals(state)
        assert [push.signal.signature for push in sent] == [SIG_B]
        assert sent[0].signal.sample is not None
    finally:
        store.close()


async def test_tcp_listener_checks_the_token(tmp_path: Path) -> None:
    async with running_server(tmp_path, listen="127.0.0.1:0", token="s3cret") as server:
        port = server.tcp_port()
        assert port is not None and port > 0
        address = f"127.0.0.1:{port}"
        with pytest.raises(BrokerError) as refused:
            await Client.connect(address, "consumer", "x", token="wrong")
        assert refused.value.code == "auth"
        with pytest.raises(BrokerError):
            await Client.connect(address, "consumer", "x")  # no token at all
        client = await Client.connect(address, "producer", "remote", token="s3cret")
        ack = await client.submit(make_items(3))
        assert ack.accepted == 3
        status = await client.status()
        assert status["difference"] == [0, 0]
        await client.close()


async def test_unix_socket_is_private_to_its_owner(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        mode = stat.S_IMODE(os.stat(server.state.cfg.socket_path).st_mode)
        assert mode == 0o600
        assert stat.S_ISSOCK(os.stat(server.state.cfg.socket_path).st_mode)


async def test_an_unknown_shape_is_an_error_and_the_connection_lives_on(tmp_path: Path
                                                                         ) -> None:
    async with running_server(tmp_path) as server:
        client = await Client.connect(server.state.cfg.socket_path, "observer")
        with pytest.raises(BrokerError) as err:
            await client.shape("0xdeadbeef")
        assert err.value.code == "not_found"
        ledger = await client.ledger()
        assert ledger["difference"] == [0, 0]
        await client.close()


async def test_prometheus_endpoint_serves_the_ledger(tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0) as server:
        port = server.metrics_port()
        assert port is not None and port > 0
        assert server.tcp_port() is None  # the metrics port is not the consumer listener
        client = await Client.connect(server.state.cfg.socket_path, "producer")
        assert (await client.submit(make_items(5, tokens=40))).accepted == 5
        await client.close()
        async with httpx.AsyncClient() as http:
            res = await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0)
            missing = await http.get(f"http://127.0.0.1:{port}/nope", timeout=5.0)
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/plain")
        body = res.text
        assert "fabricctl_items_received_total 5.0" in body
        assert "fabricctl_tokens_received_total 200.0" in body
        assert 'fabricctl_ledger_difference{unit="items"} 0.0' in body
        assert 'fabricctl_ledger_difference{unit="tokens"} 0.0' in body
        assert missing.status_code == 404
