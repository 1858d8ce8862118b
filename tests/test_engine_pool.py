"""OpenAIEngine's connections, counted by a real local server: sized to the window, kept.

The server (asyncio streams, HTTP/1.1 with keep-alive) counts the connections it accepts
and holds every answer of a round until the round's requests have all arrived, so a round of
W requests is W requests in flight at once: an engine whose pool were smaller than its
window would never fill the round (the test's guard times out), one whose pool kept fewer
connections alive than its window would open new ones in the next round.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, Work
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.engines.pool import POOL_SHARD, shard_sizes

GUARD_S = 30.0  # a round that never fills fails the test instead of hanging it
ANSWER = json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "text": "y", "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


class CountingServer:
    """Why: only the server's side of the sockets shows what the client's pool really did."""

    def __init__(self, round_size: int) -> None:
        self.round_size = round_size
        self.connections = 0  # accepted so far
        self.arrived = 0  # requests so far
        self.in_flight = 0
        self.peak = 0
        self._rounds: dict[int, asyncio.Event] = {}
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> CountingServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _round(self, k: int) -> asyncio.Event:
        return self._rounds.setdefault(k, asyncio.Event())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                k = self.arrived // self.round_size
                self.arrived += 1
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                if self.arrived % self.round_size == 0:
                    self._round(k).set()
                await self._round(k).wait()
                self.in_flight -= 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()


def batch(n: int, first: int = 0) -> Work:
    payload = encode_payload(Payload(components=[], prompt="q", component_tokens=[],
                                     prompt_tokens=1))
    items = [Item(id=f"q{i}", model="m", signature=1, input_tokens=1, max_tokens=1,
                  payload=payload) for i in range(first, first + n)]
    return Work(id=first, model="m", signature=1, lane=0, epoch=1, pad_to=n, max_tokens=1,
                max_input_len=64, items=items)


@pytest.fixture
async def served() -> AsyncIterator[tuple[CountingServer, list[OpenAIEngine]]]:
    engines: list[OpenAIEngine] = []
    server = CountingServer(0)
    async with server:
        yield server, engines
        for eng in engines:
            await eng.close()


def make(server: CountingServer, engines: list[OpenAIEngine], window: int) -> OpenAIEngine:
    eng = OpenAIEngine(server.url, "m", max_batch_size=8, max_batch_tokens=512,
                       max_input_len=64, window=window, scrape_metrics=False)
    engines.append(eng)
    return eng


@pytest.mark.parametrize("window", [POOL_SHARD * 3, POOL_SHARD * 2 + 5, 48 + POOL_SHARD])
async def test_pool_holds_one_kept_connection_per_request_of_the_window(
        served: tuple[CountingServer, list[OpenAIEngine]], window: int) -> None:
    server, engines = served
    server.round_size = window
    eng = make(server, engines, window)
    # two windows in one batch, then two more in two batches run at once
    res = await asyncio.wait_for(eng.run(batch(2 * window)), GUARD_S)
    assert len(res) == 2 * window and all(r.error is None for r in res)
    assert server.peak == window and server.connections == window
    await asyncio.wait_for(asyncio.gather(eng.run(batch(window, 10_000)),
                                          eng.run(batch(window, 20_000))), GUARD_S)
    assert server.arrived == 4 * window
    assert server.connections == window  # every connection kept alive, none opened again


async def test_a_trickle_keeps_to_one_connection(
        served: tuple[CountingServer, list[OpenAIEngine]]) -> None:
    server, engines = served
    server.round_size = 1
    eng = make(server, engines, POOL_SHARD * 4)
    for k in range(10):
        await asyncio.wait_for(eng.run(batch(1, k)), GUARD_S)
    assert server.arrived == 10 and server.connections == 1


async def test_the_window_is_not_exceeded_by_a_batch_larger_than_it(
        served: tuple[CountingServer, list[OpenAIEngine]]) -> None:
    server, engines = served
    server.round_size = 5
    eng = make(server, engines, 5)
    res = await asyncio.wait_for(eng.run(batch(25)), GUARD_S)
    assert len(res) == 25 and server.peak <= 5 and server.connections == 5


@given(st.integers(min_value=1, max_value=20_000))
def test_shards_hold_the_window_and_none_is_larger_than_a_shard(window: int) -> None:
    sizes = shard_sizes(window)
    assert sum(sizes) == window
    assert all(0 < n <= POOL_SHARD for n in sizes)
    assert sizes.count(POOL_SHARD) == window // POOL_SHARD  # only the last is partial
