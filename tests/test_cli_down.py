"""`fabricctl down` with work in flight: the batches in flight finish, none goes back.

Promise checked: `down` stops the broker as Ctrl-C does. Its own consumers stop pulling and
finish the batches they hold (their results are stored), and only then do the sockets
close. The log says the stop was asked, and no consumer is "lost (broker stopping)" with
items sent back to their lanes to be run again. The data dir, started again, holds every
result the stopped broker stored.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
from cli_helpers import Broker

from fabricctl.wire.client import Client

ITEMS = 3000


def _held(consumers: list[dict[str, Any]]) -> int:
    """Batches the consumers hold and have not answered yet."""
    return sum(int(c["batches_inflight"]) - int(c.get("batches_settling", 0))
               for c in consumers)


async def _wait_for_work_in_flight(data_dir: Path) -> int:
    """Bounded polling until a consumer holds a batch; the batches held then."""
    c = await Client.connect(data_dir, "observer", "test-down")
    try:
        deadline = time.monotonic() + 60
        while True:
            held = _held(msgspec.to_builtins(await c.consumers()))
            if held:
                return held
            assert time.monotonic() < deadline, "no batch went in flight"
            await asyncio.sleep(0.02)
    finally:
        await c.close()


async def _results(data_dir: Path) -> int:
    c = await Client.connect(data_dir, "observer", "test-down")
    try:
        st = await c.status()
        return int(st["extra"]["store"]["results"])
    finally:
        await c.close()


def test_down_lets_in_flight_batches_finish(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text("[sim]\ntime_scale = 0.05\n")  # batches take a while
    broker = Broker(tmp_path / "data", tmp_path)
    lines = b"".join(
        b'{"id": "i%d", "model": "fabric-demo", "prefix": ["SYS-%d"], "prompt": "%s", '
        b'"max_tokens": 16}\n' % (i, i % 4, b"x" * (40 + i % 200)) for i in range(ITEMS))
    sub = broker.run("submit", "-", input=lines)
    assert sub.returncode == 0, sub.stderr
    assert asyncio.run(_wait_for_work_in_flight(broker.data_dir)) > 0
    assert broker.stop() == 0  # `fabricctl down`, then the exit status of `up`
    log = (tmp_path / "broker-data.log").read_text(errors="replace")  # stop() closed it
    assert "broker stopping" not in log, log  # no consumer dropped holding work
    assert "items back to their lanes" not in log, log
    assert "asked the broker to stop" in log and "finishing in-flight batches" in log

    again = Broker(tmp_path / "data", tmp_path)  # the same data dir, started again
    try:
        assert asyncio.run(_results(again.data_dir)) > 0  # what finished at the stop was stored
    finally:
        again.proc.kill()
        again.proc.wait()
        again.log.close()
