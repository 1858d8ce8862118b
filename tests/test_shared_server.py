"""A shared server's batch window (`engines.shared_server`) against an in-memory server whose
/metrics reports a live load the test sets: requests in flight follow the window, each body
carries the batch priority, and a server without the gauges keeps the last window."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from test_openai_engine import completion, item, work

from fabricctl.core.colocate import Colocation
from fabricctl.engines.metrics import parse_metrics
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.engines.shared_server import LoadFollower

GAUGES = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
"""


class LiveServer:
    """Why: a server whose live load the test sets and whose batch requests it holds."""

    def __init__(self, live: int, gauges: bool = True) -> None:
        self.live = live
        self.gauges = gauges
        self.in_flight = 0
        self.peak = 0
        self.bodies: list[dict] = []
        self.release = asyncio.Event()
        self.arrived = asyncio.Condition()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            text = GAUGES.format(running=self.live + self.in_flight, waiting=0)
            return httpx.Response(200, text=text if self.gauges else "")
        body = json.loads(request.content)
        self.bodies.append(body)
        async with self.arrived:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.arrived.notify_all()
        await self.release.wait()
        self.in_flight -= 1
        return httpx.Response(200, json=completion(body["prompt"]))

    async def wait_in_flight(self, n: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: self.in_flight >= n)


def shared_engine(server: LiveServer, capacity: int = 8) -> OpenAIEngine:
    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(server),
                       shared_capacity=capacity,
                       batch_priority=10)
    assert eng.follower is not None
    eng.follower.interval_s = 3600.0  # the test takes the readings itself
    return eng


def test_gauges_are_read_from_metrics() -> None:
    s = parse_metrics(GAUGES.format(running=5, waiting=2))
    assert (s.running, s.waiting) == (5, 2)
    assert parse_metrics("").running is None


async def test_requests_in_flight_follow_the_live_load() -> None:
    server = LiveServer(live=6)
    eng = shared_engine(server)
    run = asyncio.ensure_future(eng.run(work([item(i) for i in range(6)])))
    await server.wait_in_flight(1)  # capacity 8 - live 6 - headroom 1
    assert eng._conns.limit == 1 and server.in_flight == 1
    server.live = 0
    assert eng.follower is not None
    assert [await eng.follower.step() for _ in range(2)] == [4, 7]  # the pace doubles
    await server.wait_in_flight(6)
    server.release.set()
    results = await run
    assert [r.finish_reason for r in results] == ["length"] * 6
    assert all(b["priority"] == 10 for b in server.bodies)
    await eng.close()
    assert eng._conns.limit is None


async def test_a_server_taken_by_live_traffic_pauses_the_batch_without_losing_it() -> None:
    server = LiveServer(live=8)
    eng = shared_engine(server)
    run = asyncio.ensure_future(eng.run(work([item(i) for i in range(3)])))
    assert eng.follower is not None
    for _ in range(10_000):  # until run() took its first reading (no timer involved)
        if eng.follower.readings:
            break
        await asyncio.sleep(0)
    assert eng.follower.paused and server.in_flight == 0
    server.live = 2
    await eng.follower.step()
    server.release.set()
    assert len(await run) == 3
    await eng.close()


async def test_a_reading_without_gauges_keeps_the_last_window() -> None:
    server = LiveServer(live=4)
    eng = shared_engine(server)
    assert eng.follower is not None
    assert await eng.follower.step() == 2
    server.gauges = False
    assert await eng.follower.step() is None
    assert eng._conns.limit == 2
    await eng.close()


async def test_a_slow_live_answer_shrinks_the_window_and_a_calm_one_refills_it() -> None:
    server = LiveServer(live=2)
    eng = shared_engine(server)
    assert eng.follower is not None
    ttfts = iter([0.5, 0.5, 0.01, 0.01])

    async def canary() -> float | None:
        return next(ttfts)

    follower = LoadFollower(eng.scrape, eng._conns,
                            Colocation(capacity=8, max_window=24, target_s=0.1), canary=canary)
    assert [await follower.step() for _ in range(4)] == [1, 1, 2, 3]  # halved, then + 1
    await follower.stop()
    await eng.close()


async def test_the_canary_is_a_tiny_streamed_request_at_live_priority() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body["prompt"] == "refuse":
            return httpx.Response(400, json={"error": {"message": "no"}})
        return httpx.Response(200, text='data: {"choices": [{"text": "p"}]}\n\n')

    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(handler),
                       shared_capacity=8, live_target_s=0.1)
    ttft = await eng._canary()
    assert ttft is not None and ttft >= 0
    assert seen == [{"model": "m", "prompt": "ping", "max_tokens": 1, "stream": True,
                     "priority": 0}]
    assert eng.follower is not None and eng.follower.canary is not None
    await eng.close()


async def test_the_last_reading_reaches_the_engine_stats_status_and_top() -> None:
    import msgspec
    from rich.text import Text
    from tui_synthetic import make_snapshot

    from fabricctl.cli.status import shared_lines
    from fabricctl.tui.gpu import RateTracker, gpu_panel

    server = LiveServer(live=16)
    eng = shared_engine(server, capacity=16)
    assert eng.stats().shared is None  # no reading yet
    assert eng.follower is not None
    await eng.follower.step()
    stats = msgspec.to_builtins(eng.stats())  # as a heartbeat carries it
    assert stats["shared"] == {"capacity": 16, "window": 0, "live": 16, "live_ttft_s": None,
                               "target_s": None}
    await eng.close()
    snap = make_snapshot(4, 4, nvml=False)
    engines = snap.extra["engines"]
    assert isinstance(engines, dict)
    engines["gpu0-consumer"]["stats"]["shared"] = stats["shared"]
    lines: list[Text] = shared_lines(snap.extra)
    assert [x.plain for x in lines] == [
        "gpu0-consumer: shared: batch paused, live traffic holds 16 of 16 slots"]
    panel = gpu_panel(snap, RateTracker()).plain
    assert "   shared: batch paused, live traffic holds 16 of 16 slots" in panel.splitlines()


async def test_a_server_that_refuses_priority_gets_the_batch_without_it_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=GAUGES.format(running=0, waiting=0))
        body = json.loads(request.content)
        bodies.append(body)
        if "priority" in body:  # as a server would that does not schedule by priority
            return httpx.Response(400, json={"error": {
                "message": "priority is not supported unless --scheduling-policy priority"}})
        return httpx.Response(200, json=completion(body["prompt"]))

    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(handler),
                       shared_capacity=8, batch_priority=10)
    with caplog.at_level(logging.WARNING, logger="fabricctl.engines.openai"):
        first = await eng.run(work([item(i) for i in range(4)]))
        second = await eng.run(work([item(i) for i in range(4, 8)]))
    assert [r.finish_reason for r in first + second] == ["length"] * 8  # every line answered
    assert eng.batch_priority is None and "priority" not in bodies[-1]
    assert sum("--scheduling-policy priority" in r.getMessage() for r in caplog.records) == 1
    await eng.close()


async def test_a_400_about_the_users_own_priority_is_the_lines_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)
        return httpx.Response(400, json={"error": {"message": "priority must be an int"}})

    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(handler))
    [res] = await eng.run(work([item(0)]))
    assert res.finish_reason == "error" and "priority" in (res.error or "")
    await eng.close()
