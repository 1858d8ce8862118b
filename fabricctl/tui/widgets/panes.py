"""The four views of the dashboard, each drawing one snapshot with the pure renderers.

Contract: every pane has `apply(snap, state)` where `state` is the app's `ViewState`
(selection, sort, filter, tokens/s history, accumulated events); panes never touch the
network or the clock, so a fixed snapshot always draws the same screen.
- `Overview`: state machine + models, shapes table (+ the `/` filter box), GPU panel, ledger;
- `LanesPane`: the selected shape's lanes, one bar each against the pressure threshold;
- `ThrashPane`: batches-per-shape histogram with the thrash line, recent shapes, critical
  events;
- `EventsPane`: the event log, newest first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Static

from fabricctl.core.events import Event
from fabricctl.core.snapshot import ShapeView, Snapshot
from fabricctl.tui import charts, draw, table
from fabricctl.tui.draw import shape_name
from fabricctl.tui.gpu import RateTracker, gpu_panel
from fabricctl.tui.palette import MUTED
from fabricctl.tui.widgets.lines import LineList, TextBox
from fabricctl.tui.widgets.shapes import ShapesTable

EVENTS_KEPT = 2000


@dataclass
class ViewState:
    """Why: what the user chose and what accumulated across snapshots, apart from widgets."""

    selected: tuple[str, int] | None = None
    sort: str = "state"
    reverse: bool = False
    query: str = ""
    rates: RateTracker = field(default_factory=RateTracker)
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    last_seq: int = 0

    def take_events(self, snap: Snapshot) -> None:
        """Keep the events not seen yet; a restarted broker (lower seq) starts over."""
        if snap.events and snap.events[-1].seq < self.last_seq:
            self.last_seq = 0
        for e in snap.events:
            if e.seq > self.last_seq:
                self.events.append(e)
                self.last_seq = e.seq

    def critical(self) -> list[Event]:
        return [e for e in self.events if e.critical]


def find_shape(snap: Snapshot, key: tuple[str, int] | None) -> ShapeView | None:
    if key is None:
        return None
    return next((s for s in snap.shapes if (s.model, s.signature) == key), None)


class Overview(Vertical):
    def compose(self) -> ComposeResult:
        yield TextBox(id="machine")
        yield ShapesTable(id="shapes")
        yield Input(placeholder="filter: words of model, signature, label, state", id="filter")
        yield TextBox(id="gpus")
        yield TextBox(id="jobs")
        yield TextBox(id="ledger")

    def apply(self, snap: Snapshot, state: ViewState) -> None:
        jobs = self.query_one("#jobs", TextBox)
        jobs.show(draw.jobs_lines(snap))
        jobs.set_class(bool(snap.jobs), "-shown")
        jobs.set_class(draw.jobs_at_risk(snap) > 0, "-at-risk")
        self.query_one("#machine", TextBox).show(
            Text("\n").join([draw.state_machine(snap.states), draw.models(snap)]))
        self.query_one(ShapesTable).show(
            table.rows(snap.shapes, state.sort, state.reverse, state.query),
            len({s.model for s in snap.shapes}))
        self.query_one("#gpus", TextBox).show(gpu_panel(snap, state.rates))
        self.query_one("#ledger", TextBox).show(draw.ledger_line(snap))


class LanesPane(Vertical):
    def compose(self) -> ComposeResult:
        yield TextBox(id="lanes-head")
        yield Static(charts.LANE_HEAD, id="lanes-cols")
        yield LineList(id="lane-list")

    def apply(self, snap: Snapshot, state: ViewState) -> None:
        head = self.query_one("#lanes-head", TextBox)
        lines = self.query_one("#lane-list", LineList)
        shape = find_shape(snap, state.selected)
        if state.selected is None:
            head.show(Text("no shape selected: pick one in the overview (1) and press Enter",
                           style=MUTED))
            lines.set_lines(0, lines.line_fn)
            return
        if shape is None:
            model, sig = state.selected
            head.show(Text(f"{model} {shape_name(sig)} is no longer live (finished)",
                           style=MUTED))
            lines.set_lines(0, lines.line_fn)
            return
        head.show(charts.lanes_header(shape))
        lanes = shape.lanes or []
        threshold = shape.threshold
        lines.set_lines(len(lanes),
                        lambda i, w: charts.lane_line(lanes[i], threshold, w))


class ThrashPane(Vertical):
    def compose(self) -> ComposeResult:
        with Horizontal(id="thrash-top"):
            yield TextBox(id="histogram")
            yield TextBox(id="recent")
        yield Static("critical events", id="critical-title")
        yield LineList(id="critical")

    def apply(self, snap: Snapshot, state: ViewState) -> None:
        hist = self.query_one("#histogram", TextBox)
        view = snap.batches_histogram
        text = charts.batches_histogram(view, hist.content_size.width or 38)
        hist.show(text)
        recent = self.query_one("#recent", TextBox)
        rows = len(text.plain.split("\n")) - 2
        recent.show(charts.recent_shapes(view.samples, view.thrash_line,
                                         recent.content_size.width or 38, rows))
        crit = state.critical()
        t = snap.t
        self.query_one("#critical", LineList).set_lines(
            len(crit), lambda i, w: draw.event_line(crit[-1 - i], t))


class EventsPane(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("events, newest first: transitions, pre-warms, force-drains, thrash, "
                     "consumers", id="events-title")
        yield LineList(id="event-list")

    def apply(self, snap: Snapshot, state: ViewState) -> None:
        events = list(state.events)
        t = snap.t
        self.query_one("#event-list", LineList).set_lines(
            len(events), lambda i, w: draw.event_line(events[-1 - i], t))
