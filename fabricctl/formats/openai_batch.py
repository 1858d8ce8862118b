"""The OpenAI batch input line: `{"custom_id", "method": "POST", "url", "body": {...}}`.

Contract: `custom_id` becomes the item id (same rules as a native id); `method` must be
"POST"; `url` must be "/v1/completions" or "/v1/chat/completions"; `body` must be an object
with a non-empty string `model`. `max_tokens` comes from `body.max_tokens`, else
`body.max_completion_tokens`, else 16 (the completions API's default). `body.stream` must
not be true and `body.n`, when given, must be 1: a batch returns one choice per line.

- /v1/completions: the prompt is `body.prompt` (one string). A shared prefix may be
  declared with the fabricctl extension `body.prefix` (a non-empty list of strings, the
  same rule as native `prefix`); without it the line has no components (signature 0).
- /v1/chat/completions: `body.messages` is a non-empty list of `{"role", "content"}`
  objects, content a string or a list of `{"type": "text", "text"}` parts. Every message
  before the last is one component, in order, rendered as "<|role|>\\ncontent\\n"; the last
  is the prompt, rendered the same way followed by "<|assistant|>\\n" so a plain
  completions endpoint continues as the assistant. A chat template of the served model is
  not applied: the broker needs the prefix text to be the same for every item of a shape.

`body.metadata.label` (a string), when present, names the shape like native `label`.
"""

from __future__ import annotations

from typing import Any

from fabricctl.formats.common import (
    DEFAULT_OPENAI_MAX_TOKENS,
    URL_SOURCES,
    Draft,
    Invalid,
    Source,
    a_json_type,
    as_count,
    as_id,
    as_prefix,
    as_str,
    need,
)

# Any of these keys marks a line as meant to be an OpenAI batch request.
OPENAI_KEYS = ("custom_id", "method", "url", "body")

ASSISTANT_CUE = "<|assistant|>\n"


def render_message(role: str, content: str) -> str:
    """One chat message as prompt text: the role tag, a newline, the content, a newline."""
    return f"<|{role}|>\n{content}\n"


def parse_openai(obj: dict[str, Any]) -> Draft:
    """The draft of one OpenAI batch line, or Invalid naming the first bad field."""
    ident = as_id(need(obj, "custom_id"), "custom_id")
    method = need(obj, "method")
    if method != "POST":
        raise Invalid("method must be POST")
    url = need(obj, "url")
    source = URL_SOURCES.get(url) if isinstance(url, str) else None
    if source is None:
        raise Invalid("url must be /v1/completions or /v1/chat/completions")
    body = need(obj, "body")
    if not isinstance(body, dict):
        raise Invalid(f"body must be a JSON object, not {a_json_type(body)}")
    model = as_str(need(body, "model", "body.model"), "body.model", nonempty=True)
    max_tokens = _max_tokens(body)
    if body.get("stream") is True:
        raise Invalid("body.stream must be false in a batch")
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        raise Invalid("body.n must be 1")
    if source is Source.COMPLETIONS:
        prompt = need(body, "prompt", "body.prompt")
        if not isinstance(prompt, str):
            raise Invalid("body.prompt must be a single string")
        prefix = body.get("prefix")
        components = [] if prefix is None else as_prefix(prefix, "body.prefix")
    else:
        components, prompt = _chat(need(body, "messages", "body.messages"))
    return Draft(
        id=ident,
        model=model,
        components=components,
        prompt=prompt,
        max_tokens=max_tokens,
        source=source,
        label=_label(body),
    )


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None:
            return as_count(value, f"body.{key}")
    return DEFAULT_OPENAI_MAX_TOKENS


def _label(body: dict[str, Any]) -> str:
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        label = metadata.get("label")
        if label is not None:
            return as_str(label, "body.metadata.label")
    return ""


def _chat(messages: Any) -> tuple[list[str], str]:
    """The rendered components (all messages but the last) and prompt (the last)."""
    if not isinstance(messages, list) or not messages:
        raise Invalid("body.messages must be a non-empty list")
    rendered = []
    for i, msg in enumerate(messages):
        name = f"body.messages[{i}]"
        if not isinstance(msg, dict):
            raise Invalid(f"{name} must be an object with role and content")
        role = as_str(need(msg, "role", f"{name}.role"), f"{name}.role", nonempty=True)
        content = _content(need(msg, "content", f"{name}.content"), f"{name}.content")
        rendered.append(render_message(role, content))
    return rendered[:-1], rendered[-1] + ASSISTANT_CUE


def _content(content: Any, name: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                break
            texts.append(part["text"])
        else:
            return "".join(texts)
    raise Invalid(f"{name} must be a string or a list of text parts")
