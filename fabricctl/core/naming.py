"""One way to name a shape: its signature in 16 hex digits, its label, or a hex prefix.

Contract: `match(arg, shapes)` is the shapes `arg` names, one per (model, signature), in the
order given (callers list live shapes first, then finished records newest first, so the
first of a key is the one to show). The rules, first that matches wins: a hex number (16
digits or fewer, `0x` and leading zeros optional) equal to the signature; the label, exactly;
a hex prefix (no `0x`) of the signature's 16 digits. More than one result is ambiguous: the
caller says so with `describe` of each. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from fabricctl.core.signature import signature_hex

_HEX = frozenset("0123456789abcdef")


class Named(Protocol):
    """Why: live shapes and finished records are named alike; this is what naming reads."""

    @property
    def model(self) -> str: ...
    @property
    def signature(self) -> int: ...
    @property
    def label(self) -> str: ...


N = TypeVar("N", bound=Named)


def _rules(arg: str) -> list[Callable[[Named], bool]]:
    raw = arg.lower()
    want = raw.removeprefix("0x")
    is_hex = 0 < len(want) <= 16 and set(want) <= _HEX
    rules: list[Callable[[Named], bool]] = []
    if is_hex:
        number = int(want, 16)
        rules.append(lambda s: s.signature == number)
    rules.append(lambda s: bool(s.label) and s.label == arg)
    if is_hex and not raw.startswith("0x"):
        rules.append(lambda s: signature_hex(s.signature).startswith(want))
    return rules


def match(arg: str, shapes: Iterable[N]) -> list[N]:
    """The shapes `arg` names under the first rule that names any, one per key."""
    pool = list(shapes)
    for rule in _rules(arg):
        found: dict[tuple[str, int], N] = {}
        for s in pool:
            if rule(s):
                found.setdefault((s.model, s.signature), s)
        if found:
            return list(found.values())
    return []


def describe(s: Named) -> str:
    """`<16 hex digits> <label> (<model>)`: how an error lists a shape."""
    return f"{signature_hex(s.signature)}{' ' + s.label if s.label else ''} ({s.model})"
