"""The broker over real sockets when clients misbehave: killed, frozen, silent, or garbled.

A consumer process (tests/null_consumer.py) that holds a batch is killed or stopped; an
in-process consumer goes silent; raw sockets send malformed and oversized frames. In every
case the batch reaches another consumer, each item ends with exactly one result (the other
consumer's), and the other clients carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import msgspec
import pytest
from server_helpers import (
    CONTRACT,
    Tally,
    all_results,
    make_items,
    results_by_id,
    run_consumer,
    running_server,
    spawn_consumer,
)

from fabricctl.core.broker import ShapeGuardError, guard_signature
from fabricctl.core.config import CoreConfig
from fabricctl.core.types import ItemResult, Work
from fabricctl.errors import BackendMissing, BrokerError
from fabricctl.formats.results import ResultRecord
from fabricctl.server.app import BrokerServer
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import (
    HEADER,
    PROTOCOL_VERSION,
    Error,
    Hello,
    Welcome,
    encode,
    read_frame,
)

# every consumer drains the model's shape, so a survivor takes what a stopped one left queued
# (in the default "consumer" scope it joins only a shape worth another prefill)
MODEL_SCOPE = CoreConfig(shape_scope="model")


async def submit(server: BrokerServer, n: int, prefix: str = "i") -> list[str]:
    producer = await Client.connect(server.state.cfg.socket_path, "producer")
    items = make_items(n, prefix=prefix)
    ack = await producer.submit(items)
    assert ack.accepted == n
    await producer.close()
    return [it.id for it in items]


async def exactly_one_each(server: BrokerServer, ids: list[str]) -> dict[str, ResultRecord]:
    observer = await Client.connect(server.state.cfg.socket_path, "observer")
    results = await all_results(observer)
    await observer.close()
    by_id = results_by_id(results)
    assert sorted(by_id) == sorted(ids)
    assert all(len(recs) == 1 for recs in by_id.values())
    assert len(results) == len(ids)
    assert server.state.view.ledger.difference() == (0, 0)
    return {k: recs[0] for k, recs in by_id.items()}


async def lost_reasons(server: BrokerServer) -> list[str]:
    observer = await Client.connect(server.state.cfg.socket_path, "observer")
    events = await observer.events(0, 10_000)
    await observer.close()
    return [e.reason for e in events if e.kind == "consumer_lost"]


async def test_killed_consumer_process_batch_goes_to_another(tmp_path: Path) -> None:
    async with running_server(tmp_path, MODEL_SCOPE) as server:  # the survivor drains all
        ids = await submit(server, 64)
        victim = await spawn_consumer(server.state.cfg.socket_path, "victim", "by victim")
        try:
            held = await victim.line()
            assert held["event"] == "holding"
            assert server.state.view.consumers["victim"].batches == {held["batch"]}
            tally = Tally(len(ids))
            seen: list[Work] = []
            client = await Client.connect(server.state.cfg.socket_path, "consumer", "survivor")
            survivor = asyncio.ensure_future(
                run_consumer(client, "survivor", "by survivor", tally.reached, tally, seen))
            # the survivor takes everything else, then long-polls for the held batch
            await asyncio.wait_for(tally.at_least(len(ids) - len(held["ids"])), 15.0)
            assert tally.count == len(ids) - len(held["ids"])
            before_kill = len(seen)
            os.kill(victim.proc.pid, signal.SIGKILL)
            await asyncio.wait_for(tally.reached.wait(), 10.0)
            await survivor
            await client.close()
        finally:
            await victim.reap()
        assert victim.proc.returncode == -signal.SIGKILL
        got_after_kill = [i.id for w in seen[before_kill:] for i in w.items]
        assert sorted(got_after_kill) == sorted(held["ids"])
        recs = await exactly_one_each(server, ids)
        assert {r.text for r in recs.values()} == {"by survivor"}
        assert "victim" not in server.state.view.consumers
        assert any(r.startswith("victim: connection closed") for r in await lost_reasons(server))


async def test_stopped_consumer_is_dropped_and_its_late_completion_is_void(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path, MODEL_SCOPE) as server:  # the survivor drains all
        timeout = server.state.cfg.heartbeat_timeout_s
        ids = await submit(server, 48)
        victim = await spawn_consumer(server.state.cfg.socket_path, "victim", "by victim")
        try:
            held = await victim.line()
            assert held["event"] == "holding"
            tally = Tally(len(ids))
            client = await Client.connect(server.state.cfg.socket_path, "consumer", "survivor")
            survivor = asyncio.ensure_future(
                run_consumer(client, "survivor", "by survivor", tally.reached, tally))
            await asyncio.wait_for(tally.at_least(len(ids) - len(held["ids"])), 15.0)
            # while it runs it heartbeats, and outlives the timeout holding its batch
            joined = server.state.view.consumers["victim"].joined
            while server.state.clock() - joined < 1.5 * timeout:
                assert server.state.view.consumers["victim"].batches == {held["batch"]}
                await asyncio.sleep(0.05)
            stopped = time.monotonic()
            os.kill(victim.proc.pid, signal.SIGSTOP)
            await asyncio.wait_for(tally.reached.wait(), timeout + 5.0)
            waited = time.monotonic() - stopped
            assert "victim" not in server.state.view.consumers
            assert any(r == "victim: heartbeat timeout" for r in await lost_reasons(server))
            # dropped by the watchdog once the timeout ran out, not much after
            assert waited <= timeout + 1.0
            await survivor
            await client.close()
            os.kill(victim.proc.pid, signal.SIGCONT)
            await victim.say("complete")
            late = await victim.line()
            assert late["event"] == "complete_failed" or late == {"event": "completed",
                                                                  "stored": -1}
        finally:
            await victim.reap()
        recs = await exactly_one_each(server, ids)
        assert {r.text for r in recs.values()} == {"by survivor"}


async def test_silent_consumer_is_dropped_and_a_late_completion_stores_nothing(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        ids = await submit(server, 40)
        silent = await Client.connect(path, "consumer", "silent")
        await silent.register("silent", CONTRACT)
        held = await silent.pull(1.0)  # then never another frame: no heartbeat, nothing
        assert held is not None
        tally = Tally(len(ids))
        client = await Client.connect(path, "consumer", "survivor")
        survivor = asyncio.ensure_future(
            run_consumer(client, "survivor", "by survivor", tally.reached, tally))
        await asyncio.wait_for(silent.closed.wait(), server.state.cfg.heartbeat_timeout_s + 2.0)
        await asyncio.wait_for(tally.reached.wait(), 10.0)
        await survivor
        late = [ItemResult(i.id, text="by silent") for i in held.items]
        with pytest.raises(BackendMissing):
            await silent.complete(held.id, late)
        # the same consumer back on a new connection: its old batch is no longer its own
        again = await Client.connect(path, "consumer", "silent")
        await again.register("silent", CONTRACT)
        assert await again.complete(held.id, late) == -1
        assert await again.fail(held.id, "late") == -1
        await again.close()
        await client.close()
        await silent.close()
        recs = await exactly_one_each(server, ids)
        assert {r.text for r in recs.values()} == {"by survivor"}


async def raw_connection(path: Path, hello: bool = True) -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter
]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    if hello:
        writer.write(encode(Hello(PROTOCOL_VERSION, "producer", "raw")))
        assert isinstance(await read_frame(reader), Welcome)
    return reader, writer


async def refused_and_closed(reader: asyncio.StreamReader, code: str) -> None:
    """The broker answered with a fatal `Error` of `code`, then closed the connection."""
    err = await asyncio.wait_for(read_frame(reader), 5.0)
    assert isinstance(err, Error)
    assert err.code == code
    assert err.fatal
    with contextlib.suppress(ConnectionResetError):
        assert await asyncio.wait_for(reader.read(), 5.0) == b""


async def others_carry_on(server: BrokerServer, consumer: Client, prefix: str) -> None:
    """A second client's submit and a registered consumer's pull still work."""
    ids = await submit(server, 3, prefix)
    work = await consumer.pull(2.0)
    assert work is not None
    assert {i.id for i in work.items} == set(ids)
    assert await consumer.complete(work.id, [ItemResult(i.id) for i in work.items]) == 3


GARBAGE = b"\xc1" * 12  # 0xc1 is never used in msgpack
UNKNOWN = msgspec.msgpack.encode({"type": "Teleport", "rid": 1})


@pytest.mark.parametrize(("body", "after_hello"), [
    (GARBAGE, True), (GARBAGE, False), (UNKNOWN, True), (b"\x93\x01\x02", True),
], ids=["garbage", "garbage-first", "unknown-type", "not-a-map"])
async def test_malformed_frame_closes_only_that_connection(
    tmp_path: Path, body: bytes, after_hello: bool,
) -> None:
    async with running_server(tmp_path) as server:
        consumer = await Client.connect(server.state.cfg.socket_path, "consumer", "steady")
        await consumer.register("steady", CONTRACT)
        reader, writer = await raw_connection(server.state.cfg.socket_path, after_hello)
        writer.write(HEADER.pack(len(body)) + body)
        await refused_and_closed(reader, "bad_frame")
        writer.close()
        await others_carry_on(server, consumer, "after")
        await consumer.close()


async def test_oversized_frame_closes_only_that_connection(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_frame=4096) as server:
        consumer = await Client.connect(server.state.cfg.socket_path, "consumer", "steady")
        await consumer.register("steady", CONTRACT)
        reader, writer = await raw_connection(server.state.cfg.socket_path)
        writer.write(HEADER.pack(4097))  # only the header: the broker must not wait for more
        await refused_and_closed(reader, "frame_too_large")
        writer.close()
        # a real oversized submit from a client is refused the same way
        big = await Client.connect(server.state.cfg.socket_path, "producer", "big")
        with pytest.raises(BrokerError) as err:
            await big.submit(make_items(200, prefix="big"))
        assert err.value.code == "frame_too_large"
        await big.close()
        await others_carry_on(server, consumer, "after")
        assert "steady" in server.state.view.consumers
        await consumer.close()


async def test_a_completion_of_another_consumers_batch_stores_nothing(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        ids = await submit(server, 10)
        owner = await Client.connect(path, "consumer", "owner")
        await owner.register("owner", CONTRACT)
        other = await Client.connect(path, "consumer", "other")
        await other.register("other", CONTRACT)
        work = await owner.pull(1.0)
        assert work is not None
        assert await other.complete(work.id, [ItemResult(i.id, text="by other")
                                              for i in work.items]) == -1
        assert await other.fail(work.id, "not mine") == -1
        assert await owner.complete(work.id, [ItemResult(i.id, text="by owner")
                                              for i in work.items]) == len(work.items)
        assert await owner.complete(work.id, [ItemResult(i.id, text="again")
                                              for i in work.items]) == -1  # a duplicate
        recs = await exactly_one_each(server, ids)
        assert {r.text for r in recs.values()} == {"by owner"}
        for c in (owner, other):
            await c.close()


async def test_re_registering_under_another_name_returns_the_old_names_batches(
    tmp_path: Path,
) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        ids = await submit(server, 10)
        client = await Client.connect(path, "consumer", "first")
        await client.register("first", CONTRACT)
        held = await client.pull(1.0)
        assert held is not None
        await client.register("second", CONTRACT)
        assert "first" not in server.state.view.consumers
        work = await client.pull(1.0)  # the batch of "first" went back to its lane
        assert work is not None
        assert {i.id for i in work.items} == {i.id for i in held.items}
        assert await client.complete(held.id, []) == -1
        assert await client.complete(work.id, [ItemResult(i.id, text="second")
                                               for i in work.items]) == len(ids)
        await client.close()
        recs = await exactly_one_each(server, ids)
        assert {r.text for r in recs.values()} == {"second"}


async def test_a_failing_request_gets_an_error_and_the_connection_lives_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        ids = await submit(server, 5)
        consumer = await Client.connect(path, "consumer", "c")
        await consumer.register("c", CONTRACT)
        real_pull = server.state.store.pull

        def broken(name: str, now: float) -> Work | None:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(server.state.store, "pull", broken)
        with pytest.raises(BrokerError) as err:
            await asyncio.wait_for(consumer.pull(1.0), 5.0)  # answered, not left hanging
        assert err.value.code == "internal"
        assert "disk on fire" in err.value.message
        monkeypatch.setattr(server.state.store, "pull", real_pull)
        work = await consumer.pull(1.0)
        assert work is not None
        assert await consumer.complete(work.id, [ItemResult(i.id) for i in work.items]) == 5
        await consumer.close()
        await exactly_one_each(server, ids)


async def test_the_shape_guard_stops_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_server(tmp_path) as server:
        await submit(server, 5)
        tripped: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        server.on_fatal = tripped.set_result  # instead of ending this test process

        def poisoned(name: str, now: float) -> Work | None:
            guard_signature(1, 2, "segment 7")
            return None

        monkeypatch.setattr(server.state.store, "pull", poisoned)
        consumer = await Client.connect(server.state.cfg.socket_path, "consumer", "c")
        await consumer.register("c", CONTRACT)
        pull = asyncio.ensure_future(consumer.pull(1.0))
        err = await asyncio.wait_for(tripped, 5.0)
        assert isinstance(err, ShapeGuardError)
        assert "segment 7" in str(err)
        pull.cancel()
        with contextlib.suppress(asyncio.CancelledError, BackendMissing):
            await pull
        await consumer.close()
