"""`top` fits the terminal: at 80x24 and 120x40 no line of the overview's boxes or of the
event log is longer than its pane (nothing wraps: a wrapped GPU row pushed the next GPU off
the screen), the GPU and job ids come whole, and an event line that is cut ends at a word
with an ellipsis."""

from __future__ import annotations

import time

import pytest
from rich.text import Text
from textual.pilot import Pilot
from tui_synthetic import NEWCOMER_JOB, make_snapshot

from fabricctl.tui import draw
from fabricctl.tui.app import TopApp
from fabricctl.tui.sources import FixedSource
from fabricctl.tui.widgets.lines import LineList, TextBox


def test_fit_cuts_at_the_right_with_an_ellipsis_at_a_word_when_asked() -> None:
    line = Text("force-drained 17 lanes, 412 items")
    assert draw.fit(line, 40) is line
    assert draw.fit(line, 20).plain == "force-drained 17 la…"
    assert draw.fit(line, 20, words=True).plain == "force-drained 17…"
    assert draw.fit(Text("m support-0/fewshot-2/tools-1"), 24, words=True).plain == \
        "m support-0/fewshot-2/…"
    assert draw.fit(Text("abcdefghijklmnopqrstuvwxyz"), 10, words=True).plain == "abcdefghi…"
    critical = Text("THRASH  finished after 7 batches", style="")
    critical.stylize("red")
    cut = draw.fit(critical, 18, words=True)
    assert cut.plain == "THRASH  finished…" and cut.spans[-1].end == len(cut)


async def drawn(pilot: Pilot[int], app: TopApp, count: int) -> None:
    deadline = time.monotonic() + 10
    while app.received < count or app.table.row_count == 0 or not app.query_one(
            "#gpus", TextBox).text.plain:
        assert time.monotonic() < deadline, "no snapshot drawn"
        await pilot.pause(0.01)
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_no_line_of_the_overview_or_the_events_is_longer_than_its_pane(
        size: tuple[int, int]) -> None:
    snaps = [make_snapshot(t=1000.0 + k, newcomer=True) for k in range(3)]
    app = TopApp(FixedSource(snaps), interval=1.0)
    async with app.run_test(size=size) as pilot:
        await drawn(pilot, app, 3)
        for box_id in ("#machine", "#gpus", "#jobs", "#ledger"):
            box = app.query_one(box_id, TextBox)
            width = box.content_size.width
            lines = box.text.plain.split("\n")
            assert all(len(ln) <= width for ln in lines), (box_id, width, lines)
            assert box.content_size.height == len(lines), (box_id, "wrapped")
        gpus = app.query_one("#gpus", TextBox).text.plain.split("\n")
        for k, consumer in enumerate(("gpu0-consumer", "gpu1-consumer")):
            assert gpus[1 + k].split()[:2] == [consumer, f"gpu{k}"]  # one line each, whole
            assert " now support-" in gpus[1 + k]  # the shape it pulls from, before any cut
        jobs = app.query_one("#jobs", TextBox).text.plain.split("\n")
        assert jobs[0].split()[0] == NEWCOMER_JOB and jobs[1].split()[:3] == \
            ["finish", "in", "21s"]

        await pilot.press("4")
        events = app.query_one("#event-list", LineList)
        deadline = time.monotonic() + 10
        while app.view != "events" or events.count == 0:
            assert time.monotonic() < deadline, "no events drawn"
            await pilot.pause(0.01)
        width = events.scrollable_content_region.width
        cut = 0
        for i in range(events.count):
            shown = events.line_text(i).plain
            assert len(shown) <= width, shown
            if shown.endswith("…"):
                cut += 1
                kept = shown[:-1]
                assert not kept.endswith(" ")
                # it ends where a word ended: the full line goes on with a space, `,` or
                # (after a `/`) a new part, in its long or its label-only form
                compact = draw._event_line(app.state.events[-1 - i], app.snapshot.t,
                                           short=True, model=False).plain
                assert compact.startswith(kept)
                assert kept.endswith("/") or compact[len(kept)] in " ,", (kept, compact)
        assert cut  # the long reasons were cut
