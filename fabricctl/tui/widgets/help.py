"""The `?` help screen: every key bound where it was opened, and what each view shows.

Contract: `key_rows(bindings, key_display)` turns a screen's `active_bindings` (the app's,
the screen's and the focused widget's `BINDINGS`, Textual's own included) into one
`KeyRow` per binding: its keys as the footer shows them (`App.get_key_display`) and what it
does (its `tooltip`, else its `description`), the app's first, in the order they are
declared, so a new binding is listed without editing this module. `HelpScreen(rows,
views)` is a modal screen listing those rows, then its own bindings', and a line per view
(`(name, what it shows)`), scrolling when they do not fit; it changes nothing in the app
and dismisses itself on Esc, q or ?.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


@dataclass(frozen=True)
class KeyRow:
    """Why: one line of the help: a binding's keys as shown, and what it does."""

    keys: str
    text: str


def key_rows(bindings: Mapping[str, ActiveBinding],
             key_display: Callable[[Binding], str]) -> list[KeyRow]:
    """One row per binding (a binding of several keys, `plus,equals_sign`, is one row: `+ =`),
    the app's bindings first, then the focused widget's, then the screen's."""
    groups: dict[tuple[int, str, str, str], tuple[tuple[int, int], list[str], Binding]] = {}
    for k, active in enumerate(bindings.values()):
        node, b = active.node, active.binding
        rank = 0 if node is node.app else (2 if node is node.screen else 1)
        _, keys, _ = groups.setdefault((id(node), b.action, b.description, b.tooltip),
                                       ((rank, k), [], b))
        if (shown := key_display(b)) not in keys:
            keys.append(shown)
    return [KeyRow(" ".join(keys), b.tooltip or b.description or b.action)
            for _, keys, b in sorted(groups.values(), key=lambda g: g[0])]


class HelpScreen(ModalScreen[None]):
    """Why: the footer cannot list every key at 80 columns."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close",
                        tooltip="close this help")]

    def __init__(self, rows: Sequence[KeyRow], views: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.rows, self.views = list(rows), list(views)

    def compose(self) -> ComposeResult:
        own = [KeyRow(" ".join(self.app.get_key_display(Binding(k, b.action))
                               for k in b.key.split(",")), b.tooltip or b.description)
               for b in self.BINDINGS if isinstance(b, Binding)]
        rows = [*self.rows, *own]
        width = max(len(r.keys) for r in rows)
        keys = "\n".join(f"[b]{escape(r.keys):>{width}}[/]  {escape(r.text)}" for r in rows)
        views = "\n".join(f"[b]{k}. {escape(name)}[/]  {escape(text)}"
                          for k, (name, text) in enumerate(self.views, 1))
        with VerticalScroll(id="help") as box:
            box.border_title = "fabricctl top: keys"
            yield Static(keys, id="help-keys")
            yield Static("[b]views[/]", id="help-views-title")
            yield Static(views, id="help-views")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
