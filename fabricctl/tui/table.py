"""The shapes table as data: columns, cells, sort orders and the `/` filter (no Textual).

Contract: `fit(width, models)` names the columns that fit a terminal (all of them from about
104 cells; at 80 the model, age and epoch go, the model only when there is one);
`widths(measured, width, models)` those columns' widths, the label's grown into the room
left (up to `LABEL_MAX`: at 80 columns a label is cut at `LABEL_SHORT`);
`rows(shapes, sort, reverse, query)` returns the table's rows in display order, each
`(key, cells)` with `key = "model:hex"` stable across snapshots and one `Cell` (text,
style, right-aligned) per `COLUMNS` entry; the filter keeps shapes whose model, hex
signature, label and state together contain every whitespace-separated word of the
query (case-insensitive).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from fabricctl import fmt
from fabricctl.core.signature import signature_hex
from fabricctl.core.snapshot import ShapeView
from fabricctl.tui.palette import CRITICAL, STATES, WARN, state_style

LANES_MAX = 2048
LABEL_SHORT = 14  # the label column's width where the terminal is short of room
LABEL_MAX = 40  # and its widest, where there is room to spare (`widths`)


class Column(NamedTuple):
    key: str
    label: str
    sort: Callable[[ShapeView], Any]
    numeric: bool = True
    width: int = 6  # the usual cell width, to decide what fits


STATE_ORDER = {s: k for k, s in enumerate(("active", "draining", "warming", "staged",
                                            "finished"))}

COLUMNS: tuple[Column, ...] = (
    Column("model", "model", lambda s: s.model, False, 10),
    Column("signature", "signature", lambda s: s.signature, False, 16),
    Column("label", "label", lambda s: s.label, False, 10),
    Column("state", "state", lambda s: (STATE_ORDER.get(s.state, 9), -s.tokens), False, 8),
    Column("epoch", "ep", lambda s: s.epoch, True, 3),
    Column("tokens", "tokens", lambda s: s.tokens),
    Column("lanes", f"lanes/{LANES_MAX}", lambda s: s.lanes_in_use, True, 10),
    Column("batches", "batches", lambda s: s.batches, True, 7),
    Column("waste", "waste", lambda s: s.waste),
    Column("age", "age", lambda s: s.age),
)
DROP_ORDER = ("model", "age", "epoch", "batches", "label")
"""What a narrow terminal gives up first (the model only when there is just one)."""
COLUMN_KEYS: tuple[str, ...] = tuple(c.key for c in COLUMNS)
BY_KEY = {c.key: c for c in COLUMNS}


def fit(width: int, models: int, padding: int = 1,
        widths: dict[str, int] | None = None) -> tuple[str, ...]:
    """The column keys that fit in `width` cells, dropping per `DROP_ORDER`.

    `widths` are the columns' measured widths; without them each column's usual width.

    >>> fit(200, 2) == COLUMN_KEYS
    True
    >>> fit(78, 1)
    ('signature', 'label', 'state', 'tokens', 'lanes', 'batches', 'waste')
    """
    keys = list(COLUMN_KEYS)

    def need() -> int:
        return sum((widths or {}).get(k, BY_KEY[k].width) + 2 * padding for k in keys)

    for k in DROP_ORDER:
        if need() <= width:
            break
        if k == "model" and models > 1:
            continue
        keys.remove(k)
    return tuple(keys)


def widths(measured: dict[str, int], width: int, models: int, padding: int = 1
           ) -> dict[str, int]:
    """The shown columns (`fit`) and each one's width: as measured, but the label's at most
    `LABEL_SHORT` to decide what fits, then as much of the room left as its longest needs.

    >>> m = {"model": 5, "signature": 16, "label": 30, "state": 6, "epoch": 2, "tokens": 6,
    ...      "lanes": 10, "batches": 7, "waste": 5, "age": 5}
    >>> widths(m, 120, 1)["label"], widths(m, 100, 1)["label"], widths(m, 80, 1)["label"]
    (30, 18, 16)
    >>> tuple(widths(m, 80, 1))
    ('signature', 'label', 'state', 'tokens', 'lanes', 'batches', 'waste')
    """
    short = {**measured, "label": min(measured.get("label", 0), LABEL_SHORT)}
    shown = fit(width, models, padding, short)
    out = {k: short[k] for k in shown if k in short}
    if "label" in out:
        room = width - sum(w + 2 * padding for w in out.values())
        out["label"] += max(0, min(measured["label"] - out["label"], room))
    return out


def row_key(s: ShapeView) -> str:
    return f"{s.model}:{signature_hex(s.signature)}"


def matches(s: ShapeView, words: list[str]) -> bool:
    hay = f"{s.model} {signature_hex(s.signature)} {s.label} {s.state}".lower()
    return all(w in hay for w in words)


class Cell(NamedTuple):
    """One cell as plain data: the live table pads it, the Rich one-shot wraps it in Text."""

    text: str
    style: str = ""
    right: bool = False


def _num(text: str, style: str = "") -> Cell:
    return Cell(text, style, True)


Cells = tuple[Cell, ...]


def cells(s: ShapeView) -> Cells:
    """One row's cells, in `COLUMNS` order; the state in its colour, hot figures warned."""
    waste_style = WARN if s.waste > s.threshold > 0 else ""
    lanes_style = CRITICAL if s.starving else ("" if s.lanes_in_use < LANES_MAX else WARN)
    lanes = f"{s.lanes_in_use}" + (f" ({s.starving}!)" if s.starving else "")
    return (
        Cell(fmt.shorten(s.model, 12)),
        Cell(signature_hex(s.signature)),
        Cell(fmt.shorten(s.label, LABEL_MAX)),
        Cell(s.state, state_style(s.state)),
        _num(str(s.epoch) if s.epoch else "-"),
        _num(fmt.si(s.tokens)),
        _num(lanes, lanes_style),
        _num(f"{s.batches:,}"),
        _num(fmt.pct(s.waste), waste_style),
        _num(fmt.age(s.age)),
    )


def rows(shapes: list[ShapeView], sort: str = "state", reverse: bool = False,
         query: str = "") -> list[tuple[str, Cells]]:
    """The visible rows in display order (see the module contract)."""
    words = query.lower().split()
    picked = [s for s in shapes if matches(s, words)] if words else list(shapes)
    col = BY_KEY.get(sort, BY_KEY["state"])
    picked.sort(key=lambda s: (col.sort(s), s.model, s.signature), reverse=reverse)
    return [(row_key(s), cells(s)) for s in picked]


def counts_by_state(shapes: list[ShapeView]) -> dict[str, int]:
    out = dict.fromkeys(STATES, 0)
    for s in shapes:
        out[s.state] = out.get(s.state, 0) + 1
    return out
