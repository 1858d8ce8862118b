"""The base of every frame a request and its reply exchange: the request id comes first.

Contract: `Message` is a tagged msgspec Struct (its tag: the subclass's name) whose first
field is `rid`, the request id a reply echoes; a subclass adds its own fields after it, so
its frames are those of the same Struct written with `rid` first.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, tag=True):
    """Why: a request and its reply are matched by `rid`; each carries it, declared once."""

    rid: int
