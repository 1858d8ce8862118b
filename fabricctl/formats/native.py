"""The native input line: `{"id", "model", "prefix": [...], "prompt", "max_tokens"}`.

Contract: required `id` (non-empty string, at most 256 characters), `model` (non-empty
string), `max_tokens` (integer >= 1) and either `prompt` (string, may be empty) or
`messages` (a chat request); optional `prefix` (a list of strings, the cacheable components
in order; absent, null or `[]`: signature 0), `input_tokens` (integer >= 1, the producer's
own count, which wins over any tokenizer), `label` (the shape's human name) and `params` (an
object of OpenAI/vLLM request fields). An optional field set to null counts as absent;
unknown top-level fields are ignored (producers' own metadata).
The engine receives `params` as written plus `max_tokens` and the prompt (`"".join(prefix)
+ prompt` to /v1/completions), or plus `messages` (to /v1/chat/completions; every message
before the last is a component, so `prefix` cannot be given with it); nothing else.
`params` may not carry model, prompt, messages or max_tokens, nor ask for streaming.
`endpoint` (optional): "completions" (the default with `prompt`), "chat" (with `messages`),
or one of `ENDPOINTS` (the other `core.endpoints` entries' names), whose required
`params` is the request body an OpenAI batch line's `body` would be, less `model`, sent as
written and shaped by `fabricctl.formats.endpoints`; `prompt`, `messages` and `max_tokens`
are then not given, and `prefix` is allowed with "embeddings" only (the declared
instruction). The forms with examples: README.md, "Formats".
"""

from __future__ import annotations

from typing import Any

import msgspec

from fabricctl.core.endpoints import ENDPOINTS as ALL_ENDPOINTS
from fabricctl.formats.chat import chat_components
from fabricctl.formats.common import Draft, Fields, Invalid, Source, a_json_type
from fabricctl.formats.endpoints import read_endpoint

# Any of these keys marks a line as meant to be native (used by format detection).
NATIVE_KEYS = ("id", "model", "prompt", "messages", "prefix", "max_tokens", "params",
               "endpoint")
# Fields a native line gives at top level; in `params` they would say it twice.
TOP_LEVEL = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens")
# The endpoints a native line may name beside completions and chat, and their sources.
ENDPOINTS = {spec.name: spec.source for spec in ALL_ENDPOINTS
             if spec.source not in (Source.COMPLETIONS, Source.CHAT)}
_NAMES = ", ".join(("completions", "chat", *ENDPOINTS))

_encode = msgspec.json.encode


def parse_native(obj: dict[str, Any]) -> Draft:
    """The draft of one native line, or Invalid naming the first bad field."""
    line = Fields(obj)
    ident = line.item_id("id")
    model = line.string("model", nonempty=True)
    endpoint = line.optional_string("endpoint")
    if endpoint in ENDPOINTS:
        return _endpoint_line(line, ident, model, ENDPOINTS[endpoint])
    if endpoint not in ("", "completions", "chat"):
        raise Invalid(f"endpoint must be one of {_NAMES}")
    messages = obj.get("messages")
    if messages is not None and obj.get("prompt") is not None:
        raise Invalid("give prompt or messages, not both")
    if endpoint == "chat" and messages is None:
        raise Invalid("messages is missing: endpoint chat takes messages")
    if endpoint == "completions" and messages is not None:
        raise Invalid("messages is not allowed with endpoint completions: give prompt")
    if messages is None:
        prompt = line.string("prompt")
    max_tokens = line.count("max_tokens")
    components = line.prefix("prefix")
    body = _params(obj.get("params"))
    body["max_tokens"] = max_tokens
    if messages is not None:
        if components:
            raise Invalid("prefix cannot be given with messages: every message before the "
                          "last is the shared prefix")
        components, prompt = chat_components(messages, body.get("tools"), "messages")
        body["messages"] = messages
    return Draft(
        ident, model, components, prompt, max_tokens, Source.NATIVE,
        input_tokens=line.optional_count("input_tokens"),
        label=line.optional_string("label"),
        chat=messages is not None,
        body=_encode(body),
    )


def _params(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise Invalid(f"params must be a JSON object, not {a_json_type(params)}")
    for key in TOP_LEVEL:
        if key in params:
            raise Invalid(f"params.{key} is not allowed: give {key} at top level")
    if params.get("stream") is True:
        raise Invalid("params.stream must be false in a batch")
    return dict(params)


def _endpoint_line(line: Fields, ident: str, model: str, source: Source) -> Draft:
    """The draft of a native line naming an embeddings, score, rerank or responses endpoint."""
    obj = line.obj
    name = source.name.lower()
    for key in TOP_LEVEL[1:]:
        if obj.get(key) is not None:
            raise Invalid(f"{key} is not allowed with endpoint {name}: the request's fields "
                          "go in params")
    params = line.need("params")
    if not isinstance(params, dict):
        raise Invalid(f"params must be a JSON object, not {a_json_type(params)}")
    for key in ("model", "prefix"):
        if key in params:
            raise Invalid(f"params.{key} is not allowed: give {key} at top level")
    if params.get("stream") is True:
        raise Invalid("params.stream must be false in a batch")
    prefix = line.prefix("prefix")
    if prefix and source is not Source.EMBEDDINGS:
        raise Invalid(f"prefix is not allowed with endpoint {name}: only with completions "
                      "and embeddings")
    request = read_endpoint(source, dict(params), "params.", prefix)
    return Draft(
        ident, model, request.components, request.prompt, request.max_tokens, Source.NATIVE,
        input_tokens=line.optional_count("input_tokens") or request.input_tokens,
        label=line.optional_string("label"),
        body=_encode(request.body),
        path=source.url or "",
    )
