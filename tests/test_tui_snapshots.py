"""SVG screenshots of `fabricctl top` on fixed data: layout at 80x24 and larger.

The app reads a `FixedSource` of deterministic synthetic snapshots (no broker, no clock),
so the pictures only change when the dashboard's drawing does. Update deliberately with
`pytest tests/test_tui_snapshots.py --snapshot-update` after looking at the new SVGs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
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


def test_overview_120x36_a_fleet_of_a_tensor_parallel_lora_server_and_an_embedder(
        snap_compare: SnapCompare) -> None:
    """Servers with their GPUs (one over GPUs 0 and 1) and the names each answers, the one
    it pulls from now in bold."""
    app = app_of(2, shapes=12, nvml=True, fleet=True)
    assert snap_compare(app, terminal_size=(120, 36), run_before=ready(2))


def test_lanes_view_100x30(snap_compare: SnapCompare) -> None:
    def filled(app: TopApp) -> bool:
        return app.view == "lanes" and app.query_one("#lane-list", LineList).count == 16

    assert snap_compare(app_of(lane_shapes=None), terminal_size=(100, 30),
                        run_before=ready(1, ("enter",), filled))


def test_thrash_view_80x24(snap_compare: SnapCompare) -> None:
    def filled(app: TopApp) -> bool:
        return app.view == "thrash" and app.query_one("#critical", LineList).count > 0

    assert snap_compare(app_of(), terminal_size=(80, 24), run_before=ready(1, ("3",), filled))


def test_overview_with_jobs_one_at_risk_120x36(snap_compare: SnapCompare) -> None:
    from fabricctl.core.forecast import JobView
    from fabricctl.core.jobs import new_job

    t = 1000.0
    late = new_job(7, "batch_7c0ffee", "submit", t - 300, name="/data/eval.jsonl",
                   window_s=900.0)
    late.total, late.completed = 40_000, 9_000
    late.endpoints = {"chat": 32_000, "embeddings": 8_000}  # its endpoint mix on its line
    calm = new_job(8, "batch_8d00d1e", "run", t - 120, name="/data/synth.jsonl")
    calm.total, calm.completed, calm.failed = 5_000, 2_400, 2
    calm.endpoints = {"completions": 5_000}
    views = [JobView(7, 0, late.deadline, 31_000, 3_100_000, 184.0, 1, 0.25, t + 1_380.0, True),
             JobView(8, 0, None, 2_598, 260_000, 12.5, 3, 0.75, t + 95.0)]
    snap = msgspec.structs.replace(make_snapshot(t=t), jobs=[late, calm], job_views=views)
    app = TopApp(FixedSource([snap]), interval=1.0)
    assert snap_compare(app, terminal_size=(120, 36), run_before=ready(1))


# The README's example workload on the simulator, as a newcomer first sees it: labels as
# long as `support-0/fewshot-2/tools-1`, each GPU showing the shape it pulls from and the
# next one, event reasons longer than a line, a live job with its one forecast. Nothing
# wraps (a wrapped GPU row pushed the second GPU off the screen), the GPU and job ids are
# whole, event reasons end at a word with an ellipsis.
def newcomer_app() -> TopApp:
    snaps = [make_snapshot(t=1000.0 + k, newcomer=True) for k in range(3)]
    return TopApp(FixedSource(snaps), interval=1.0)


def events_filled(app: TopApp) -> bool:
    return app.view == "events" and app.query_one("#event-list", LineList).count > 0


def test_newcomer_overview_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(newcomer_app(), terminal_size=(80, 24), run_before=ready(3))


def test_newcomer_overview_120x40(snap_compare: SnapCompare) -> None:
    assert snap_compare(newcomer_app(), terminal_size=(120, 40), run_before=ready(3))


def test_newcomer_events_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(newcomer_app(), terminal_size=(80, 24),
                        run_before=ready(3, ("4",), events_filled))


def test_newcomer_events_120x40(snap_compare: SnapCompare) -> None:
    assert snap_compare(newcomer_app(), terminal_size=(120, 40),
                        run_before=ready(3, ("4",), events_filled))


def test_help_80x24(snap_compare: SnapCompare) -> None:
    def shown(app: TopApp) -> bool:
        return type(app.screen).__name__ == "HelpScreen"

    assert snap_compare(newcomer_app(), terminal_size=(80, 24),
                        run_before=ready(3, ("question_mark",), shown))


def test_help_120x40(snap_compare: SnapCompare) -> None:
    def shown(app: TopApp) -> bool:
        return type(app.screen).__name__ == "HelpScreen"

    assert snap_compare(newcomer_app(), terminal_size=(120, 40),
                        run_before=ready(3, ("question_mark",), shown))
