"""Text widgets that redraw only what changed or what is on screen.

Contract: the data a widget draws is a Textual reactive, so the redraw follows the
assignment and an equal value redraws nothing. `TextBox.text` (set directly or through
`show(text)`) replaces a Static's content only when the text differs, relaying out only when
its height changes, and keeps the last `Text` for tests; `LineList` is a scrollable list of
any length (2,048 lanes, thousands of events) that renders only its visible lines, each
produced on demand by `line_fn(index, width) -> Text` for `index < count` (both reactive;
`set_lines(count, line_fn)` sets the two), and `line_text(i)` returns a line as drawn.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive, var
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

LineFn = Callable[[int, int], Text]


class TextBox(Static):
    """Why: a Static that skips identical updates and relayouts only when its height changes."""

    text: var[Text] = var(Text, init=False)
    """What the box shows; a different one updates the Static (`watch_text`)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", id=id, classes=classes)

    def show(self, text: Text) -> None:
        self.text = text

    def watch_text(self, old: Text, new: Text) -> None:
        self.update(new, layout=old.plain.count("\n") != new.plain.count("\n"))


def _blank(i: int, width: int) -> Text:
    return Text()


class LineList(ScrollView, can_focus=True):
    """Why: a DataTable or a Static of 2,048 rows would rebuild every row at 4 Hz."""

    DEFAULT_CSS = "LineList { height: 1fr; }"

    count: reactive[int] = reactive(0, init=False)
    """How many lines; the scrollable height follows it (`watch_count`)."""
    line_fn: reactive[LineFn] = reactive(lambda: _blank, init=False)
    """Line `i` at `width` cells; a new one repaints the visible lines."""

    def set_lines(self, count: int, line_fn: LineFn) -> None:
        self.line_fn = line_fn
        self.count = count
        self._fit()  # the width too: a scrollbar may have come or gone since

    def watch_count(self) -> None:
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        self.virtual_size = Size(self.scrollable_content_region.width, self.count)

    def line_text(self, i: int) -> Text:
        return self.line_fn(i, self.scrollable_content_region.width or 80)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        i = y + scroll_y
        width = self.scrollable_content_region.width
        base = self.rich_style
        if i >= self.count or width <= 0:
            return Strip.blank(width, base)
        text = self.line_fn(i, width)
        segments = [Segment(s.text, base + s.style if s.style else base, s.control)
                    for s in text.render(self.app.console, end="")]
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, base)
