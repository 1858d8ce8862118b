"""What one item sends to an OpenAI-compatible server, and what its answer means.

Contract:
- `request_of(item, payload, model)` is (path, body, keep): `payload.path` when set (an
  endpoint beyond completions and chat), else `/v1/chat/completions` for a chat payload,
  else `/v1/completions`; the body is the producer's with `model` set to the served name
  and, for completions, `prompt` set to `payload.text()` (an older payload without a body
  gets `{"prompt", "max_tokens"}`); a body that is not a JSON object is a `WorkloadError`.
  `keep`: the answer's body is kept whole (OpenAI-batch items, every item with a `path`).
- A multipart endpoint (`core.endpoints`: transcriptions) goes as `form_fields(body)` with
  the `file` that `fetch_file(file_url)` reads, as `vllm run-batch` downloads it.
- `read_answer(status, content, keep, path)` turns an HTTP answer into an ItemResult (id
  blank), or None when a 2xx body is not the endpoint's answer: completions and chat give
  choice 0's text and finish_reason and vLLM's usage (body kept when `keep`, or with several
  choices or logprobs); pooling its body whole, text "", tokens_out 0, cached tokens only
  when vLLM reports them; responses its body whole, the `output_text` parts as text, usage
  from `input_tokens`/`output_tokens`, finish_reason from `status`; transcriptions `text`,
  the body whole. A 4xx is finish_reason "error" with the server's message, status and
  error body; a 404 that is not vLLM's error object (no such route for the model) is `vllm
  run-batch`'s row: 400, "Model does not support endpoint: <path>".
- `prewarm_request(payload, model)` is (path, body) prefilling the shape's shared prefix
  (max_tokens 1), or None when the payload shares nothing or has a `path`.
The forms these answers take in the output: README.md, "Formats".
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx
import msgspec

from fabricctl.core.endpoints import BY_SOURCE, BY_URL, POOLING_URLS, Kind, Source
from fabricctl.core.payload import Payload
from fabricctl.core.types import Item, ItemResult
from fabricctl.errors import WorkloadError

COMPLETIONS_PATH = BY_SOURCE[Source.COMPLETIONS].url
CHAT_PATH = BY_SOURCE[Source.CHAT].url
POOLING_PATHS = POOLING_URLS
ABORT = "abort"  # vLLM's finish_reason for a request it dropped (shutdown, preemption)
NATIVE_SOURCE = int(Source.NATIVE)

_decode = msgspec.json.decode
_encode = msgspec.json.encode


class _Details(msgspec.Struct):
    """Why: `usage.prompt_tokens_details` (`input_tokens_details` of a responses body), where
    vLLM reports prefix-cache hits."""

    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    """Why: the counts vLLM made of the request, which fabricctl reports as its usage."""

    prompt_tokens: int | None = None
    completion_tokens: int = 0
    prompt_tokens_details: _Details | None = None


class _Message(msgspec.Struct):
    """Why: a chat choice's text is its message's content."""

    content: str | None = None


class _Choice(msgspec.Struct):
    """Why: the fields of a choice fabricctl reads; the rest stays in the kept body."""

    index: int = 0
    text: str | None = None
    message: _Message | None = None
    finish_reason: str | None = None
    logprobs: msgspec.Raw = msgspec.Raw(b"null")  # msgspec has no Raw | None


class _Answer(msgspec.Struct):
    """Why: a completion or chat.completion body, read just as far as results need."""

    choices: list[_Choice]
    usage: _Usage | None = None


class _ErrorInfo(msgspec.Struct):
    """Why: the message of vLLM's `ErrorResponse` (`{"error": {"message", ...}}`)."""

    message: str = ""


class _Error(msgspec.Struct):
    """Why: vLLM's error body, and a server's that says only `message` or `detail`."""

    error: _ErrorInfo | str | None = None
    message: str | None = None
    detail: Any = None


_ABSENT = msgspec.Raw(b"")  # a field the body did not have


class _PoolUsage(msgspec.Struct):
    """Why: the counts vLLM made of a pooling request (its `completion_tokens` may be null)."""

    prompt_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Pooled(msgspec.Struct):
    """Why: an embeddings, score or rerank body, read just as far as results need."""

    data: msgspec.Raw = _ABSENT  # embeddings and score (msgspec has no Raw | None)
    results: msgspec.Raw = _ABSENT  # rerank
    usage: _PoolUsage | None = None


