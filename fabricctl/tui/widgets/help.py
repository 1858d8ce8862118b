"""The `?` help screen: every key of the dashboard, closed with Esc, q or ?.

Contract: `HelpScreen` is a modal screen listing `KEYS` (key, what it does), the same keys
the app binds; it changes nothing in the app and dismisses itself on Esc, q or ?.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("1 2 3 4", "overview · lanes of the selected shape · thrash · events"),
    ("Enter", "lanes of the shape under the cursor"),
    ("Esc", "back to the overview; clear the filter"),
    ("/", "filter shapes (model, signature, label, state)"),
    ("s / S", "sort by the next column / reverse (or click a header)"),
    ("p", "pause / resume the display"),
    ("+ / -", "refresh less / more often"),
    ("↑ ↓ PgUp PgDn", "move, scroll"),
    ("lanes/2048", "lanes in use; (n!) = n starving lanes"),
    ("?", "this help"),
    ("q", "quit"),
)


class HelpScreen(ModalScreen[None]):
    """Why: the footer cannot list every key at 80 columns."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        rows = "\n".join(f"[b]{k:>14}[/]  {v}" for k, v in KEYS)
        with Vertical(id="help"):
            yield Static("[b]fabricctl top[/] keys", id="help-title")
            yield Static(rows)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
