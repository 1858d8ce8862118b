"""`fabricctl top` against a real broker: what the widgets show as shapes move.

Each test starts a `BrokerServer` over a `DurableBroker` in tmp_path inside the test's own
event loop, runs the app headless with `run_test` in the same loop, feeds items with
`Client.submit` and drives batches with a registered consumer `Client`. Synchronisation is
bounded polling on the app's state with `pilot.pause()`, never a bare sleep. The app reads
and decodes the stream on a worker thread of its own, never on the UI thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from rich.style import Style
from server_helpers import MODEL, SIG_A, SIG_B, fast_config, running_server
from textual.pilot import Pilot

from fabricctl.core.config import CoreConfig
from fabricctl.core.shape import ShapeState
from fabricctl.core.snapshot import Snapshot
from fabricctl.core.types import Contract, Item, ItemResult
from fabricctl.server.app import BrokerServer
from fabricctl.store.durable import DurableBroker
from fabricctl.tui.app import TopApp
from fabricctl.tui.palette import CRITICAL
from fabricctl.tui.sources import BrokerSource
from fabricctl.tui.widgets.lines import LineList, TextBox
from fabricctl.tui.widgets.shapes import ShapesTable
from fabricctl.wire import client as wire_client
from fabricctl.wire.client import Client

HOLD = CoreConfig(stage_timeout_s=3600.0, activate_when_idle=False)  # staged until B allows
SLOW_WATCHDOG = {"heartbeat_timeout_s": 60.0}  # a test consumer may sit between pulls


async def until(pilot: Pilot[int], cond: Callable[[], bool], what: str,
                timeout: float = 15.0) -> None:
    """Poll the app's state (bounded) while letting it process messages."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.02)


def items(n: int, sig: int, label: str, tokens: int = 100) -> list[Item]:
    return [Item(f"{label}{k}", MODEL, sig, tokens, 8, b"p", label) for k in range(n)]


def alpha_draining(server: BrokerServer) -> bool:
    ms = server.state.view.models[MODEL]
    return any(s.current is not None and s.current.signature == SIG_A
               and s.current.state is ShapeState.DRAINING for s in ms.slots.values())


def alpha_staged_again(server: BrokerServer) -> bool:
    again = server.state.view.models[MODEL].open.get(SIG_A)
    return again is not None and again.state is ShapeState.STAGED and again.items > 0


def text_of(app: TopApp, selector: str) -> str:
    return app.query_one(selector, TextBox).text.plain


def machine(app: TopApp) -> str:
    return text_of(app, "#machine")


def is_critical(text_style: object) -> bool:
    return text_style == CRITICAL or Style.parse(CRITICAL) == text_style


def critical_line(lines: LineList, needle: str) -> bool:
    for i in range(lines.count):
        t = lines.line_text(i)
        if needle in t.plain:
            whole = [s for s in t.spans if s.start == 0 and s.end == len(t.plain)]
            return any(is_critical(s.style) for s in whole)
    return False


