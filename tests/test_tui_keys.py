"""The dashboard's keys and views, on fixed data (no broker, no clock).

Promises: p pauses drawing, +/- step the refresh interval and resubscribe, ? opens help,
s/S and header clicks sort, 1-4 switch views, Enter subscribes the lanes of the shape
under the cursor only, and `/` filters without the typed letters triggering keys;
assigning the reactive data (a box's text, a list's count, `paused`, `interval`)
redraws by itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual.pilot import Pilot
from tui_synthetic import make_snapshot

from fabricctl.core.signature import signature_hex
from fabricctl.tui.app import TopApp
from fabricctl.tui.sources import FixedSource
from fabricctl.tui.widgets.help import HelpScreen
from fabricctl.tui.widgets.lines import LineList, TextBox
from fabricctl.tui.widgets.shapes import ShapesTable


async def until(pilot: Pilot[int], cond: Callable[[], bool], what: str,
                timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.01)


def fixed_app(**kw: object) -> tuple[TopApp, FixedSource]:
    source = FixedSource([make_snapshot(8, 16, lane_shapes=None, **kw)])  # type: ignore[arg-type]
    return TopApp(source, interval=0.25), source


async def started(pilot: Pilot[int], app: TopApp) -> None:
    await until(pilot, lambda: app.snapshot is not None and app.table.row_count > 0,
                "the first snapshot drawn")


def header(app: TopApp) -> str:
    return app.query_one("#header", TextBox).text.plain


async def test_pause_interval_and_help_keys() -> None:
    app, source = fixed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await started(pilot, app)
        await pilot.press("p")
        assert app.paused and "PAUSED" in header(app)
        await pilot.press("p")
        assert not app.paused and "PAUSED" not in header(app)

        await pilot.press("plus")
        await until(pilot, lambda: len(source.requests) == 2, "a new subscription")
        assert source.requests[-1] == (0.5, [])
        await pilot.press("minus", "minus", "minus")
        await until(pilot, lambda: source.requests[-1][0] == 0.1, "the fastest interval")
        assert "every 0.1 s" in header(app)

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
    assert app.return_code == 0


async def test_views_switch_and_enter_subscribes_the_selected_shapes_lanes() -> None:
    app, source = fixed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await started(pilot, app)
        for key, view in (("3", "thrash"), ("4", "events"), ("1", "overview")):
            await pilot.press(key)
            assert app.view == view
        await pilot.press("down", "enter")
        assert app.view == "lanes"
        key = app.table.keys[1]
        model, _, hexsig = key.rpartition(":")
        assert app.state.selected == (model, int(hexsig, 16))
        await until(pilot, lambda: source.requests[-1][1] == [app.state.selected],
                    "the lanes subscription")
        lanes = app.query_one("#lane-list", LineList)
        await until(pilot, lambda: lanes.count == 16, "16 lane bars")
        assert hexsig in app.query_one("#lanes-head", TextBox).text.plain
        await pilot.press("escape")
        assert app.view == "overview"
        await pilot.press("2")  # back to the same shape, no new subscription
        assert app.view == "lanes" and len(source.requests) == 2


async def test_sorting_by_key_and_by_header_click() -> None:
    app, _ = fixed_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await started(pilot, app)
        assert app.table.shown[0] == "model"  # 120 columns: everything fits
        assert app.table.cells[app.table.keys[0]][3].text == "active"  # lifecycle order
        await pilot.press("s")  # state -> epoch, largest first
        assert app.state.sort == "epoch" and app.state.reverse
        snap = app.snapshot
        assert snap is not None
        top = max(snap.shapes, key=lambda s: s.epoch)
        assert app.table.keys[0].endswith(signature_hex(top.signature))
        await pilot.press("S")
        assert not app.state.reverse

        x = app.table.column_offset("tokens")
        await pilot.click(ShapesTable, offset=(x + 2, 0))  # the "tokens" header
        assert app.state.sort == "tokens" and app.state.reverse
        biggest = max(snap.shapes, key=lambda s: s.tokens)
        assert app.table.keys[0].endswith(signature_hex(biggest.signature))
        assert "sort tokens ↓" in header(app)


async def test_filter_box_takes_letters_and_escape_clears_it() -> None:
    app, _ = fixed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await started(pilot, app)
        await pilot.press("slash", *"shape-003 p q 1")
        assert app.is_running and not app.paused and app.view == "overview"
        await pilot.press(*["backspace"] * 6)
        assert app.state.query == "shape-003"
        await until(pilot, lambda: app.table.row_count == 1, "one shape left")
        assert "filter “shape-003”" in header(app)
        await pilot.press("escape")
        assert app.state.query == "" and app.table.row_count == 8


async def test_assigning_the_reactive_data_redraws_without_a_call() -> None:
    app, source = fixed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await started(pilot, app)
        box = app.query_one("#machine", TextBox)
        two_lines = Text("one\ntwo")
        box.text = two_lines
        assert box.content is two_lines  # the Static was updated by the assignment
        box.text = Text("one\ntwo")  # equal: no update
        assert box.content is two_lines

        events = app.query_one("#event-list", LineList)
        events.count = 40
        assert events.virtual_size.height == 40

        app.paused = True  # what `p` does, without the key
        assert "PAUSED" in header(app)
        app.interval = 2.0
        assert "every 2 s" in header(app)
        await until(pilot, lambda: source.requests[-1] == (2.0, []), "a new subscription")


async def test_help_lists_every_key_bound_with_what_it_does_and_each_view() -> None:
    """`?` shows, in a box wide enough to read, each binding of the app, the shapes table
    and the help screen itself: every key as the footer shows it and its tooltip; and each
    view's line. (It was an empty box over a hand-kept list.)"""
    from textual.binding import Binding

    from fabricctl.tui.widgets.panes import EventsPane, LanesPane, Overview, ThrashPane

    app, _ = fixed_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.pause()
        keys = app.screen.query_one("#help-keys")
        shown = str(keys.render())
        assert keys.region.width >= max(len(ln) for ln in shown.splitlines())
        rows = dict(ln.strip().split("  ", 1) for ln in shown.splitlines())
        owners = (TopApp, ShapesTable, HelpScreen)
        bindings = [b for owner in owners for b in owner.BINDINGS if isinstance(b, Binding)]
        assert len(bindings) >= len(TopApp.BINDINGS) + len(ShapesTable.BINDINGS)
        for b in bindings:
            if b.key == "enter" and b.action == "details":
                continue  # the focused table's Enter takes it (same effect, listed once)
            assert b.tooltip, f"{b.key} has no tooltip for the help"
            row = next((k for k, v in rows.items() if v == b.tooltip), None)
            assert row is not None, f"{b.key}: {b.tooltip!r} not in the help"
            for key in b.key.split(","):
                assert app.get_key_display(Binding(key, b.action)) in row.split(), (key, row)
        views = str(app.screen.query_one("#help-views").render())
        for pane in (Overview, LanesPane, ThrashPane, EventsPane):
            assert pane.HELP in " ".join(views.split())
        await pilot.press("question_mark")
        assert not isinstance(app.screen, HelpScreen)
