"""Typed questions and pushed results, through a real broker on a real socket.

Every question (`wire.queries`) has one handler on the server and one typed method on the
client, and each round-trips into its result type; a job's results are pushed to the
follower (no status, job or results question is asked while it follows), and a follower
whose connection is killed mid-stream resumes from the last sequence number: every result
is written once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from server_helpers import CONTRACT, MODEL, SIG_A, WireConsumer, running_server, wait_until

from fabricctl.core.events import Event
from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import ResultRecord
from fabricctl.core.snapshot import ConsumerView, ShapeView, Snapshot
from fabricctl.core.types import Item
from fabricctl.producer import JobFollower, results_stored
from fabricctl.server.views import HANDLERS
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import JobView
from fabricctl.wire.queries import (
    QUERIES,
    JobQuery,
    JobResultsQuery,
    ResultsQuery,
    StatusQuery,
)


def _items(n: int, prefix: str = "q") -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, SIG_A, 40 + k % 5, 8, f"p{k}".encode(), line=k + 1)
            for k in range(n)]


async def _serve(wc: WireConsumer, want: int, between: asyncio.Event | None = None) -> None:
    """Pull and complete until `want` items are stored, one batch at a time."""
    done = 0
    while done < want:
        w = await wc.pull(0.3)
        if w is not None:
            done += max(0, await wc.complete(w, "ok"))
            if between is not None:
                await between.wait()


def test_every_question_has_one_handler_and_no_string_names_one() -> None:
    assert set(HANDLERS) == set(QUERIES) and len(QUERIES) == 14
    assert not hasattr(Client, "query")
    for q in QUERIES:
        assert "what" not in q.__struct_fields__  # typed by the request, not a string field


async def test_each_question_round_trips_into_its_type(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.socket_path, "producer", "typed")
        job = (await c.open_job("submit", name="typed")).job
        assert (await c.submit(_items(12), job=job.number)).accepted == 12
        await c.seal_job(job.number, 12)
        wc = await WireConsumer.connect(server.state.cfg.socket_path, "typed-c", CONTRACT)
        await _serve(wc, 12)

        shapes = await c.shapes()
        assert shapes and all(isinstance(s, ShapeView) for s in shapes)
        assert len(await c.shapes(all=True)) >= len(shapes)
        one = shapes[0].signature
        assert (await c.shape(f"{one:016x}")).signature == one
        [consumer] = await c.consumers()
        assert isinstance(consumer, ConsumerView) and consumer.name == "typed-c"
        assert (await c.ledger())["difference"] == [0, 0]
        events = await c.events(0, 1000)
        assert events and all(isinstance(e, Event) for e in events)
        rows = await c.results(0, 100)
        assert len(rows) == 12 and all(isinstance(r, ResultRecord) for _, r in rows)
        assert [s for s, _ in rows] == sorted(s for s, _ in rows)
        keyed = await c.results_by_key("", 100)
        assert sorted(r.id for _, r in keyed) == sorted(r.id for _, r in rows)
        assert all(len(k) == 24 for k, _ in keyed)
        got = await c.result("q3", job.number)
        assert isinstance(got, ResultRecord) and got.id == "q3"
        assert await c.result("q3") is None  # of no job
        jobs = await c.jobs()
        assert [j.id for j in jobs] == [job.id] and isinstance(jobs[0], JobRecord)
        assert all(isinstance(v, JobPlace) for v in await c.job_views())
        view = await c.job(job.id)
        assert isinstance(view, JobView) and view.job.number == job.number
        assert [r.line for r in await c.job_results(job.id)] == list(range(1, 13))
        snap = await c.snapshot(all_lanes=True)
        assert isinstance(snap, Snapshot)
        status = await c.status()
        assert status["extra"]["store"]["results"] == await results_stored(c) == rows[-1][0]
        await wc.close()
        await c.close()


class _Counting:
    """Counts the requests a client sends, by type."""

    def __init__(self, client: Client) -> None:
        self.sent: dict[type[Any], int] = {}
        send = client.send

        def counted(frame: Any) -> None:
            self.sent[type(frame)] = self.sent.get(type(frame), 0) + 1
            send(frame)

        client.send = counted  # type: ignore[method-assign]


async def test_results_are_pushed_not_polled(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        c = await Client.connect(path, "producer", "follower")
        job = (await c.open_job("submit", name="pushed")).job
        counting = _Counting(c)
        written: list[str] = []
        follower = JobFollower(c, job.id, job.number, lambda r: written.append(r.id))
        following = asyncio.ensure_future(follower.run())
        p = await Client.connect(path, "producer", "feeder")
        assert (await p.submit(_items(40), job=job.number)).accepted == 40
        await p.seal_job(job.number, 40)
        wc = await WireConsumer.connect(path, "pushed-c", CONTRACT)
        await _serve(wc, 40)
        final = await asyncio.wait_for(following, 30)
        assert final.completed == 40 and sorted(written) == sorted(f"q{k}" for k in range(40))
        assert len(written) == 40  # once each
        sent = counting.sent
        assert sent.get(StatusQuery, 0) == sent.get(JobQuery, 0) == 0
        assert sent.get(ResultsQuery, 0) == 0
        assert sent.get(JobResultsQuery, 0) == 1  # the one sweep of what came before
        await wc.close()
        await p.close()
        await c.close()


async def test_a_follower_resumes_after_its_connection_is_killed(tmp_path: Path) -> None:
    n = 60
    async with running_server(tmp_path) as server:
        path = server.state.cfg.socket_path
        c = await Client.connect(path, "producer", "follower")
        job = (await c.open_job("submit", name="resumed")).job
        written: list[str] = []
        killed = asyncio.Event()
        go_on = asyncio.Event()  # the consumer waits after each batch until the kill is done
        go_on.set()
        reconnects = 0

        def write(rec: ResultRecord) -> None:
            written.append(rec.id)
            if len(written) == 10 and not killed.is_set():  # mid-stream: the server drops it
                killed.set()
                go_on.clear()
                for peer in list(server.state.peers):
                    if peer.name == "follower":
                        peer.transport.abort()

        async def reconnect() -> Client:
            nonlocal reconnects
            reconnects += 1
            client = await Client.connect(path, "producer", "follower-again")
            go_on.set()  # results stored while it was away come from the resumed stream
            return client

        follower = JobFollower(c, job.id, job.number, write, reconnect=reconnect)
        following = asyncio.ensure_future(follower.run())
        p = await Client.connect(path, "producer", "feeder")
        assert (await p.submit(_items(n), job=job.number)).accepted == n
        await p.seal_job(job.number, n)
        wc = await WireConsumer.connect(path, "resume-c", CONTRACT)
        await _serve(wc, n, between=go_on)
        final = await asyncio.wait_for(following, 30)
        assert killed.is_set() and reconnects == 1
        assert final.completed == n
        assert sorted(written) == sorted(f"q{k}" for k in range(n))  # every one, once
        assert len(written) == len(set(written)) == n
        await wc.close()
        await p.close()
        if isinstance(follower.client, Client):
            await follower.client.close()


async def test_a_stream_stopped_early_ends_on_the_broker_too(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.socket_path, "producer", "stopper")
        [peer] = [p for p in server.state.peers if p.name == "stopper"]
        assert await results_stored(c) == 0  # the first push of a stream of every job
        stream = c.follow_results(0, 0)
        assert (await anext(stream)).seq == 0
        assert len(peer.streams) == 1
        await stream.aclose()  # before the end: a StopFollow goes
        async def stopped() -> bool:
            return not peer.streams
        await wait_until(stopped)
        await c.close()
