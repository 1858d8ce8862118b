"""The native input line: `{"id", "model", "prefix": [...], "prompt", "max_tokens"}`.

Contract: required `id` (non-empty string, at most 256 characters), `model` (non-empty
string), `prompt` (string, may be empty) and `max_tokens` (integer >= 1); optional
`prefix` (a non-empty list of strings, the cacheable components in order; omit it for no
shared prefix, i.e. signature 0), `input_tokens` (integer >= 1, the producer's own count of
the whole prompt, which then wins over any tokenizer) and `label` (string, a human name for
the shape). An optional field set to null counts as absent. Unknown fields are ignored so
producers can carry their own metadata.
"""

from __future__ import annotations

from typing import Any

from fabricctl.formats.common import (
    Draft,
    Source,
    as_count,
    as_id,
    as_prefix,
    as_str,
    need,
)

# Any of these keys marks a line as meant to be native (used by format detection).
NATIVE_KEYS = ("id", "model", "prompt", "prefix", "max_tokens")


def parse_native(obj: dict[str, Any]) -> Draft:
    """The draft of one native line, or Invalid naming the first bad field."""
    ident = as_id(need(obj, "id"), "id")
    model = as_str(need(obj, "model"), "model", nonempty=True)
    prompt = as_str(need(obj, "prompt"), "prompt")
    max_tokens = as_count(need(obj, "max_tokens"), "max_tokens")
    prefix = obj.get("prefix")
    components = [] if prefix is None else as_prefix(prefix, "prefix")
    input_tokens = obj.get("input_tokens")
    if input_tokens is not None:
        input_tokens = as_count(input_tokens, "input_tokens")
    label = obj.get("label")
    label = "" if label is None else as_str(label, "label")
    return Draft(
        id=ident,
        model=model,
        components=components,
        prompt=prompt,
        max_tokens=max_tokens,
        source=Source.NATIVE,
        input_tokens=input_tokens,
        label=label,
    )
