"""The dashboard's colours, shared by the Textual app and the Rich one-shot.

Contract: every state of the shape lifecycle has one style (`STATE_STYLE`), and everything
critical (thrash events, thrashing histogram bars, starving lanes, a non-zero ledger
difference) is drawn in exactly `CRITICAL`, so tests and operators can rely on it.
`CRITICAL` is defined in `fabricctl.fmt`, so the CLI marks the same things in the same
colour without importing the TUI.
"""

from __future__ import annotations

from fabricctl.core.shape import SHAPE_STATES
from fabricctl.fmt import CRITICAL as CRITICAL  # the CLI's too: defined below both

STATE_STYLE: dict[str, str] = {
    "staged": "#5fafff",
    "warming": "#ffd75f",
    "active": "bold #5fd75f",
    "draining": "#d787ff",
    "finished": "#8a8a8a",
}
"""One colour per lifecycle state, in lifecycle order."""

STATES: tuple[str, ...] = tuple(s.value for s in SHAPE_STATES)
WARN = "#ffaf00"
OK = "#5fd75f"
DIM = "dim"
MUTED = "#8a8a8a"
BAR = "#5f87d7"
MIX = "#87afd7"
"""A job's endpoint mix (`chat 80% · embed 20%`) on its line."""
LINE = "#ff5f00"
"""Threshold lines (pressure threshold, 100-batch thrash line)."""


def state_style(state: str) -> str:
    return STATE_STYLE.get(state, "")