async def test_state_counts_and_a_thrash_event_follow_the_broker(tmp_path: Path) -> None:
    # alpha drains with 3 batches left, so its prefix can arrive again while it drains
    early_drain = dataclasses.replace(HOLD, drain_multiple=3.0)
    async with running_server(tmp_path, early_drain, **SLOW_WATCHDOG) as server:
        path = server.state.cfg.socket_path
        producer = await Client.connect(path, "producer")
        app = TopApp(BrokerSource(path), interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            await producer.submit(items(80, SIG_A, "alpha") + items(60, SIG_B, "beta"))
            await until(pilot, lambda: "staged 2 ─▶ warming 0 ─▶ active 0" in machine(app),
                        "two staged shapes")
            assert app.query_one(ShapesTable).row_count == 2

            # B = 1024: alpha (8000 tokens) activates, beta warms later, alpha drains.
            consumer = await Client.connect(path, "consumer", "w0")
            await consumer.register("w0", Contract(MODEL, 8, 1024, 4096))
            work = await consumer.pull(2.0)
            assert work is not None and work.signature == SIG_A
            await until(pilot, lambda: "active 1" in machine(app), "alpha active")
            assert "active alpha" in machine(app)  # the model line names the active shape
            done, late = 0, False
            while done < 140:
                if not late and alpha_draining(server):  # alpha's prefix arrives again as it
                    late = True  # drains: staged anew, so alpha thrashes as it finishes
                    cur = server.state.view.models[MODEL].slots["w0"].current
                    assert cur is not None and cur.items  # not finished before they arrive
                    await producer.submit(items(3, SIG_A, "alpha-late"))
                    await until(pilot, lambda: alpha_staged_again(server), "alpha staged")
                if work is not None:
                    done += await consumer.complete(
                        work.id, [ItemResult(i.id, text="x") for i in work.items])
                work = await consumer.pull(1.0)
            assert late, "alpha was never seen draining"
            await until(pilot, lambda: "finished 1" in machine(app), "alpha finished")
            assert "active 1" in machine(app)  # beta took over

            await pilot.press("4")  # the events log
            events = app.query_one("#event-list", LineList)
            await until(pilot, lambda: critical_line(events, "THRASH"),
                        "a thrash event in the critical colour")
            assert any("alpha" in events.line_text(i).plain and "→ finished" in
                       events.line_text(i).plain for i in range(events.count))
            assert any("consumer w0 joined" in events.line_text(i).plain
                       for i in range(events.count))

            await pilot.press("3")  # the thrash view
            await until(pilot, lambda: "1 thrashing" in text_of(app, "#histogram"),
                        "the histogram counts the thrashing shape")
            hist = app.query_one("#histogram", TextBox).text
            row = next(line for line in hist.split("\n") if line.plain.strip().startswith("10-19"))
            assert any(is_critical(s.style) for s in row.spans)  # 10 batches: below the line
            assert critical_line(app.query_one("#critical", LineList), "alpha")
        await consumer.close()
        await producer.close()


async def test_filter_narrows_the_table_and_enter_opens_a_starving_lane(tmp_path: Path) -> None:
    cfg = CoreConfig(stage_timeout_s=3600.0, activate_when_idle=False, starve_s=0.5)
    async with running_server(tmp_path, cfg) as server:
        path = server.state.cfg.socket_path
        producer = await Client.connect(path, "producer")
        await producer.submit(items(3, SIG_A, "alpha") + items(3, SIG_B, "beta", 300))
        app = TopApp(BrokerSource(path), interval=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.query_one(ShapesTable)
            await until(pilot, lambda: table.row_count == 2, "both shapes listed")
            await pilot.press("slash", *"alpha")
            await until(pilot, lambda: table.row_count == 1, "the filter keeps alpha")
            assert table.keys == [f"{MODEL}:{SIG_A:016x}"]
            assert not app.paused  # the "p" of "alpha" went to the filter box
            await pilot.press("enter", "enter")  # leave the box, open the lanes
            assert app.view == "lanes"
            assert app.state.selected == (MODEL, SIG_A)
            lanes = app.query_one("#lane-list", LineList)
            await until(pilot, lambda: lanes.count >= 1 and critical_line_mark(lanes),
                        "alpha's lane marked starving")
            snap = app.snapshot
            assert snap is not None
            by_sig = {s.signature: s for s in snap.shapes}
            assert by_sig[SIG_A].lanes is not None  # subscribed: the selected shape only
            assert by_sig[SIG_B].lanes is None
            assert "starving" in text_of(app, "#lanes-head")

            await pilot.press("escape")
            assert app.view == "overview"
            await pilot.press("escape")  # clears the filter
            await until(pilot, lambda: table.row_count == 2, "the filter cleared")
        await producer.close()


def critical_line_mark(lanes: LineList) -> bool:
    for i in range(lanes.count):
        t = lanes.line_text(i)
        if "STARVING" in t.plain:
            at = t.plain.index("STARVING")
            return any(s.start <= at < s.end and is_critical(s.style) for s in t.spans)
    return False


async def test_a_lost_broker_shows_the_reconnecting_banner_then_recovers(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = DurableBroker(data, time.time())
    server = BrokerServer(store, fast_config(data))
    await server.start()
    app = TopApp(BrokerSource(data), interval=0.1, retry_min=0.05, retry_max=0.2)
    banner = None
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            banner = app.query_one("#banner", TextBox)
            await until(pilot, lambda: app.connected and app.snapshot is not None, "connected")
            assert not banner.has_class("-shown")

            await server.stop()
            store.close()
            await until(pilot, lambda: banner.has_class("-lost") and banner.display,
                        "the reconnecting banner")
            assert "reconnecting" in banner.text.plain
            assert "Traceback" not in banner.text.plain
            await until(pilot, lambda: "attempt 2" in banner.text.plain, "a retry")
            assert app.is_running and app.snapshot is not None  # the last picture stays

            store = DurableBroker(data, time.time())
            server = BrokerServer(store, fast_config(data))
            await server.start()
            seen = app.received
            await until(pilot, lambda: app.connected and app.received > seen, "reconnected")
            assert not banner.has_class("-shown")
    finally:
        await server.stop()
        store.close()


class RecordingDecoder:
    """Why: the wire client's snapshot decoder, noting the thread each decode runs on."""

    def __init__(self, inner: msgspec.msgpack.Decoder[Snapshot]) -> None:
        self.inner = inner
        self.threads: set[int] = set()

    def decode(self, data: bytes) -> Snapshot:
        self.threads.add(threading.get_ident())
        return self.inner.decode(data)


async def test_snapshots_are_read_and_decoded_off_the_ui_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = RecordingDecoder(wire_client._snapshot_decoder)
    monkeypatch.setattr(wire_client, "_snapshot_decoder", decoder)
    ui = threading.get_ident()  # run_test runs the app on the test's own loop and thread
    async with running_server(tmp_path, HOLD) as server:
        app = TopApp(BrokerSource(server.state.cfg.socket_path), interval=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.received >= 2, "two snapshots")
            assert app.connected and app.snapshot is not None
            pump = app.pump
            assert pump is not None and not pump.ended.is_set()
            await pilot.press("plus")  # a new subscription: a new pump, the old one ends
            assert app.pump is not pump
            assert await asyncio.to_thread(pump.ended.wait, 10)
            seen = app.received
            await until(pilot, lambda: app.received > seen, "a snapshot of the new pump")
            pump = app.pump
        assert await asyncio.to_thread(pump.ended.wait, 10)  # none outlives the app
    assert decoder.threads and ui not in decoder.threads
