"""Models with queued items and no consumer: the items that would wait without a word.

Contract: `unserved(shapes, consumers)` takes a snapshot's shape views (`model`, queued
`items` and `tokens`) and its consumer views (`model`, and `names`: the other names each
serves) and returns one `Waiting(model, items, tokens)` per model that has queued items in
its live shapes and no registered consumer, most items first (ties by model name).
`waiting_line(w)` is the one line every observer writes for it (`fabricctl status`,
`fabricctl top`): "N items wait for model 'X': no consumer". Pure: it reads what it is
handed and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import msgspec


class _Shape(Protocol):
    model: str
    items: int
    tokens: int


class _Consumer(Protocol):
    model: str
    names: list[str]


class Waiting(msgspec.Struct, frozen=True):
    """Why: items for a model nobody serves wait forever unless an observer says so."""

    model: str
    items: int  # queued (staged or dispatchable) items of its live shapes
    tokens: int  # their input tokens


def unserved(shapes: Iterable[_Shape], consumers: Iterable[_Consumer]) -> list[Waiting]:
    """The models with queued items and no consumer, most items first."""
    served = {n for c in consumers for n in (c.model, *c.names)}
    items: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for s in shapes:
        if s.model in served or s.items <= 0:
            continue
        items[s.model] = items.get(s.model, 0) + s.items
        tokens[s.model] = tokens.get(s.model, 0) + s.tokens
    out = [Waiting(m, n, tokens[m]) for m, n in items.items()]
    out.sort(key=lambda w: (-w.items, w.model))
    return out


def waiting_line(w: Waiting) -> str:
    """"N items wait for model 'X': no consumer"."""
    noun = "item waits" if w.items == 1 else "items wait"
    return f"{w.items:,} {noun} for model {w.model!r}: no consumer"
