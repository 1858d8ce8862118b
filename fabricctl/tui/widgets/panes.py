"""The four views of the dashboard, each drawing one snapshot with the pure renderers.

Contract: every pane has `apply(snap, state)` where `state` is the app's `ViewState`
(view, selection, sort, filter, tokens/s history, accumulated events); panes never touch the
network or the clock, so a fixed snapshot always draws the same screen.
- `Overview`: state machine + models, shapes table (+ the `/` filter box), GPU panel, ledger;
- `LanesPane`: the selected shape's lanes, one bar each against the pressure threshold;
- `ThrashPane`: batches-per-shape histogram with the thrash line, recent shapes, critical
  events;
- `EventsPane`: the event log, newest first.
Each pane's `HELP` says in a line what it shows (the `?` screen lists them). Lines never
wrap: the overview's boxes and the event lines are cut to the pane's width (`draw.fit`;
event lines at a word boundary), the least important part last.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
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


class EventTrail:
    """Why: the events of every snapshot so far, each kept once, across a broker restart."""

    def __init__(self) -> None:
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.last_seq = 0

    def take(self, snap: Snapshot) -> None:
        """Keep the events not seen yet; a restarted broker (lower seq) starts over."""
        if snap.events and snap.events[-1].seq < self.last_seq:
            self.last_seq = 0
        for e in snap.events:
            if e.seq > self.last_seq:
                self.events.append(e)
                self.last_seq = e.seq


@dataclass(frozen=True)
class ViewState:
    """Why: what the user chose (view, selection, sort, filter), replaced whole so the app's
    reactive `state` redraws on a change; what accumulates across snapshots rides along."""

    view: str = "overview"
    selected: tuple[str, int] | None = None
    sort: str = "state"
    reverse: bool = False
    query: str = ""
    rates: RateTracker = field(default_factory=RateTracker, compare=False)
    trail: EventTrail = field(default_factory=EventTrail, compare=False)

    @property
    def events(self) -> deque[Event]:
        return self.trail.events

    def take_events(self, snap: Snapshot) -> None:
        self.trail.take(snap)

    def critical(self) -> list[Event]:
        return [e for e in self.events if e.critical]


def find_shape(snap: Snapshot, key: tuple[str, int] | None) -> ShapeView | None:
    if key is None:
        return None
    return next((s for s in snap.shapes if (s.model, s.signature) == key), None)


def event_lines(events: list[Event], snap: Snapshot) -> Callable[[int, int], Text]:
    """A `LineList`'s lines of `events`, newest first, all in one form at a width
    (`draw.events_short`, decided once per width)."""
    t, one = snap.t, len(snap.models) <= 1
    forms: dict[int, bool] = {}

    def line(i: int, width: int) -> Text:
        if width not in forms:
            forms[width] = draw.events_short(events, t, width)
        return draw.event_line(events[-1 - i], t, width, one, forms[width])

    return line


class Overview(Vertical):
    """Why: the fleet at a glance, the view `top` opens on."""

    HELP = ("states and models, live shapes (Enter: lanes), GPUs, engines, jobs and their "
            "forecast, the ledger")

    def compose(self) -> ComposeResult:
        yield TextBox(id="machine")
        yield ShapesTable(id="shapes")
        yield Input(placeholder="filter: words of model, signature, label, state", id="filter")
        yield TextBox(id="gpus")
        yield TextBox(id="jobs")
        yield TextBox(id="ledger")

    def apply(self, snap: Snapshot, state: ViewState) -> None:
        # the boxes' lines are cut to the pane's width less their padding (a box hidden until
        # now has no width of its own yet); before the first layout, drawn after it: a box
        # drawn unfitted would wrap, and keep the wrapped height (`TextBox` relays out only
        # when its line count changes)
        if self.content_size.width <= 2:
            self.call_after_refresh(self._again, snap, state)
            return
        width = self.content_size.width - 2
        jobs = self.query_one("#jobs", TextBox)
        at_risk = draw.jobs_at_risk(snap) > 0  # its thick left border takes a padding's cell
        jobs.show(draw.jobs_lines(snap, width))
        jobs.set_class(bool(snap.jobs), "-shown")
        jobs.set_class(at_risk, "-at-risk")
        self.query_one("#machine", TextBox).show(draw.fit_lines(
            Text("\n").join([draw.state_machine(snap.states), draw.models(snap)]), width))
        self.query_one(ShapesTable).show(
            table.rows(snap.shapes, state.sort, state.reverse, state.query),
            len({s.model for s in snap.shapes}))
        self.query_one("#gpus", TextBox).show(gpu_panel(snap, state.rates, width))
        self.query_one("#ledger", TextBox).show(draw.fit(draw.ledger_line(snap), width,
                                                         words=True))

    def _again(self, snap: Snapshot, state: ViewState) -> None:
        """`apply` once the pane has its width, unless another snapshot was drawn since."""
        if self.content_size.width > 2 and getattr(self.app, "snapshot", None) is snap:
            self.apply(snap, state)


class LanesPane(Vertical):
    """Why: a shape's lanes show where its items wait and which starve."""

    HELP = ("the lanes of the shape opened with Enter against the pressure threshold; (n!): "
            "n starving lanes")

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
    """Why: shapes that finish after few batches (thrash) waste the engines' switches."""

    HELP = "batches per finished shape against the thrash line, recent shapes, critical events"

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
        self.query_one("#critical", LineList).set_lines(len(crit), event_lines(crit, snap))


class EventsPane(Vertical):
    """Why: the log of what the broker decided, newest first."""

    HELP = ("every event, newest first: transitions, pre-warms, force-drains, thrash, "
            "consumers")

    def compose(self) -> ComposeResult:
        yield Static("events, newest first: transitions, pre-warms, force-drains, thrash, "
                     "consumers", id="events-title")
        yield LineList(id="event-list")

    def apply(self, snap: Snapshot, state: ViewState) -> None:
        events = list(state.events)
        self.query_one("#event-list", LineList).set_lines(len(events),
                                                           event_lines(events, snap))
