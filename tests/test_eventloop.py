"""The daemon's event loop: uvloop when installed, asyncio's own otherwise."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from server_helpers import CONTRACT, make_items, running_server

from fabricctl.core.types import ItemResult
from fabricctl.server import eventloop
from fabricctl.server.writer import Writer
from fabricctl.store.durable import DurableBroker
from fabricctl.wire.client import Client


async def _which() -> str:
    return eventloop.loop_name()


def test_run_uses_uvloop_when_installed() -> None:
    assert eventloop.run(_which()) == "uvloop"


def test_run_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # the import fails
    assert eventloop.run(_which()) == "asyncio"


def test_run_on_asyncio_when_asked() -> None:
    assert eventloop.run(_which(), prefer_uvloop=False) == "asyncio"


async def _serve_one_batch(tmp_path: Path) -> tuple[str, int, list[float]]:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        producer = await Client.connect(path, "producer", "p")
        assert (await producer.submit(make_items(8))).accepted == 8
        consumer = await Client.connect(path, "consumer", "c")
        await consumer.register("c", CONTRACT)
        work = await consumer.pull(5.0)
        assert work is not None
        assert await consumer.complete(work.id, [ItemResult(i.id) for i in work.items]) == 8
        await consumer.close()
        await producer.close()
        return eventloop.loop_name(), len(work.items), list(server.state.metrics.latencies)


def test_the_broker_serves_on_uvloop_and_times_pulls_below_a_millisecond(
    tmp_path: Path,
) -> None:
    """uvloop's clock counts whole milliseconds (and stands still within a loop turn), so a
    pull answered at once would read 0 s on it; the broker times pulls on perf_counter."""
    name, n, latencies = eventloop.run(_serve_one_batch(tmp_path))
    assert (name, n) == ("uvloop", 8)
    assert len(latencies) == 1
    assert 0.0 < latencies[0] < 0.5


async def _lone_submits(data: Path, n: int) -> tuple[str, float, float]:
    store = DurableBroker(data, 0.0)
    writer = Writer(store, lambda: 1.0, lambda: None)  # waits up to 2 ms for company
    writer.start()
    t, cpu = time.perf_counter(), time.thread_time()
    for k in range(n):
        assert await writer.submit(make_items(1, prefix=f"lone{k}-")) == []
    wall, cpu = time.perf_counter() - t, time.thread_time() - cpu
    await writer.stop()
    store.close()
    return eventloop.loop_name(), wall, cpu


def test_the_writer_sleeps_while_it_waits_for_a_fuller_cycle_on_uvloop(tmp_path: Path) -> None:
    """A lone submit waits `max_wait_s` for company. uvloop runs a sub-millisecond sleep at
    once, so waiting in such sleeps spun the loop for the whole wait."""
    name, wall, cpu = eventloop.run(_lone_submits(tmp_path / "d", 20))
    assert name == "uvloop"
    assert wall >= 20 * 0.002  # each one waited
    assert cpu < 0.4 * wall  # asleep meanwhile, not spinning
