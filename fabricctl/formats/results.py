"""The two output line forms of a result record: native, and OpenAI batch output.

Contract: the broker keeps one `ResultRecord` (`fabricctl.core.records`) per item id (the
first one wins) and a client writes it with `result_line`, which picks the form from
`record.source` (each form field by field: README.md, "Formats"):
- native (`Source.NATIVE`): `{"id", "model", "text", "finish_reason", "usage", "shape",
  "lane", "epoch", "gpu", "error"}`, `shape` as 16 hex digits, the usage the engine's own
  (else fabricctl's estimate); `"choices"` follows when the answer has several choices or
  logprobs, and `"response"` (the engine's answer whole) after `error` for a line that
  named embeddings, score, rerank or responses.
- OpenAI (every other `Source`): `{"id", "custom_id", "response": {"status_code",
  "request_id", "body"}, "error"}` as vLLM's `run_batch` writes it: the engine's body byte
  for byte; an engine's 4xx is that status, `body: null` and its error object in `error`;
  without an engine body (the simulated engine, older records) a `text_completion` or
  `chat.completion` is written from the record. An item refused as too long before it was
  sent is a 400 `BadRequestError`, any other failed item a 500, both in vLLM's
  `ErrorResponse` shape. Ids derive from the custom_id and `created` (reproducible).
- A refused input line (`refused_line`: no record, it never ran) is `run-batch`'s row for
  a line it does not run: status 400, `body: null`, the error a plain string ("line N:
  reason"); `custom_id` the line's when it reads as a string, else "".
Every line is compact JSON (msgspec) ending in one newline.
"""

from __future__ import annotations

import msgspec
import xxhash

from fabricctl.core.records import LENGTH_EXCEEDED, ResultRecord, Source, make_record
from fabricctl.core.signature import signature_hex

# ---- native form -------------------------------------------------------------------------


class _NativeUsage(msgspec.Struct):
    """Why: the `usage` object of a native result line."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None


class _NativeResult(msgspec.Struct):
    """Why: fixes the native result line's field names and order."""

    id: str
    model: str
    text: str
    finish_reason: str | None
    usage: _NativeUsage
    shape: str
    lane: int
    epoch: int
    gpu: int | None
    error: str | None


class _NativeResultChoices(_NativeResult):
    """Why: a native result whose engine answer had several choices, or logprobs."""

    choices: list[msgspec.Raw]


class _NativeResultResponse(_NativeResult):
    """Why: a native result of an endpoint beyond completions: the engine's answer whole."""

    response: msgspec.Raw


class _Choices(msgspec.Struct):
    """Why: reads only the choices of an engine's response body (None: it has none, an
    embeddings, score, rerank or responses answer)."""

    choices: list[msgspec.Raw] | None = None


class _ChoiceHead(msgspec.Struct):
    """Why: reads whether one choice carries logprobs."""

    logprobs: msgspec.Raw = msgspec.Raw(b"null")  # msgspec has no Raw | None


_encoder = msgspec.json.Encoder()
_choices_decoder = msgspec.json.Decoder(_Choices)
_head_decoder = msgspec.json.Decoder(_ChoiceHead)
_NULL = b"null"


def extra_choices(response: bytes) -> list[msgspec.Raw] | None:
    """The choices of a response body worth a native line's `choices`: more than one, or
    one with logprobs; None otherwise (or when the body is not readable)."""
    if not response:
        return None
    try:
        choices = _choices_decoder.decode(response).choices
        if choices is None:
            return None
        if len(choices) > 1:
            return choices
        if choices:
            head = _head_decoder.decode(choices[0])
            if bytes(head.logprobs) != _NULL:
                return choices
    except msgspec.DecodeError:
        return None
    return None


def endpoint_answer(response: bytes) -> bool:
    """Whether a kept response body is an answer without choices (embeddings, score,
    rerank, responses), which a native line carries whole."""
    if not response:
        return False
    try:
        return _choices_decoder.decode(response).choices is None
    except msgspec.DecodeError:
        return False


def native_line(rec: ResultRecord) -> bytes:
    """The native result line of a record."""
    cls: type[_NativeResult] = _NativeResult
    extra: dict[str, object] = {}
    if rec.status == 0 and endpoint_answer(rec.response):
        cls, extra = _NativeResultResponse, {"response": msgspec.Raw(rec.response)}
    elif rec.status == 0:
        choices = extra_choices(rec.response)
        if choices is not None:
            cls, extra = _NativeResultChoices, {"choices": choices}
    out = cls(
        id=rec.id,
        model=rec.model,
        text=rec.text,
        finish_reason=rec.finish_reason,
        usage=_NativeUsage(rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens),
        shape=signature_hex(rec.signature),
        lane=rec.lane,
        epoch=rec.epoch,
        gpu=rec.gpu,
        error=rec.error,
        **extra,
    )
    return _encoder.encode(out) + b"\n"


# ---- OpenAI batch output form ---------------------------------------------------------------


class _PromptTokensDetails(msgspec.Struct):
    """Why: `usage.prompt_tokens_details` as vLLM reports cache hits."""

    cached_tokens: int


