"""SVG screenshots of `fabricctl top` on fixed data: layout at 80x24 and larger.

The app reads a `FixedSource` of deterministic synthetic snapshots (no broker, no clock),
so the pictures only change when the dashboard's drawing does. Update deliberately with
`pytest tests/test_tui_snapshots.py --snapshot-update` after looking at the new SVGs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from textual.pilot import Pilot
from tui_synthetic import make_snapshot

from fabricctl.tui.app import TopApp
from fabricctl.tui.sources import FixedSource
from fabricctl.tui.widgets.lines import LineList

SnapCompare = Callable[..., bool]


def app_of(count: int = 1, **kw: Any) -> TopApp:
    snaps = [make_snapshot(t=1000.0 + k, **kw) for k in range(count)]
    return TopApp(FixedSource(snaps), interval=1.0)


def ready(count: int, then: tuple[str, ...] = (),
          done: Callable[[TopApp], bool] = lambda app: True) -> Callable[
              [Pilot[int]], Awaitable[None]]:
    async def run_before(pilot: Pilot[int]) -> None:
        app = pilot.app
        assert isinstance(app, TopApp)
        deadline = time.monotonic() + 10
        while app.received < count or app.table.row_count == 0:
            assert time.monotonic() < deadline, "no snapshot drawn"
            await pilot.pause(0.01)
        await pilot.press(*then)
        while not done(app):
            assert time.monotonic() < deadline, "the view did not fill"
            await pilot.pause(0.01)
        await pilot.pause()

    return run_before


def test_overview_80x24_simulated_without_nvml(snap_compare: SnapCompare) -> None:
    assert snap_compare(app_of(), terminal_size=(80, 24), run_before=ready(1))


def test_overview_120x36_with_nvml_and_throughput(snap_compare: SnapCompare) -> None:
    app = app_of(4, shapes=30, nvml=True)
    assert snap_compare(app, terminal_size=(120, 36), run_before=ready(4))


def test_lanes_view_100x30(snap_compare: SnapCompare) -> None:
    def filled(app: TopApp) -> bool:
        return app.view == "lanes" and app.query_one("#lane-list", LineList).count == 16

    assert snap_compare(app_of(lane_shapes=None), terminal_size=(100, 30),
                        run_before=ready(1, ("enter",), filled))


def test_thrash_view_80x24(snap_compare: SnapCompare) -> None:
    def filled(app: TopApp) -> bool:
        return app.view == "thrash" and app.query_one("#critical", LineList).count > 0

    assert snap_compare(app_of(), terminal_size=(80, 24), run_before=ready(1, ("3",), filled))
