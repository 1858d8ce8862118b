"""`fabricctl top`: the live dashboard, a Textual app over a pluggable snapshot source.

Contract:
- one thread worker (group "stream") runs a `Pump` (`tui.pump`), which reads and decodes
  the broker's snapshots off the UI thread and posts a `SnapshotArrived` per snapshot; the
  UI applies it inside `batch_update()`, drawing only the visible view, so nothing on the
  UI loop waits for the broker or decodes;
- a failing or ended stream posts `StreamLost`: a "reconnecting" banner (not a traceback)
  and a new attempt after a backoff doubling from `retry_min` to `retry_max`; the next
  snapshot hides the banner (`connected`);
- a new subscription (another interval, another selected shape) stops the pump before the
  next one starts; messages of a stopped pump are dropped, and the app stops the pump when it
  unmounts, so no thread outlives it;
- under the header, in every view, one warning line names the models with queued items
  and no registered consumer (`draw.waiting`), hidden while there are none;
- the lanes of exactly one shape are subscribed: the one opened with Enter;
- keys: q quit, ? help, / filter, Enter lanes, Esc back, p pause, 1-4 views, s/S sort,
  +/- refresh interval. `paused` keeps receiving but stops drawing; `?` lists the keys
  bound where it is pressed (`widgets.help.key_rows`: each binding's `tooltip`) and what
  each view shows (each pane's `HELP`);
- `state` (the `ViewState`: view, selection, sort, filter), `paused`, `interval` and
  `connected` are reactive (`var`s): an action assigns one and its watcher redraws what it
  shows (a new selection resubscribes; the picture and header; a new subscription and the
  header; the banner); no action redraws by hand.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.reactive import var
from textual.widgets import ContentSwitcher, Footer, Input

from fabricctl.core.snapshot import Snapshot
from fabricctl.tui import draw, table
from fabricctl.tui.palette import MUTED, WARN
from fabricctl.tui.pump import Pump, SnapshotArrived, StreamLost
from fabricctl.tui.sources import SnapshotSource
from fabricctl.tui.widgets.help import HelpScreen, key_rows
from fabricctl.tui.widgets.lines import TextBox
from fabricctl.tui.widgets.panes import (
    EventsPane,
    LanesPane,
    Overview,
    ThrashPane,
    ViewState,
)
from fabricctl.tui.widgets.shapes import ShapesTable

VIEWS = ("overview", "lanes", "thrash", "events")
INTERVALS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class TopApp(App[int]):
    """Why: operators watch the shape lifecycle, lane waste and thrashing as they happen."""

    CSS_PATH = str(Path(__file__).with_name("app.tcss"))  # absolute: subclasses live elsewhere
    TITLE = "fabricctl top"
    BINDINGS = [
        Binding("q", "quit", "quit", tooltip="quit"),
        Binding("question_mark", "help", "help", tooltip="this help: every key, every view"),
        Binding("slash", "filter", "filter",
                tooltip="filter the shapes (words of model, signature, label, state)"),
        Binding("enter", "details", "lanes", show=False,
                tooltip="the lanes of the shape under the cursor"),
        Binding("escape", "back", "back", tooltip="back to the overview; clear the filter"),
        Binding("p", "pause", "pause", tooltip="pause / resume the display"),
        Binding("1", "view('overview')", "overview", tooltip="the overview"),
        Binding("2", "view('lanes')", "lanes", tooltip="the lanes of the selected shape"),
        Binding("3", "view('thrash')", "thrash", tooltip="thrash: batches per shape"),
        Binding("4", "view('events')", "events", tooltip="the event log"),
        Binding("s", "sort(1)", "sort", show=False,
                tooltip="sort the shapes by the next column (or click a header)"),
        Binding("S", "sort(0)", "reverse", show=False, tooltip="reverse the sort"),
        Binding("plus,equals_sign", "interval(1)", "+int", show=False,
                tooltip="refresh less often"),
        Binding("minus", "interval(-1)", "-int", show=False, tooltip="refresh more often"),
    ]

    paused: var[bool] = var(False, init=False)
    """Snapshots still arrive but are not drawn; toggling redraws (`watch_paused`)."""
    interval: var[float] = var(1.0, init=False)
    """Seconds between snapshots; a new one resubscribes (`watch_interval`)."""
    connected: var[bool] = var(False, init=False)
    """A snapshot arrived since the stream last failed; becoming so hides the banner."""
    state: var[ViewState] = var(ViewState, init=False)
    """What the user chose, replaced whole; a change redraws (`watch_state`)."""

    def __init__(self, source: SnapshotSource, interval: float = 1.0, *,
                 retry_min: float = 0.25, retry_max: float = 5.0) -> None:
        super().__init__()
        self.source = source
        self.set_reactive(TopApp.interval, interval)  # no watcher: nothing runs yet
        self.retry_min, self.retry_max = retry_min, retry_max
        self.snapshot: Snapshot | None = None  # the one drawn
        self.latest: Snapshot | None = None  # the one received last
        self.received = 0
        self.pump: Pump | None = None

    # -- layout ----------
    def compose(self) -> ComposeResult:
        yield TextBox(id="header")
        yield TextBox(id="banner")
        yield TextBox(id="waiting")
        with ContentSwitcher(initial="overview", id="views"):
            yield Overview(id="overview")
            yield LanesPane(id="lanes")
            yield ThrashPane(id="thrash")
            yield EventsPane(id="events")
        yield Footer()

    def on_mount(self) -> None:
        # references, not queries: queries look at the active screen (help) or at nothing
        # (while the app shuts down), the widgets stay ours either way
        self.switcher = self.query_one(ContentSwitcher)
        panes: tuple[type[Overview | LanesPane | ThrashPane | EventsPane], ...] = (
            Overview, LanesPane, ThrashPane, EventsPane)
        self.panes: dict[str, Overview | LanesPane | ThrashPane | EventsPane] = {
            v: self.query_one(f"#{v}", pane) for v, pane in zip(VIEWS, panes, strict=True)}
        self.header_box = self.query_one("#header", TextBox)
        self.banner = self.query_one("#banner", TextBox)
        self.waiting = self.query_one("#waiting", TextBox)
        self.table = self.query_one(ShapesTable)
        self.filter_box = self.query_one("#filter", Input)
        self._banner(f"connecting to {self.source.address} …", lost=False)
        self._header()
        self.table.focus()
        self._restart_stream()

    @property
    def view(self) -> str:
        return self.switcher.current or "overview"

    # -- the stream ----------
    def _restart_stream(self) -> None:
        if self.pump is not None:
            self.pump.stop()
        lanes = [self.state.selected] if self.state.selected else []
        self.pump = Pump(self, self.source, self.interval, lanes, self.retry_min,
                         self.retry_max)
        self.run_worker(self.pump.run, group="stream", exclusive=True, thread=True,
                        exit_on_error=False)

    def on_unmount(self) -> None:
        if self.pump is not None:
            self.pump.stop()

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        if message.pump is not self.pump:
            return  # sent before its pump was stopped: another subscription's
        snap = message.snapshot
        self.latest = snap
        self.received += 1
        self.state.rates.update(snap)
        self.state.take_events(snap)
        self.connected = True
        if not self.paused:
            self._draw(snap)

    def on_stream_lost(self, message: StreamLost) -> None:
        if message.pump is not self.pump:
            return
        self.connected = False
        self._banner(f"broker lost ({message.reason}); reconnecting in "
                     f"{message.retry_in:g} s (attempt {message.attempt}); the last "
                     f"snapshot stays on screen")

    def watch_connected(self, connected: bool) -> None:
        if connected:
            self._banner("")

    def _draw(self, snap: Snapshot) -> None:
        self.snapshot = snap
        pane = self.panes[self.view]
        if not pane.is_mounted or not pane.children:
            return  # a snapshot that beat the pane's first compose: the next one draws it
        with self.batch_update():
            self._header()
            self._waiting(snap)
            try:
                pane.apply(snap, self.state)
            except NoMatches:  # ...or its nested containers' compose: the next one draws it
                return

    def watch_state(self, old: ViewState, new: ViewState) -> None:
        if new.selected != old.selected:
            self._restart_stream()
        if new.view != old.view:
            self.switcher.current = new.view
        self.redraw()
        if new.view != old.view:
            self.call_after_refresh(self.redraw)  # again, once the view has its size

    def redraw(self) -> None:
        if self.latest is not None:
            self._draw(self.latest)
        else:
            self._header()

    def on_resize(self) -> None:
        self.call_after_refresh(self.redraw)

    # -- header and banner ----------
    def _header(self) -> None:
        t = Text("fabricctl top", style="bold")
        t.append(f"  {self.source.address}", style=MUTED)
        t.append(f"  {self.view}  every {self.interval:g} s")
        col = table.BY_KEY[self.state.sort]
        t.append(f"  sort {col.label}{' ↓' if self.state.reverse else ''}", style=MUTED)
        if self.state.query:
            t.append(f"  filter “{self.state.query}”", style=WARN)
        if self.paused:
            t.append("  PAUSED", style="reverse " + WARN)
        self.header_box.show(t)

    def _waiting(self, snap: Snapshot) -> None:
        """The warning line of models with queued items and no consumer, in every view."""
        line = draw.waiting(snap)
        self.waiting.show(line)
        self.waiting.set_class(bool(line), "-shown")

    def _banner(self, text: str, lost: bool = True) -> None:
        banner = self.banner
        banner.show(Text(text))
        banner.set_class(bool(text), "-shown")
        banner.set_class(lost, "-lost")

    # -- actions ----------
    async def action_quit(self) -> None:
        self.exit(0)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            rows = key_rows(self.screen.active_bindings, self.get_key_display)
            views = [(v, type(self.panes[v]).HELP) for v in VIEWS]
            self.push_screen(HelpScreen(rows, views))

    def action_view(self, view: str) -> None:
        if view == "lanes" and self.state.selected is None:
            self.action_details()
            return
        self.state = replace(self.state, view=view)
        if view == "overview":
            self.table.focus()

    def action_details(self) -> None:
        key = self.table.selected_key()
        if key is None:
            self.notify("no shape under the cursor", severity="warning")
            return
        self.open_lanes(key)

    def open_lanes(self, key: str) -> None:
        model, _, hexsig = key.rpartition(":")
        self.state = replace(self.state, selected=(model, int(hexsig, 16)), view="lanes")

    @on(ShapesTable.RowSelected)
    def _row_selected(self, event: ShapesTable.RowSelected) -> None:
        self.open_lanes(event.key)

    @on(ShapesTable.HeaderSelected)
    def _header_selected(self, event: ShapesTable.HeaderSelected) -> None:
        key = event.column
        if key == self.state.sort:
            self.state = replace(self.state, reverse=not self.state.reverse)
        else:
            self.state = replace(self.state, sort=key, reverse=table.BY_KEY[key].numeric)

    def action_sort(self, step: int) -> None:
        if step:
            keys = table.COLUMN_KEYS
            key = keys[(keys.index(self.state.sort) + 1) % len(keys)]
            self.state = replace(self.state, sort=key, reverse=table.BY_KEY[key].numeric)
        else:
            self.state = replace(self.state, reverse=not self.state.reverse)

    def action_filter(self) -> None:
        self.state = replace(self.state, view="overview")
        box = self.filter_box
        box.add_class("-shown")
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.state = replace(self.state, query=event.value.strip())

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.table.focus()

    def action_back(self) -> None:  # type: ignore[override]  # Textual awaits either form
        box = self.filter_box
        if self.view != "overview":
            self.action_view("overview")
        elif box.has_focus or self.state.query:
            box.value = ""
            self.state = replace(self.state, query="")
            box.remove_class("-shown")
            self.table.focus()

    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self) -> None:
        self.redraw()

    def action_interval(self, step: int) -> None:
        k = min(range(len(INTERVALS)), key=lambda i: abs(INTERVALS[i] - self.interval))
        self.interval = INTERVALS[max(0, min(len(INTERVALS) - 1, k + step))]

    def watch_interval(self) -> None:
        self._restart_stream()
        self._header()

