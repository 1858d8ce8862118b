"""The daemon's event loop: uvloop when installed, asyncio's own otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from server_helpers import CONTRACT, make_items, running_server

from fabricctl.client import Client
from fabricctl.core.types import ItemResult
from fabricctl.server import eventloop


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
        path = server.cfg.socket_path
        producer = await Client.connect(path, "producer", "p")
        assert (await producer.submit(make_items(8))).accepted == 8
        consumer = await Client.connect(path, "consumer", "c")
        await consumer.register("c", CONTRACT)
        work = await consumer.pull(5.0)
        assert work is not None
        assert await consumer.complete(work.id, [ItemResult(i.id) for i in work.items]) == 8
        await consumer.close()
        await producer.close()
        return eventloop.loop_name(), len(work.items), list(server.metrics.latencies)


def test_the_broker_serves_on_uvloop_and_times_pulls_below_a_millisecond(
    tmp_path: Path,
) -> None:
    """uvloop's clock counts whole milliseconds (and stands still within a loop turn), so a
    pull answered at once would read 0 s on it; the broker times pulls on perf_counter."""
    name, n, latencies = eventloop.run(_serve_one_batch(tmp_path))
    assert (name, n) == ("uvloop", 8)
    assert len(latencies) == 1
    assert 0.0 < latencies[0] < 0.5
