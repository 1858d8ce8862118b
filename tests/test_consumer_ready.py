"""A consumer whose engine's server is restarting pulls nothing, so healthy GPUs take the work;
a consumer told to stop does not wait out its long-poll, and loses nothing by cutting it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from server_helpers import all_results, make_items, running_server, wait_until

from fabricctl.core.types import ItemResult, Work
from fabricctl.engines.sim import SimEngine
from fabricctl.supervisor.consumer import Consumer
from fabricctl.wire.client import Client


class Restarting(SimEngine):
    """A simulated engine that says its server is down until told otherwise."""

    def __init__(self) -> None:
        super().__init__(time_scale=0.0)
        self.ready = False
        self.back = asyncio.Event()
        self.ran = 0

    async def wait_ready(self) -> None:
        await self.back.wait()

    async def run(self, work: Work) -> list[ItemResult]:
        self.ran += 1
        return await super().run(work)


async def test_down_engine_pulls_nothing_and_healthy_consumer_does_it_all(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        producer = await Client.connect(server.state.cfg.socket_path, "producer")
        stop = asyncio.Event()
        down = Restarting()
        loop = asyncio.get_running_loop()
        sick = Consumer(server.state.cfg.socket_path, "sick", "m", down, gpu=0, pull_wait_s=0.05)
        tasks = [loop.create_task(sick.run(stop))]
        await sick.connected.wait()
        assert (await producer.submit(make_items(50))).accepted == 50
        healthy = Consumer(server.state.cfg.socket_path, "ok", "m", SimEngine(time_scale=0.0),
                           gpu=1)
        tasks.append(loop.create_task(healthy.run(stop)))

        async def done() -> bool:  # results are visible before the consumer's Done arrives
            return len(await all_results(producer)) == 50 and healthy.items == 50

        await wait_until(done, timeout=30)
        assert down.ran == 0
        assert sick.batches == 0
        assert healthy.items == 50
        down.ready = True
        down.back.set()
        stop.set()
        await asyncio.gather(*tasks)
        await producer.close()


async def test_stop_cuts_the_long_poll_and_a_late_batch_goes_back(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        producer = await Client.connect(server.state.cfg.socket_path, "producer")
        stop = asyncio.Event()
        engine = SimEngine(time_scale=0.0)
        idle = Consumer(server.state.cfg.socket_path, "idle", "m", engine, gpu=0, pull_wait_s=60.0)
        task = asyncio.get_running_loop().create_task(idle.run(stop))
        await idle.connected.wait()
        stop.set()
        # the batch these items make may answer the poll after the cut: it must come back
        assert (await producer.submit(make_items(50))).accepted == 50
        await asyncio.wait_for(task, 10.0)  # well before the 60 s poll would have ended
        assert idle.batches == 0
        other_stop = asyncio.Event()
        other = Consumer(server.state.cfg.socket_path, "other", "m", SimEngine(time_scale=0.0),
                         gpu=1)
        other_task = asyncio.get_running_loop().create_task(other.run(other_stop))

        async def done() -> bool:
            return len(await all_results(producer)) == 50 and other.items == 50

        await wait_until(done, timeout=30)
        results = await all_results(producer)
        assert sorted(r.id for r in results) == sorted(f"i{k}" for k in range(50))
        other_stop.set()
        await other_task
        await producer.close()
