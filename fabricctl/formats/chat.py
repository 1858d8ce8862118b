"""Chat messages as shape components: what a chat request shares with the others of its shape.

Contract: `chat_components(messages, tools, name)` checks a chat request's `messages` (a
non-empty list of `{"role", "content"}` objects; content a string, a list of
`{"type": "text", "text"}` parts, or null/absent on an assistant message that carries
`tool_calls`) and returns (components, prompt): every message before the last is one
component, in order, rendered as "<|role|>\\ncontent\\n" followed by the canonical JSON of
its other fields (name, tool_calls, ...) when it has any; a request's `tools`, when given,
come first, as one component of their canonical JSON. The last message is the prompt,
rendered the same way and followed by "<|assistant|>\\n".

The rendering is fabricctl's own and serves only the shape signature, the token estimate and
the simulated engine: the request itself goes to `/v1/chat/completions` as written, so the
served model's chat template applies. Whether that template renders the shared messages as a
token prefix is what the cache-truth audit measures.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fabricctl.formats.common import Fields, Invalid

ASSISTANT_CUE = "<|assistant|>\n"
_canonical = msgspec.json.Encoder(order="sorted")


def render_message(role: str, content: str, extra: dict[str, Any] | None = None) -> str:
    """One chat message as text: the role tag, a newline, the content, a newline (and the
    canonical JSON of its other fields, when it has any)."""
    tail = _canonical.encode(extra).decode() + "\n" if extra else ""
    return f"<|{role}|>\n{content}\n{tail}"


def chat_components(messages: Any, tools: Any, name: str) -> tuple[list[str], str]:
    """The rendered components (tools, then all messages but the last) and the prompt."""
    if not isinstance(messages, list) or not messages:
        raise Invalid(f"{name} must be a non-empty list")
    rendered = []
    for i, msg in enumerate(messages):
        where = f"{name}[{i}]"
        if not isinstance(msg, dict):
            raise Invalid(f"{where} must be an object with role and content")
        fields = Fields(msg, f"{where}.")
        role = fields.string("role", nonempty=True)
        content = msg.get("content")
        if content is None and msg.get("tool_calls"):
            text = ""
        else:
            text = _content(fields.need("content"), f"{where}.content")
        extra = {k: v for k, v in msg.items() if k not in ("role", "content")}
        rendered.append(render_message(role, text, extra))
    components = rendered[:-1]
    if tools is not None:
        components.insert(0, _canonical.encode(tools).decode())
    return components, rendered[-1] + ASSISTANT_CUE


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
