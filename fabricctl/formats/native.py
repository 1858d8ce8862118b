"""The native input line: `{"id", "model", "prefix": [...], "prompt", "max_tokens"}`.

Contract: required `id` (non-empty string, at most 256 characters), `model` (non-empty
string), `max_tokens` (integer >= 1) and either `prompt` (string, may be empty) or
`messages` (a chat request: see below); optional `prefix` (a list of strings, the cacheable
components in order; absent, null or `[]` means no shared prefix, i.e. signature 0),
`input_tokens` (integer >= 1, the producer's own count of the whole prompt, which then wins
over any tokenizer), `label` (string, a human name for the shape) and `params` (an object of
OpenAI/vLLM request fields: temperature, top_p, top_k, min_p, stop, seed, n, logprobs,
penalties, response_format, ignore_eos, ...). An optional field set to null counts as absent.
Unknown top-level fields are ignored so producers can carry their own metadata.

The request the engine receives is `params` as written plus `max_tokens` and the prompt
(`"".join(prefix) + prompt` to /v1/completions), or plus `messages` as written (to
/v1/chat/completions, where the model's chat template applies; every message before the
last is a component, as for OpenAI chat lines, so `prefix` cannot be given with it).
fabricctl adds nothing else. `params` may not carry what the line says at top level (model,
prompt, messages, max_tokens) and may not ask for streaming.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fabricctl.formats.chat import chat_components
from fabricctl.formats.common import Draft, Fields, Invalid, Source, a_json_type

# Any of these keys marks a line as meant to be native (used by format detection).
NATIVE_KEYS = ("id", "model", "prompt", "messages", "prefix", "max_tokens", "params")
# Fields a native line gives at top level; in `params` they would say it twice.
TOP_LEVEL = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens")

_encode = msgspec.json.encode


def parse_native(obj: dict[str, Any]) -> Draft:
    """The draft of one native line, or Invalid naming the first bad field."""
    line = Fields(obj)
    ident = line.item_id("id")
    model = line.string("model", nonempty=True)
    messages = obj.get("messages")
    if messages is not None and obj.get("prompt") is not None:
        raise Invalid("give prompt or messages, not both")
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
