"""The shapes table: one row per live shape, a header row, a row cursor; cheap at 4 Hz.

Contract: `ShapesTable.show(rows, models)` takes `fabricctl.tui.table.rows(...)` output and
shows the columns that fit its width (`table.widths`, again on resize), each as wide as its
widest cell (the label as wide as the room left allows, cut with an ellipsis). Only the
visible rows are drawn, each straight from plain strings (a DataTable re-renders every
visible cell through Rich on any change, which at 100 shapes x 4 Hz costs a third of a
core). The rows (`data`) and the cursor (`cursor_row`) are reactive: assigning them lays
out and repaints the table. The cursor stays on the same shape (by key) across snapshots.
Up/Down/PgUp/PgDn/Home/End move it; Enter, or a click on the highlighted row, posts
`RowSelected(key)`; a click on a header posts `HeaderSelected(column key)`.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from fabricctl.fmt import shorten
from fabricctl.tui.table import BY_KEY, COLUMN_KEYS, Cells, widths

PAD = 1  # spaces either side of a cell
Rows = tuple[list[tuple[str, Cells]], int]  # `table.rows(...)` output, and how many models


class ShapesTable(ScrollView, can_focus=True):
    """Why: 100 shapes at 4 Hz must cost a few strings per visible row, not Rich layouts."""

    COMPONENT_CLASSES = {"shapes-table--header", "shapes-table--cursor"}
    DEFAULT_CSS = """
    ShapesTable { height: 1fr; background: $surface; }
    ShapesTable > .shapes-table--header { text-style: bold; background: $panel; }
    ShapesTable > .shapes-table--cursor {
        background: $block-cursor-blurred-background;
    }
    ShapesTable:focus > .shapes-table--cursor {
        background: $block-cursor-background;
        text-style: bold;
    }
    """
    BINDINGS = [
        Binding("up", "move(-1)", show=False, tooltip="cursor to the shape above"),
        Binding("down", "move(1)", show=False, tooltip="cursor to the shape below"),
        Binding("pageup", "page(-1)", show=False, tooltip="a page of shapes up"),
        Binding("pagedown", "page(1)", show=False, tooltip="a page of shapes down"),
        Binding("home", "move(-1000000)", show=False, tooltip="the first shape"),
        Binding("end", "move(1000000)", show=False, tooltip="the last shape"),
        Binding("enter", "select", show=False, tooltip="the lanes of the shape under the cursor"),
    ]

    class RowSelected(Message):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    class HeaderSelected(Message):
        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    data: reactive[Rows] = reactive(lambda: ([], 1), always_update=True, init=False)
    """The rows shown, and how many models they span; every assignment re-fits the columns
    to the width (`watch_data`), as a new snapshot must, and repaints."""
    cursor_row: reactive[int] = reactive(0, init=False)
    """The highlighted row; moving it repaints."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.keys: list[str] = []
        self.cells: dict[str, Cells] = {}  # every column, by row key
        self.shown: tuple[str, ...] = ()
        self.widths: list[int] = []
        self._visible: list[Cells] = []  # shown columns only, in row order
        self._styles: dict[str, Style] = {}

    @property
    def row_count(self) -> int:
        return len(self.keys)

    def selected_key(self) -> str | None:
        return self.keys[self.cursor_row] if 0 <= self.cursor_row < len(self.keys) else None

    def column_offset(self, key: str) -> int:
        """The x of a shown column's first cell, from the table's left edge."""
        k = self.shown.index(key)
        return sum(w + 2 * PAD for w in self.widths[:k])

    # -- data ----------
    def show(self, rows: list[tuple[str, Cells]], models: int = 1) -> None:
        self.data = (rows, models)

    def watch_data(self, data: Rows) -> None:
        rows, models = data
        selected = self.selected_key()
        measured = {k: max([len(BY_KEY[k].label)] + [len(cells[c].text) for _, cells in rows])
                    for c, k in enumerate(COLUMN_KEYS)}
        fitted = widths(measured, self.scrollable_content_region.width or 80, models, PAD)
        self.shown = tuple(fitted)
        index = [COLUMN_KEYS.index(k) for k in self.shown]
        self.keys = [k for k, _ in rows]
        self.cells = dict(rows)
        self._visible = [tuple(cells[i] for i in index) for _, cells in rows]
        self.widths = list(fitted.values())
        if selected in self.cells:
            self.cursor_row = self.keys.index(selected)
        self.cursor_row = max(0, min(self.cursor_row, len(self.keys) - 1))
        self.virtual_size = Size(sum(w + 2 * PAD for w in self.widths), len(self.keys) + 1)

    def on_resize(self) -> None:
        self.mutate_reactive(ShapesTable.data)  # the same rows, fitted to the new width

    # -- drawing ----------
    def _style(self, spec: str) -> Style:
        style = self._styles.get(spec)
        if style is None:
            style = self._styles[spec] = Style.parse(spec) if spec else Style()
        return style

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            head = base + self.get_component_rich_style("shapes-table--header")
            text = "".join(f"{' ' * PAD}{BY_KEY[k].label:{'>' if BY_KEY[k].numeric else '<'}{w}}"
                           f"{' ' * PAD}" for k, w in zip(self.shown, self.widths, strict=True))
            return Strip([Segment(text, head)]).crop_extend(scroll_x, scroll_x + width, head)
        row = scroll_y + y - 1
        if row >= len(self._visible):
            return Strip.blank(width, base)
        line_style = base
        if row == self.cursor_row:
            line_style = base + self.get_component_rich_style("shapes-table--cursor")
        segments = []
        for cell, w in zip(self._visible[row], self.widths, strict=True):
            text = shorten(cell.text, w)
            text = text.rjust(w) if cell.right else text.ljust(w)
            segments.append(Segment(" " * PAD, line_style))
            style = line_style + self._style(cell.style) if cell.style else line_style
            segments.append(Segment(text, style))
            segments.append(Segment(" " * PAD, line_style))
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, line_style)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- moving and choosing ----------
    def move_to(self, row: int) -> None:
        self.cursor_row = max(0, min(row, len(self.keys) - 1))
        rows_visible = max(1, self.scrollable_content_region.height - 1)
        top = self.scroll_offset.y
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + rows_visible:
            self.scroll_to(y=self.cursor_row - rows_visible + 1, animate=False)

    def action_move(self, step: int) -> None:
        self.move_to(self.cursor_row + step)

    def action_page(self, step: int) -> None:
        self.move_to(self.cursor_row + step * max(1, self.scrollable_content_region.height - 1))

    def action_select(self) -> None:
        key = self.selected_key()
        if key is not None:
            self.post_message(self.RowSelected(key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        x = offset.x + self.scroll_offset.x
        if offset.y == 0:
            edge = 0
            for key, w in zip(self.shown, self.widths, strict=True):
                edge += w + 2 * PAD
                if x < edge:
                    self.post_message(self.HeaderSelected(key))
                    return
            return
        row = self.scroll_offset.y + offset.y - 1
        if row >= len(self.keys):
            return
        if row == self.cursor_row:
            self.action_select()
        else:
            self.move_to(row)
