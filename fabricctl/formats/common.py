"""What every input format parses into, and the field checks they share.

Contract: a format parser takes one decoded JSON object and returns a `Draft` or raises
`Invalid(reason)`, where `reason` is one short human sentence naming the offending field
(e.g. "max_tokens must be at least 1"). `Invalid` never escapes `fabricctl.formats.reader`: the
reader turns it into a `LineError`. `Source` records which format a line came in, because
results must go back out in the same form.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fabricctl.core.records import URL_SOURCES, Source

__all__ = ["URL_SOURCES", "Draft", "Invalid", "Source"]  # Source and URL_SOURCES: from core

MAX_ID_CHARS = 256
MAX_COUNT = 2**31 - 1  # token counts travel as fixed-width integers on the wire
DEFAULT_OPENAI_MAX_TOKENS = 16  # what the OpenAI completions API assumes when absent


class Invalid(Exception):
    """Why: lets a format parser stop at the first bad field with its one-sentence reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Draft(msgspec.Struct, gc=False):
    """Why: one format-free view of a valid line, before token counting and hashing."""

    id: str
    model: str
    components: list[str]
    prompt: str
    max_tokens: int
    source: Source
    input_tokens: int | None = None
    label: str = ""
    chat: bool = False  # the request goes to /v1/chat/completions
    body: bytes = b""  # the request body to send (JSON), as `fabricctl.core.payload` says
    path: str = ""  # the endpoint when not a completion one (`Payload.path`)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type: "null", "boolean", "array", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def a_json_type(value: Any) -> str:
    """The JSON type with its article, for messages such as "not an array"."""
    word = json_type(value)
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


class Fields:
    """Why: reads one JSON object's fields, each refusal naming the field by its full path."""

    def __init__(self, obj: dict[str, Any], where: str = "") -> None:
        self.obj = obj
        self.where = where  # the object's own path with its dot ("body."); "" at top level

    def need(self, key: str) -> Any:
        """The value of a required field, or Invalid("<path> is missing")."""
        if key not in self.obj:
            raise Invalid(f"{self.where}{key} is missing")
        return self.obj[key]

    def string(self, key: str, *, nonempty: bool = False) -> str:
        """A required string (and, with `nonempty`, not empty)."""
        return self._string(self.need(key), key, nonempty)

    def optional_string(self, key: str) -> str:
        """An optional string; absent (or null) is ""."""
        value = self.obj.get(key)
        return "" if value is None else self._string(value, key, False)

    def item_id(self, key: str) -> str:
        """An item id: a non-empty string of at most MAX_ID_CHARS characters."""
        ident = self.string(key, nonempty=True)
        if len(ident) > MAX_ID_CHARS:
            raise Invalid(f"{self.where}{key} is longer than {MAX_ID_CHARS} characters")
        return ident

    def count(self, key: str) -> int:
        """A required positive integer (see `optional_count`)."""
        return self._count(self.need(key), key)

    def optional_count(self, key: str) -> int | None:
        """A positive integer, or None when absent (or null); JSON booleans and floats such
        as 3.0 are refused."""
        value = self.obj.get(key)
        return None if value is None else self._count(value, key)

    def prefix(self, key: str) -> list[str]:
        """A declared shared prefix: a list of strings; empty, absent (or null) means none."""
        value = self.obj.get(key)
        if value is None:
            return []
        name = self.where + key
        if not isinstance(value, list):
            raise Invalid(f"{name} must be a list of strings")
        for i, part in enumerate(value):
            if not isinstance(part, str):
                raise Invalid(f"{name}[{i}] must be a string")
        return value

    def _string(self, value: Any, key: str, nonempty: bool) -> str:
        if not isinstance(value, str):
            raise Invalid(f"{self.where}{key} must be a string")
        if nonempty and not value:
            raise Invalid(f"{self.where}{key} must not be empty")
        return value

    def _count(self, value: Any, key: str) -> int:
        name = self.where + key
        if not isinstance(value, int) or isinstance(value, bool):
            raise Invalid(f"{name} must be an integer")
        if value < 1:
            raise Invalid(f"{name} must be at least 1")
        if value > MAX_COUNT:
            raise Invalid(f"{name} must be at most {MAX_COUNT}")
        return value
