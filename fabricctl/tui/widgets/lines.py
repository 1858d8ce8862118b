"""Text widgets that redraw only what changed or what is on screen.

Contract: `TextBox.show(text)` replaces a Static's content only when the text differs and
keeps the last `Text` in `.text` for tests; `LineList` is a scrollable list of any length
(2,048 lanes, thousands of events) that renders only its visible lines, each produced on
demand by `line_fn(index, width) -> Text`, and `line_text(i)` returns a line as drawn.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

LineFn = Callable[[int, int], Text]


class TextBox(Static):
    """A Static that skips identical updates and relayouts only when its height changes."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", id=id, classes=classes)
        self.text = Text()

    def show(self, text: Text) -> None:
        if text == self.text:
            return
        height_changed = len(text.plain.split("\n")) != len(self.text.plain.split("\n"))
        self.text = text
        self.update(text, layout=height_changed)


def _blank(i: int, width: int) -> Text:
    return Text()


class LineList(ScrollView, can_focus=True):
    """Why: a DataTable or a Static of 2,048 rows would rebuild every row at 4 Hz."""

    DEFAULT_CSS = "LineList { height: 1fr; }"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.count = 0
        self.line_fn: LineFn = _blank

    def set_lines(self, count: int, line_fn: LineFn) -> None:
        self.count, self.line_fn = count, line_fn
        width = self.scrollable_content_region.width
        if self.virtual_size.height != count or self.virtual_size.width != width:
            self.virtual_size = Size(width, count)
        self.refresh()

    def on_resize(self) -> None:
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