class _ResponseUsage(msgspec.Struct):
    """Why: the counts vLLM made of a responses request."""

    input_tokens: int | None = None
    output_tokens: int = 0
    input_tokens_details: _Details | None = None  # the same `cached_tokens`


class _Part(msgspec.Struct):
    """Why: one content part of a responses output message; "output_text" carries text."""

    type: str = ""
    text: str | None = None


class _OutputItem(msgspec.Struct):
    """Why: one item of a responses `output`; message items carry the answer's text."""

    type: str = ""
    content: list[_Part] | None = None


class _Response(msgspec.Struct):
    """Why: a responses body, read just as far as results need."""

    output: list[_OutputItem]
    status: str = "completed"
    usage: _ResponseUsage | None = None


_answer = msgspec.json.Decoder(_Answer)
_pooled = msgspec.json.Decoder(_Pooled)
_response = msgspec.json.Decoder(_Response)
_error = msgspec.json.Decoder(_Error)
_NULL = b"null"
# a responses `status` as a completion's finish_reason
_RESPONSE_FINISH = {"completed": "stop", "incomplete": "length", "cancelled": ABORT}


def request_of(item: Item, payload: Payload, model: str) -> tuple[str, dict[str, Any], bool]:
    """(path, body, keep the answer's body) for one item; see the module contract."""
    if payload.body:
        body = _decode(payload.body)
        if not isinstance(body, dict):
            raise WorkloadError("the request body is not a JSON object")
    else:
        body = {"max_tokens": item.max_tokens}
    body["model"] = model
    if payload.path:
        return payload.path, body, True
    if payload.chat:
        return CHAT_PATH, body, item.source != NATIVE_SOURCE
    body["prompt"] = payload.text()
    return COMPLETIONS_PATH, body, item.source != NATIVE_SOURCE


def prewarm_request(payload: Payload, model: str) -> tuple[str, dict[str, Any]] | None:
    """A request that prefills the shared prefix of the payload's shape, or None."""
    if payload.path:
        return None
    if payload.chat:
        body = _decode(payload.body) if payload.body else {}
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or len(messages) < 2:
            return None
        warm: dict[str, Any] = {"model": model, "messages": messages[:-1], "max_tokens": 1}
        if body.get("tools") is not None:
            warm["tools"] = body["tools"]
        return CHAT_PATH, warm
    prefix = "".join(payload.components)
    if not prefix:
        return None
    return COMPLETIONS_PATH, {"model": model, "prompt": prefix, "max_tokens": 1}


def error_message(content: bytes) -> str:
    """The message of an error body, as short as a result line should carry it."""
    try:
        err = _error.decode(content)
    except msgspec.DecodeError:
        return content.decode("utf-8", "replace")[:300]
    if isinstance(err.error, _ErrorInfo) and err.error.message:
        return err.error.message[:1000]
    if isinstance(err.error, str):
        return err.error[:1000]
    if err.message:
        return err.message[:1000]
    if err.detail is not None:
        return str(err.detail)[:1000]
    return content.decode("utf-8", "replace")[:300]


def _compact(content: bytes) -> bytes:
    """The body as one line: a server's JSON may carry newlines; the result line cannot."""
    content = content.strip()
    return _encode(_decode(content)) if b"\n" in content else content


def read_answer(status: int, content: bytes, keep: bool, path: str = "") -> ItemResult | None:
    """The ItemResult (id blank) of one HTTP answer to a request on `path`; see the module
    contract."""
    if status >= 400:
        return _refusal(status, content, path)
    spec = BY_URL.get(path)
    if spec is not None and spec.kind is not Kind.GENERATION:
        return _READ[spec.kind](content)
    try:
        answer = _answer.decode(content)
    except msgspec.DecodeError:
        return None
    if not answer.choices:
        return None
    choices = sorted(answer.choices, key=lambda c: c.index)
    first = choices[0]
    text = first.text if first.message is None else first.message.content
    usage = answer.usage or _Usage()
    details = usage.prompt_tokens_details
    logprobs = bytes(first.logprobs) != _NULL
    reason = next((c.finish_reason for c in choices if c.finish_reason == ABORT),
                  first.finish_reason or "stop")
    return ItemResult(
        id="",
        text=text or "",
        finish_reason=reason,
        tokens_out=usage.completion_tokens,
        cached_tokens=None if details is None else details.cached_tokens,
        prompt_tokens=usage.prompt_tokens,
        body=_compact(content) if keep or len(choices) > 1 or logprobs else b"",
    )


