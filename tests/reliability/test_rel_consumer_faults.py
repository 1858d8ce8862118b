"""Consumer faults: `fabricctl consume` killed or frozen holding a batch; a consumer that
loses its connection in the middle of a pre-warm.

The broker runs in the test's event loop (short heartbeats: 0.2 s, timeout 1 s). A victim
consumer process takes a batch (the broker shows it in flight), then is SIGKILLed, or
SIGSTOPped past the heartbeat timeout and resumed after another consumer has completed its
batch: its late completion must not make a second result. Every item ends with exactly one
result, from the consumer that finished it.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from rel_broker import BrokerProc, write_config
from rel_history import MODEL, TOTALS, History, check, make_item
from rel_inproc import FaultyEngine, live_broker, results, settled, submit, until

import fabricctl.supervisor.consumer as consumer_mod
from fabricctl.core.config import CoreConfig
from fabricctl.server.app import BrokerServer
from fabricctl.supervisor.consumer import Consumer
from fabricctl.wire.client import Client

SLOW = """\
model = "m"
[sim]
time_scale = 5.0
[consumer]
max_batch_size = 16
max_batch_tokens = 4096
max_input_len = 4096
"""
N = 64


def held(server: BrokerServer, name: str) -> tuple[int, list[str]] | None:
    """The batch a consumer holds, as the broker sees it."""
    c = server.state.view.consumers.get(name)
    if c is None or not c.batches:
        return None
    batch = min(c.batches)
    items = server.state.store.work.get(batch)
    return (batch, [it.id for it in items]) if items else None


async def victim_holding(server: BrokerServer, tmp: Path, hist: History,
                         ) -> tuple[BrokerProc, int, list[str]]:
    """A `fabricctl consume` process with a slow simulated GPU, holding its first batch."""
    victim = BrokerProc.consume(server.state.cfg.data_dir, write_config(tmp, SLOW), tmp,
                                "victim", 7)
    await victim.spawn()
    await until(lambda: "victim" in server.state.consumers, 20, "the victim registered")
    await submit(server.state.cfg.socket_path, [make_item(n) for n in range(N)], hist)
    await until(lambda: held(server, "victim") is not None, 20, "the victim holds a batch")
    got = held(server, "victim")
    assert got is not None
    batch, ids = got
    hist.dispatch("victim", batch, ids)
    return victim, batch, ids


async def rescue(server: BrokerServer, hist: History, held_ids: list[str]) -> list:
    """Another consumer finishes everything; every result is checked against the history."""
    stop = asyncio.Event()
    rescuer = Consumer(server.state.cfg.socket_path, "rescuer", MODEL, FaultyEngine("rescuer"),
                       gpu=1, pull_wait_s=0.2)
    task = asyncio.ensure_future(rescuer.run(stop))
    try:
        await until(settled(server, N), 30, "every item settled")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    res = await results(server.state.cfg.socket_path)
    report = check(hist, res)
    assert report.clean(), str(report)
    assert report.recovered >= len(held_ids)
    by_id = {rec.id: rec for _, rec in res}
    assert all(by_id[i].gpu == 1 for i in held_ids)  # the rescuer's, never the victim's
    assert server.state.view.ledger.difference() == (0, 0)
    return res


async def test_consumer_killed_holding_a_batch(tmp_path: Path) -> None:
    async with live_broker(tmp_path / "data") as server:
        hist = History()
        victim, _, ids = await victim_holding(server, tmp_path, hist)
        assert victim.proc is not None
        victim.kill()
        assert await victim.wait(10) == -signal.SIGKILL
        TOTALS.kills += 1
        hist.crash("consumer killed")
        await until(lambda: "victim" not in server.state.consumers, 10, "the broker saw the death")
        await rescue(server, hist, ids)


async def test_consumer_frozen_past_heartbeat_then_resumed(tmp_path: Path) -> None:
    async with live_broker(tmp_path / "data") as server:
        hist = History()
        victim, batch, ids = await victim_holding(server, tmp_path, hist)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: "victim" not in server.state.consumers, 10,
                        "the broker dropped the silent consumer")
            hist.crash("consumer frozen past the heartbeat timeout")
            await rescue(server, hist, ids)
            before = server.state.store.meta.rseq
            mark = len(victim.lines)
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        # the resumed consumer finishes its batch; its completion is refused, not stored
        await victim.wait_line(f"completion of batch {batch} not confirmed", 30, mark)
        await until(lambda: "victim" in server.state.consumers, 20, "the victim came back")
        assert server.state.store.meta.rseq == before
        again = await results(server.state.cfg.socket_path)
        assert len(again) == N and len({rec.id for _, rec in again}) == N
        victim.proc.send_signal(signal.SIGTERM)
        assert await victim.wait(20) == 0, victim.tail()


async def test_consumer_disconnected_during_prewarm(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    clients: dict[str, Client] = {}

    class Recording(Client):
        @classmethod
        async def connect(cls, *a: object, **kw: object) -> Client:  # type: ignore[override]
            c = await super().connect(*a, **kw)  # type: ignore[arg-type]
            clients[str(a[2] if len(a) > 2 else kw.get("name", ""))] = c
            return c

    monkeypatch.setattr(consumer_mod, "Client", Recording)
    # the second shape waits for pre-warm, not a timer; every consumer of the model warms
    core = CoreConfig(stage_timeout_s=60.0, shape_scope="model", prewarm="on")
    async with live_broker(tmp_path / "data", core=core) as server:
        hist = History()
        warm = FaultyEngine("warm")
        warm.prewarm_gate = asyncio.Event()
        steady = FaultyEngine("steady", time_scale=0.002)
        stop = asyncio.Event()
        consumers = [Consumer(server.state.cfg.socket_path, "warm", MODEL, warm, gpu=0,
                              pull_wait_s=0.2),
                     Consumer(server.state.cfg.socket_path, "steady", MODEL, steady, gpu=1,
                              pull_wait_s=0.2)]
        tasks = [asyncio.ensure_future(c.run(stop)) for c in consumers]
        try:
            await until(lambda: {"warm", "steady"} <= set(server.state.consumers), 10, "registered")
            # two shapes in one commit (~18k and ~12k tokens): one activates, the other is
            # staged past its threshold and warms as soon as the first falls below 4 budgets
            first = [make_item(n) for n in range(0, 3 * 90, 3)]
            second = [make_item(n) for n in range(1, 3 * 60, 3)]
            await submit(server.state.cfg.socket_path, first + second, hist, chunk=150)
            await asyncio.wait_for(warm.prewarming.wait(), 20)  # a pre-warm is under way
            await clients["warm"].close()  # ... and its connection goes
            await until(lambda: "warm" not in server.state.consumers, 10, "the broker saw it go")
            hist.crash("consumer disconnected during a pre-warm")
            warm.prewarm_gate.set()
            await until(settled(server, len(first) + len(second)), 30, "every item settled")
        finally:
            stop.set()
            warm.prewarm_gate.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
        res = await results(server.state.cfg.socket_path)
        report = check(hist, res)
        assert report.clean(), str(report)
        assert server.state.view.ledger.difference() == (0, 0)
        lost = [e for e in server.state.view.events.since(0, 10_000) if e.kind == "consumer_lost"]
        assert any("warm" in (e.reason or "") for e in lost), lost
