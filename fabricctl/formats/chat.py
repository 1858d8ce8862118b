"""Chat messages as shape components: what a chat request shares with the others of its shape.

Contract: `chat_components(messages, tools, name)` checks a chat request's `messages` (a
non-empty list of `{"role", "content"}` objects; content a string, a list of `{"type":
"text", "text"}` parts, or null/absent on an assistant message with `tool_calls`) and
returns (components, prompt): every message before the last is one component, rendered as
"<|role|>\ncontent\n" then the canonical JSON of its other fields when it has any; `tools`,
when given, come first as one component of their canonical JSON. The last message is the
prompt, rendered the same way and followed by "<|assistant|>\n".
`response_components(instructions, items, tools, name)` does the same for `/v1/responses`:
`tools` first, then `instructions` as a "system" message, then every input item before the
last (the prompt). `input` is one string (a "user" message: nothing shared) or a list of
items: one with a `role` is a message (the `text` of "input_text", "output_text" and "text"
parts, any other part as canonical JSON; `"type": "message"` dropped, so both spellings are
one component); one without (a function call, its output, a reasoning item) is
"<|type|>\n\n" and the canonical JSON of its other fields.
The rendering serves only the shape signature, the token estimate and the simulated engine:
the request goes to vLLM as written, so the served model's chat template applies (whether it
renders the shared messages as a token prefix is what the cache-truth audit measures).
"""

from __future__ import annotations

from typing import Any

import msgspec

from fabricctl.formats.common import Fields, Invalid

ASSISTANT_CUE = "<|assistant|>\n"
_TEXT_PARTS = ("input_text", "output_text", "text")  # content parts read as their text
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


def response_components(
    instructions: str, items: Any, tools: Any, name: str
) -> tuple[list[str], str]:
    """The rendered components (tools, instructions, all input items but the last) and the
    prompt of a responses request; see the module contract."""
    if isinstance(items, str):
        if not items:
            raise Invalid(f"{name} must not be empty")
        rendered = [render_message("user", items)]
    elif isinstance(items, list) and items:
        rendered = [_render_item(item, f"{name}[{i}]") for i, item in enumerate(items)]
    else:
        raise Invalid(f"{name} must be a string or a non-empty list of input items")
    components = rendered[:-1]
    if instructions:
        components.insert(0, render_message("system", instructions))
    if tools is not None and tools != []:
        components.insert(0, _canonical.encode(tools).decode())
    return components, rendered[-1] + ASSISTANT_CUE


def _render_item(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise Invalid(f"{where} must be an object")
    if "role" not in item:
        kind = item.get("type")
        if not isinstance(kind, str) or not kind:
            raise Invalid(f"{where} must have a role or a type")
        return render_message(kind, "", {k: v for k, v in item.items() if k != "type"})
    role = Fields(item, f"{where}.").string("role", nonempty=True)
    text = _item_content(item.get("content"), f"{where}.content")
    extra = {k: v for k, v in item.items()
             if k not in ("role", "content") and not (k == "type" and v == "message")}
    return render_message(role, text, extra)


def _item_content(content: Any, name: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Invalid(f"{name} must be a string or a list of content parts")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise Invalid(f"{name}[{i}] must be an object")
        if part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            texts.append(_canonical.encode(part).decode())
    return "".join(texts)


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