def _refusal(status: int, content: bytes, path: str) -> ItemResult:
    try:
        body = _compact(content)
        err = _error.decode(body)
    except msgspec.DecodeError:
        body, err = b"", None
    message = error_message(content)
    if status == 404 and path and (err is None or not isinstance(err.error, _ErrorInfo)):
        status, message = 400, f"Model does not support endpoint: {path}"
        body = _encode(message)
    return ItemResult(id="", finish_reason="error", error=f"HTTP {status}: {message}",
                      status=status, body=body)


def _pooling_answer(content: bytes) -> ItemResult | None:
    try:
        answer = _pooled.decode(content)
    except msgspec.DecodeError:
        return None
    if not answer.data and not answer.results:
        return None
    usage = answer.usage or _PoolUsage()
    details = usage.prompt_tokens_details
    return ItemResult(
        id="",
        cached_tokens=None if details is None else details.cached_tokens,
        prompt_tokens=usage.prompt_tokens,
        body=_compact(content),
    )


def _responses_answer(content: bytes) -> ItemResult | None:
    try:
        answer = _response.decode(content)
    except msgspec.DecodeError:
        return None
    text = "".join(part.text or "" for item in answer.output if item.type == "message"
                   for part in item.content or () if part.type == "output_text")
    usage = answer.usage or _ResponseUsage()
    details = usage.input_tokens_details
    return ItemResult(
        id="",
        text=text,
        finish_reason=_RESPONSE_FINISH.get(answer.status, answer.status),
        tokens_out=usage.output_tokens,
        cached_tokens=None if details is None else details.cached_tokens,
        prompt_tokens=usage.input_tokens,
        body=_compact(content),
    )


class _Transcript(msgspec.Struct):
    """Why: a transcription body (json or verbose_json), read just as far as results need."""

    text: str


_transcript = msgspec.json.Decoder(_Transcript)


def _transcription_answer(content: bytes) -> ItemResult:
    """Its `text`; a text, srt or vtt answer (not JSON) is its text, kept as a JSON string."""
    try:
        return ItemResult(id="", text=_transcript.decode(content).text, body=_compact(content))
    except msgspec.DecodeError:
        text = content.decode("utf-8", "replace")
        return ItemResult(id="", text=text, body=_encode(text))


# How a 2xx body of each kind of endpoint beyond completions and chat is read.
_READ = {Kind.POOLING: _pooling_answer, Kind.RESPONSES: _responses_answer,
         Kind.TRANSCRIPTION: _transcription_answer}


def form_fields(body: dict[str, Any]) -> dict[str, str | list[str]]:
    """A multipart request's form fields: the body but `file_url`, each value as text (a
    list repeats its field, an object goes as JSON)."""
    def text(v: Any) -> str:
        return v if isinstance(v, str) else _encode(v).decode("utf-8")
    return {k: [text(x) for x in v] if isinstance(v, list) else text(v)
            for k, v in body.items() if k != "file_url" and v is not None}


async def fetch_file(url: str, client: httpx.AsyncClient) -> bytes | ItemResult:
    """The bytes `file_url` names (data:, file:// or http(s)://), as run-batch downloads
    them, or the item's 400 refusal in vLLM's words when they cannot be had."""
    try:
        parsed = urlparse(url)
        if parsed.scheme == "data" and ";base64," in url:
            return base64.b64decode(url.split(",", 1)[1], validate=True)
        if parsed.scheme == "file":
            return await asyncio.to_thread(Path(unquote(parsed.path)).read_bytes)
        if parsed.scheme in ("http", "https"):
            resp = await client.get(url)
            resp.raise_for_status()
            return resp.content
        why = f"Unsupported URL scheme: {parsed.scheme}. Supported schemes: http, https, " \
              "data, file"
    except (OSError, ValueError, httpx.HTTPError) as e:
        why = f"{type(e).__name__}: {e}"
    message = f"Failed to process transcription: {why}"
    return _refusal(400, _encode({"error": {"message": message, "type": "BadRequestError",
                                            "param": None, "code": 400}}), "")
