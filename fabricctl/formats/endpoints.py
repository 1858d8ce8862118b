"""The request bodies of the endpoints beyond completions and chat, and the shape of each.

Contract: `read_endpoint(source, body, where, prefix)` takes the body of a request to an
endpoint beyond completions and chat (`READERS`, one reader per `core.endpoints` entry;
without `model`; `where` names its fields in a refusal: "body." or "params.") and returns an
`Endpoint`: the body to send (as written, but for the `prefix` extension), the shape's
components, the rest of the text (for the estimate: every input, document and query
counted once), the exact token count of token ids, and the `max_tokens` the item is sized
by. It raises `Invalid` naming the first bad field; fields fabricctl does not read reach
vLLM untouched (vLLM checks them).
Shapes (the table per endpoint: README.md, "Formats"):
- embeddings: one string `input` whose first line starts with "Instruct:" gives that line
  (newline included); a declared `prefix` is the components instead (input sent: the prefix
  joined, then `input`); a list of strings sharing one such line: that line; `messages`: as
  chat; other lists and token ids: none.
- score: the query side when it is one string (or a list of one), `instruction` first;
  several queries: none. rerank: `query`, `instruction` first.
- responses: `tools`, `instructions` and every input item before the last
  (`formats.chat.response_components`).
- transcriptions: `prompt` (all the estimate counts); `file_url` required, `file` refused.
Sizing: pooling endpoints and transcriptions are sized at `POOLING_MAX_TOKENS` (1: packing
weighs their input alone); responses by `max_output_tokens`, else
`DEFAULT_OPENAI_MAX_TOKENS`. Multimodal inputs are refused: their text, which the shape and
the estimate need, is not a string.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fabricctl.formats.chat import chat_components, response_components
from fabricctl.formats.common import (
    DEFAULT_OPENAI_MAX_TOKENS,
    Fields,
    Invalid,
    Source,
)

POOLING_MAX_TOKENS = 1  # a pooling request generates nothing; the broker asks for >= 1
INSTRUCT = "Instruct:"  # an embedding input whose first line starts so shares that line
# The (query, documents) field pairs of a score request, in vLLM 0.32's order of forms.
SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
               ("text_1", "text_2"))


class Endpoint(msgspec.Struct):
    """Why: what one endpoint request gives the broker besides its body: shape and size."""

    body: dict[str, Any]
    components: list[str]
    prompt: str
    max_tokens: int
    input_tokens: int | None = None  # exact, when the input is token ids


def read_endpoint(source: Source, body: dict[str, Any], where: str,
                  prefix: list[str]) -> Endpoint:
    """The endpoint request of a body (see the module contract); Invalid when it is bad."""
    fields = Fields(body, where)
    if prefix and source is not Source.EMBEDDINGS:
        raise Invalid(f"{where}prefix is only for /v1/completions and /v1/embeddings")
    reader = READERS.get(source)
    if reader is None:  # completions and chat are read by their own formats
        raise Invalid(f"no endpoint request for {source.name}")
    return reader(fields, prefix)


def _embeddings(fields: Fields, prefix: list[str]) -> Endpoint:
    body, where = fields.obj, fields.where
    if body.get("messages") is not None:
        if prefix:
            raise Invalid(f"{where}prefix cannot be given with {where}messages: every message "
                          "before the last is the shared prefix")
        components, prompt = chat_components(body["messages"], None, f"{where}messages")
        return Endpoint(body, components, prompt, POOLING_MAX_TOKENS)
    value = fields.need("input")
    if isinstance(value, str):
        if not value:
            raise Invalid(f"{where}input must not be empty")
        if prefix:
            sent = {**body, "input": "".join(prefix) + value}
            return Endpoint(sent, prefix, value, POOLING_MAX_TOKENS)
        components, prompt = instruction_split(value)
        return Endpoint(body, components, prompt, POOLING_MAX_TOKENS)
    if isinstance(value, list) and not value:
        raise Invalid(f"{where}input must not be empty")
    if prefix:
        raise Invalid(f"{where}prefix needs {where}input to be one string")
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            splits = [instruction_split(v) for v in value]
            shared = splits[0][0]
            if shared and all(c == shared for c, _ in splits):
                return Endpoint(body, shared, "".join(r for _, r in splits),
                                POOLING_MAX_TOKENS)
            return Endpoint(body, [], "".join(value), POOLING_MAX_TOKENS)
        if all(_is_int(v) for v in value):
            return Endpoint(body, [], "", POOLING_MAX_TOKENS, len(value))
        if all(isinstance(v, list) and all(_is_int(t) for t in v) for v in value):
            count = sum(len(v) for v in value)
            return Endpoint(body, [], "", POOLING_MAX_TOKENS, max(1, count))
    raise Invalid(f"{where}input must be a string, a list of strings or token ids")


def instruction_split(text: str) -> tuple[list[str], str]:
    """(components, rest) of one embedding input: its first line, newline included, when
    it starts with "Instruct:"; else no component and the whole text."""
    if text.startswith(INSTRUCT):
        cut = text.find("\n")
        if cut >= 0:
            return [text[: cut + 1]], text[cut + 1 :]
    return [], text


def _score(fields: Fields, prefix: list[str]) -> Endpoint:
    body, where = fields.obj, fields.where
    pair = next(((q, d) for q, d in SCORE_PAIRS if q in body and d in body), None)
    if pair is None:
        raise Invalid(f"{where}text_1 and {where}text_2 are missing (or queries and documents, "
                      "queries and items, data_1 and data_2)")
    queries = _texts(body[pair[0]], where + pair[0])
    documents = _texts(body[pair[1]], where + pair[1])
    shared = [queries[0]] if len(queries) == 1 else []
    rest = "".join(documents) if shared else "".join(queries) + "".join(documents)
    components = _instruction(fields) + shared
    return Endpoint(body, components, rest, POOLING_MAX_TOKENS)


def _rerank(fields: Fields, prefix: list[str]) -> Endpoint:
    body = fields.obj
    query = fields.string("query", nonempty=True)
    documents = _texts(fields.need("documents"), fields.where + "documents")
    return Endpoint(body, [*_instruction(fields), query], "".join(documents),
                    POOLING_MAX_TOKENS)


def _responses(fields: Fields, prefix: list[str]) -> Endpoint:
    body, where = fields.obj, fields.where
    instructions = fields.optional_string("instructions")
    components, prompt = response_components(instructions, fields.need("input"),
                                             body.get("tools"), f"{where}input")
    max_tokens = fields.optional_count("max_output_tokens") or DEFAULT_OPENAI_MAX_TOKENS
    return Endpoint(body, components, prompt, max_tokens)


def _transcriptions(fields: Fields, prefix: list[str]) -> Endpoint:
    """The audio at `file_url` (run-batch's form: no `file`); `prompt` is the shape."""
    if "file" in fields.obj:
        raise Invalid(f"{fields.where}file is not allowed in a batch: give "
                      f"{fields.where}file_url")
    fields.string("file_url", nonempty=True)
    prompt = fields.optional_string("prompt")
    return Endpoint(fields.obj, [prompt] if prompt else [], "", POOLING_MAX_TOKENS)


# How each endpoint's body is read (`prefix`: the declared one, embeddings only); every
# `core.endpoints` entry beyond completions and chat has one.
READERS: dict[Source, Callable[[Fields, list[str]], Endpoint]] = {
    Source.EMBEDDINGS: _embeddings, Source.SCORE: _score, Source.RERANK: _rerank,
    Source.RESPONSES: _responses, Source.TRANSCRIPTIONS: _transcriptions}


def _instruction(fields: Fields) -> list[str]:
    instruction = fields.optional_string("instruction")
    return [instruction] if instruction else []


def _texts(value: Any, name: str) -> list[str]:
    """A score or rerank side: one non-empty string or a non-empty list of strings."""
    if isinstance(value, str):
        if not value:
            raise Invalid(f"{name} must not be empty")
        return [value]
    if isinstance(value, list):
        if not value:
            raise Invalid(f"{name} must not be empty")
        if all(isinstance(v, str) for v in value):
            return value
    raise Invalid(f"{name} must be a string or a list of strings")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
