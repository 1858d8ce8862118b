"""The cache-truth audit end to end: a producer that declares a prefix its prompts do not
share gets its shape flagged by a real broker from a consumer's engine figures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from server_helpers import all_results, running_server, wait_until

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import signature
from fabricctl.core.types import Item
from fabricctl.engines.sim import SimEngine
from fabricctl.supervisor.consumer import Consumer
from fabricctl.wire.client import Client

SYSTEM = "You are a careful assistant. " * 64  # ~1.8k bytes, 448 declared tokens


def item(k: int, sig: int, components: list[str]) -> Item:
    payload = Payload(components, f"question {k}", [448], 64)
    return Item(f"q{k}-{sig % 97}", "m", sig, 512, 4, encode_payload(payload))


async def test_a_declared_prefix_that_is_not_real_is_flagged(tmp_path: Path) -> None:
    honest = signature([SYSTEM])
    liar = signature(["a template the producer claims"])
    items = [item(k, honest, [SYSTEM]) for k in range(200)]
    # same signature every time, but every prompt actually starts with different text
    items += [item(k, liar, [f"{k}: {SYSTEM}"]) for k in range(200)]
    async with running_server(tmp_path) as server:
        producer = await Client.connect(server.state.cfg.socket_path, "producer")
        ack = await producer.submit(items)
        assert ack.accepted == 400
        stop = asyncio.Event()
        engine = SimEngine(time_scale=0.0, max_batch_size=32, max_batch_tokens=16384)
        consumer = Consumer(server.state.cfg.socket_path, "gpu0", "m", engine, gpu=0)
        task = asyncio.get_running_loop().create_task(consumer.run(stop))

        async def done() -> bool:
            return len(await all_results(producer)) == 400

        await wait_until(done, timeout=60)
        views = {v["signature"]: v for v in msgspec.to_builtins(await producer.shapes())}
        stop.set()
        await task
        await producer.close()
    finished = {e.signature: e for e in server.state.view.events.since(0) if e.kind == "guard"}
    assert liar in finished
    assert honest not in finished
    assert "not a token-identical prefix" in finished[liar].reason
    for v in views.values():  # whatever is still live reports the same verdicts
        assert v["cache_flagged"] is (v["signature"] == liar)