class _Usage(msgspec.Struct):
    """Why: the OpenAI `usage` object."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: _PromptTokensDetails | None


class _CompletionChoice(msgspec.Struct):
    """Why: one `text_completion` choice as vLLM writes it."""

    index: int
    text: str
    logprobs: None
    finish_reason: str | None
    stop_reason: None = None


class _ChatMessage(msgspec.Struct):
    """Why: the assistant message of a `chat.completion` choice."""

    role: str
    content: str
    tool_calls: list[dict] = msgspec.field(default_factory=list)


class _ChatChoice(msgspec.Struct):
    """Why: one `chat.completion` choice as vLLM writes it."""

    index: int
    message: _ChatMessage
    logprobs: None
    finish_reason: str | None
    stop_reason: None = None


class _Body(msgspec.Struct):
    """Why: the completion / chat.completion response body."""

    id: str
    object: str
    created: int
    model: str
    choices: list[_CompletionChoice] | list[_ChatChoice]
    usage: _Usage


class _ErrorInfo(msgspec.Struct):
    """Why: the inner object of vLLM's `ErrorResponse`."""

    message: str
    type: str
    param: None
    code: int


class _ErrorResponse(msgspec.Struct):
    """Why: vLLM's `ErrorResponse`, the `error` of a failed batch line."""

    error: _ErrorInfo


class _Response(msgspec.Struct):
    """Why: vLLM's `BatchResponseData`."""

    status_code: int
    request_id: str
    body: _Body | msgspec.Raw | None


class _BatchOutput(msgspec.Struct):
    """Why: vLLM's `BatchRequestOutput`, one line of batch output."""

    id: str
    custom_id: str
    response: _Response | None
    error: _ErrorResponse | msgspec.Raw | str | None


def openai_line(rec: ResultRecord) -> bytes:
    """The OpenAI batch output line of a record (chat form when it came from a chat line)."""
    h = xxhash.xxh3_128_hexdigest(f"{rec.id}\x00{rec.created}".encode())
    request_id = f"fabric-batch-{h}"
    if rec.status and rec.response:  # the engine refused it: its own status and error
        out = _BatchOutput(
            id=f"fabric-{h}",
            custom_id=rec.id,
            response=_Response(status_code=rec.status, request_id=request_id, body=None),
            error=msgspec.Raw(rec.response),
        )
        return _encoder.encode(out) + b"\n"
    if rec.response and rec.error is None:  # the engine's answer, as it sent it
        out = _BatchOutput(
            id=f"fabric-{h}",
            custom_id=rec.id,
            response=_Response(status_code=200, request_id=request_id,
                               body=msgspec.Raw(rec.response)),
            error=None,
        )
        return _encoder.encode(out) + b"\n"
    error = _error_of(rec)
    if error is not None:
        out = _BatchOutput(
            id=f"fabric-{h}",
            custom_id=rec.id,
            response=_Response(status_code=error.error.code, request_id=request_id, body=None),
            error=error,
        )
        return _encoder.encode(out) + b"\n"
    details = None if rec.cached_tokens is None else _PromptTokensDetails(rec.cached_tokens)
    usage = _Usage(
        prompt_tokens=rec.prompt_tokens,
        total_tokens=rec.prompt_tokens + rec.completion_tokens,
        completion_tokens=rec.completion_tokens,
        prompt_tokens_details=details,
    )
    if rec.source is Source.CHAT:
        message = _ChatMessage(role="assistant", content=rec.text)
        body = _Body(
            id=f"chatcmpl-{h}",
            object="chat.completion",
            created=rec.created,
            model=rec.model,
            choices=[_ChatChoice(0, message, None, rec.finish_reason)],
            usage=usage,
        )
    else:
        body = _Body(
            id=f"cmpl-{h}",
            object="text_completion",
            created=rec.created,
            model=rec.model,
            choices=[_CompletionChoice(0, rec.text, None, rec.finish_reason)],
            usage=usage,
        )
    out = _BatchOutput(
        id=f"fabric-{h}",
        custom_id=rec.id,
        response=_Response(status_code=200, request_id=request_id, body=body),
        error=None,
    )
    return _encoder.encode(out) + b"\n"


def _error_of(rec: ResultRecord) -> _ErrorResponse | None:
    if rec.finish_reason == LENGTH_EXCEEDED:
        message = (
            f"The prompt ({rec.prompt_tokens} tokens) is longer than the maximum input "
            "length of the engine that served it."
        )
        return _ErrorResponse(_ErrorInfo(message, "BadRequestError", None, 400))
    if rec.error is not None:
        code = rec.status or 500
        kind = "BadRequestError" if 400 <= code < 500 else "InternalServerError"
        return _ErrorResponse(_ErrorInfo(rec.error, kind, None, code))
    return None


def result_line(rec: ResultRecord) -> bytes:
    """The record in the form its input line came in."""
    return openai_line(rec) if rec.source.is_openai else native_line(rec)


def refused_line(line: int, reason: str, custom_id: str | None) -> bytes:
    """The OpenAI batch output line of a refused input line: status 400, no body, and
    "line N: reason" as the error, as `vllm run-batch` writes a line it does not run."""
    cid = custom_id or ""
    h = xxhash.xxh3_128_hexdigest(f"{cid}\x00line\x00{line}".encode())
    out = _BatchOutput(
        id=f"fabric-{h}",
        custom_id=cid,
        response=_Response(status_code=400, request_id=f"fabric-batch-{h}", body=None),
        error=f"line {line}: {reason}",
    )
    return _encoder.encode(out) + b"\n"


__all__ = ["LENGTH_EXCEEDED", "ResultRecord", "Source", "endpoint_answer", "extra_choices",
           "make_record", "native_line", "openai_line", "refused_line", "result_line"]
