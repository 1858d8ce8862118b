"""The OpenAI batch input line: `{"custom_id", "method": "POST", "url", "body": {...}}`.

Contract: `custom_id` becomes the item id (same rules as a native id); `method` must be
"POST"; `url` must be one of `URLS` (every url of `core.endpoints`: its canonical urls and
vLLM's /score, /rerank, /v2/rerank, which go to /v1/score and /v1/rerank), else the refusal
lists them; `body` must be an object with a
non-empty string `model`. The body goes to the engine as written, on the line's endpoint (see
`fabricctl.core.payload`): every field, known to fabricctl or not, reaches vLLM untouched, and
vLLM's answer (or its refusal) is the line's result. fabricctl reads only what it schedules
by: the size (`max_tokens`, else `max_completion_tokens`, else 16, the completions API's
default, for sizing only: an absent field stays absent; see `fabricctl.formats.endpoints` for
the other endpoints) and the shape. `body.stream` must not be true.

- /v1/completions: the prompt is `body.prompt` (one string). A shared prefix may be
  declared with the fabricctl extension `body.prefix` (a list of strings, the same rule as
  native `prefix`); the engine then sends `"".join(prefix) + prompt` as the prompt and no
  `prefix` field. Without it the line has no components (signature 0).
- /v1/chat/completions: `body.messages` as `fabricctl.formats.chat` reads them: every
  message before the last (after `body.tools`, when given) is one component, in order.
- the other endpoints: `fabricctl.formats.endpoints` reads the body and says its shape (the
  embedding instruction or a declared `body.prefix`, the score or rerank query, the
  responses instructions and input items before the last, the transcription prompt).

`body.metadata.label` (a string), when present, names the shape like native `label`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fabricctl.formats.chat import chat_components
from fabricctl.formats.common import (
    DEFAULT_OPENAI_MAX_TOKENS,
    URL_SOURCES,
    Draft,
    Fields,
    Invalid,
    Source,
    a_json_type,
)
from fabricctl.formats.endpoints import read_endpoint

# Any of these keys marks a line as meant to be an OpenAI batch request.
OPENAI_KEYS = ("custom_id", "method", "url", "body")
URLS = tuple(URL_SOURCES)  # every url a line may name, in the order a refusal lists them

_encode = msgspec.json.encode


def parse_openai(obj: dict[str, Any]) -> Draft:
    """The draft of one OpenAI batch line, or Invalid naming the first bad field."""
    line = Fields(obj)
    ident = line.item_id("custom_id")
    if line.need("method") != "POST":
        raise Invalid("method must be POST")
    url = line.need("url")
    source = URL_SOURCES.get(url) if isinstance(url, str) else None
    if source is None:
        raise Invalid(f"url must be one of {', '.join(URLS)}")
    body = line.need("body")
    if not isinstance(body, dict):
        raise Invalid(f"body must be a JSON object, not {a_json_type(body)}")
    fields = Fields(body, "body.")
    model = fields.string("model", nonempty=True)
    if body.get("stream") is True:
        raise Invalid("body.stream must be false in a batch")
    if source not in (Source.COMPLETIONS, Source.CHAT):
        request = read_endpoint(source, {k: v for k, v in body.items()
                                         if k not in ("model", "prefix")},
                                "body.", fields.prefix("prefix"))
        return Draft(
            ident, model, request.components, request.prompt, request.max_tokens, source,
            input_tokens=request.input_tokens,
            label=_label(body),
            body=_encode(request.body),
            path=source.url or "",
        )
    max_tokens = _max_tokens(fields)
    if source is Source.COMPLETIONS:
        prompt = fields.need("prompt")
        if not isinstance(prompt, str):
            raise Invalid("body.prompt must be a single string")
        components = fields.prefix("prefix")
        sent = {k: v for k, v in body.items() if k not in ("model", "prompt", "prefix")}
    else:
        components, prompt = chat_components(
            fields.need("messages"), body.get("tools"), "body.messages")
        sent = {k: v for k, v in body.items() if k != "model"}
    return Draft(
        ident, model, components, prompt, max_tokens, source,
        label=_label(body),
        chat=source is Source.CHAT,
        body=_encode(sent),
    )


def _max_tokens(body: Fields) -> int:
    for key in ("max_tokens", "max_completion_tokens"):
        count = body.optional_count(key)
        if count is not None:
            return count
    return DEFAULT_OPENAI_MAX_TOKENS


def _label(body: dict[str, Any]) -> str:
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        return Fields(metadata, "body.metadata.").optional_string("label")
    return ""
