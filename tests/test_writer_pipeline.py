"""The writer prepares the next cycle while a commit runs (what that cycle may assume), in
steps the event loop runs between.

Each test holds the first commit on the writer thread until the next cycle is prepared,
then lets it land (or fail) and checks what was stored, answered and recovered."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from store_helpers import SyncStore
from test_writer import CONTRACT, answer, drain, items, result_ids

from fabricctl.errors import StoreFullError
from fabricctl.server.writer import Writer
from fabricctl.store.durable import DurableBroker, StoreConfig
from fabricctl.store.steps import STEP_ITEMS, Steps


class Gate:
    """Holds the first commit on the writer thread until the next cycle is prepared."""

    def __init__(self, store: DurableBroker, monkeypatch: pytest.MonkeyPatch,
                 fail_first: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.committing = asyncio.Event()  # the first commit is running
        self.prepared = asyncio.Event()  # a cycle was prepared while it ran
        self.release = threading.Event()
        self.calls = 0
        real_finish = store.env.finish
        real_steps = store.steps.ingest

        def finish(staged: Any, drain: bool = False) -> bool:
            self.calls += 1
            if self.calls == 1:
                self.loop.call_soon_threadsafe(self.committing.set)
                self.release.wait(30.0)
                if fail_first:
                    staged.txn.abort()
                    raise StoreFullError("ingest refused: the disk is full (test)")
            return real_finish(staged, drain)

        def steps(chunk: list[Any], now: float, landing: bool = False,
                  after: Any = None) -> Steps[Any]:
            plan = yield from real_steps(chunk, now, landing, after)
            if landing:
                self.prepared.set()
            return plan

        monkeypatch.setattr(store.env, "finish", finish)
        monkeypatch.setattr(store.steps, "ingest", steps)

    async def next_cycle_while_held(self, start: Callable[[], Any]) -> Any:
        """Wait for the held commit, start the next cycle's work, let the commit go."""
        await asyncio.wait_for(self.committing.wait(), 10.0)
        task = asyncio.ensure_future(start())
        await asyncio.wait_for(self.prepared.wait(), 10.0)
        self.release.set()
        return task


def reopened(store: DurableBroker) -> DurableBroker:
    store.close()
    return SyncStore(store.env.data_dir, 2.0, store=StoreConfig(segment_entries=64))


@pytest.fixture
def store(tmp_path: Path) -> DurableBroker:
    return SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=64))


async def test_a_cycle_prepared_during_a_commit_counts_its_ids_and_starts_new_segments(
    store: DurableBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = Gate(store, monkeypatch)
    writer = Writer(store, lambda: 1.0, lambda: None, max_items=64, max_wait_s=0.0)
    writer.start()
    first = asyncio.ensure_future(writer.submit(items(3, prefix="a")))
    second = await gate.next_cycle_while_held(
        lambda: writer.submit(items(1, prefix="a") + items(2, prefix="b")))
    assert await first == []
    assert [(r.index, r.reason) for r in await second] == [(0, "duplicate id 'a0'")]
    await writer.stop()
    assert len(store.segs) == 2  # the same shape, but not grown while its commit ran
    again = reopened(store)
    assert again.recovery.items == 5 and again.recovery.ledger_ok
    assert drain(again) == 5
    assert sorted(result_ids(again)) == ["a0", "a1", "a2", "b0", "b1"]
    again.close()


async def test_when_the_commit_it_was_screened_against_fails_the_cycle_is_prepared_again(
    store: DurableBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = Gate(store, monkeypatch, fail_first=True)
    writer = Writer(store, lambda: 1.0, lambda: None, max_items=64, max_wait_s=0.0)
    writer.start()
    first = asyncio.ensure_future(writer.submit(items(3, prefix="a")))
    second = await gate.next_cycle_while_held(
        lambda: writer.submit(items(1, prefix="a") + items(2, prefix="b")))
    with pytest.raises(StoreFullError, match="disk is full"):
        await first
    assert await second == []  # a0 was never stored: this copy is not a duplicate
    await writer.stop()
    again = reopened(store)
    assert again.recovery.items == 3 and again.recovery.ledger_ok
    assert drain(again) == 3
    assert sorted(result_ids(again)) == ["a0", "b0", "b1"]
    again.close()


async def test_an_ingest_prepared_while_a_completion_empties_the_newest_segment_keeps_out(
    store: DurableBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(4), 0.0)
    (emptied,) = store.segs
    w = store.pull("gpu", 0.0)
    assert w is not None and len(w.items) == 4
    gate = Gate(store, monkeypatch)
    writer = Writer(store, lambda: 1.0, lambda: None, max_items=64, max_wait_s=0.0)
    writer.start()
    done = asyncio.ensure_future(writer.complete((w.id, answer(w), 0)))
    late = await gate.next_cycle_while_held(lambda: writer.submit(items(3, prefix="late")))
    assert await done == 4 and await late == []
    await writer.stop()
    assert emptied not in store.segs and len(store.segs) == 1
    assert drain(store) == 3
    again = reopened(store)
    assert again.recovery.items == 0 and again.recovery.ledger_ok
    assert sorted(result_ids(again)) == sorted(
        [f"i{k}" for k in range(4)] + [f"late{k}" for k in range(3)])
    again.close()


async def test_the_loop_runs_between_the_steps_of_a_large_ingest(
    store: DurableBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    loop = asyncio.get_running_loop()
    real = store.steps.ingest

    def logged(*args: Any) -> Steps[Any]:
        inner = real(*args)
        try:
            while True:
                log.append("step")
                next(inner)
                yield
        except StopIteration as done:
            return done.value

    def turn() -> None:  # one call per event-loop iteration
        log.append("turn")
        handle[0] = loop.call_soon(turn)

    monkeypatch.setattr(store.steps, "ingest", logged)
    handle = [loop.call_soon(turn)]
    writer = Writer(store, lambda: 1.0, lambda: None, max_items=8192, max_wait_s=0.0)
    writer.start()
    assert await writer.submit(items(4096)) == []
    await writer.stop()
    handle[0].cancel()
    steps = [k for k, what in enumerate(log) if what == "step"]
    assert len(steps) > 4096 // STEP_ITEMS  # it pauses at least every STEP_ITEMS placed
    assert all("turn" in log[a:b] for a, b in itertools.pairwise(steps))
    assert drain(store) == 4096
