"""The bodies vLLM 0.32 writes for the endpoints beyond completions, refusals included.

SIMULATED. Contract: the Structs the simulated engine encodes its answers with, field for
field and in vLLM's order (its pydantic `model_dump()`, None fields included):
`EmbeddingResponse` and `ScoreResponse` (`vllm/entrypoints/pooling/embed/protocol.py`,
`.../scoring/protocol.py`, usage from `pooling/utils.py:get_pooling_usage`),
`RerankResponse` (`.../scoring/serving.py`), `ResponsesResponse`
(`vllm/entrypoints/openai/responses/protocol.py`) and `TranscriptionResponse`
(`vllm/entrypoints/speech_to_text/transcription/protocol.py`); what goes in them is
`fabricctl.engines.simendpoints`'s. `refusal(message, status, kind, param)` is vLLM's
`ErrorResponse` as a `Refusal` (status, message, body); `unsupported(path)` is the refusal
of an endpoint the model does not serve: 400 and the bare string "Model does not support
endpoint: <path>" as its body, the row run-batch writes (a real server's 404 reads the same,
`engines.request`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

_encode = msgspec.json.encode


class ErrorInfo(msgspec.Struct):
    """Why: vLLM's `ErrorInfo`, the inside of every error body it sends."""

    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    """Why: vLLM's `ErrorResponse`, `{"error": {...}}`."""

    error: ErrorInfo


class PoolingUsage(msgspec.Struct):
    """Why: vLLM's `UsageInfo` as its pooling endpoints fill it: prompt tokens only."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None
    completion_tokens_details: None = None


class EmbeddingData(msgspec.Struct):
    """Why: `EmbeddingResponseData` in vLLM's field order (index, object, embedding)."""

    index: int
    object: str
    embedding: list[float] | str


class EmbeddingResponse(msgspec.Struct):
    """Why: vLLM's `EmbeddingResponse` for `/v1/embeddings`."""

    id: str
    object: str
    created: int
    model: str
    data: list[EmbeddingData]
    usage: PoolingUsage


class ScoreData(msgspec.Struct):
    """Why: one pair's score in vLLM's `ScoreResponseData`."""

    index: int
    object: str
    score: float


class ScoreResponse(msgspec.Struct):
    """Why: vLLM's `ScoreResponse` for `/v1/score` and `/score`."""

    id: str
    object: str
    created: int
    model: str
    data: list[ScoreData]
    usage: PoolingUsage


class RerankDocument(msgspec.Struct):
    """Why: vLLM's `RerankDocument`: the document's text, or its multi-modal content."""

    text: str | None = None
    multi_modal: list[Any] | None = None


class RerankResult(msgspec.Struct):
    """Why: one document's place in vLLM's `RerankResult`."""

    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(msgspec.Struct):
    """Why: vLLM's `RerankUsage` (prompt and total tokens, nothing else)."""

    prompt_tokens: int
    total_tokens: int


class RerankResponse(msgspec.Struct):
    """Why: vLLM's `RerankResponse` for `/v1/rerank`, `/rerank` and `/v2/rerank`."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class OutputText(msgspec.Struct):
    """Why: `ResponseOutputText` in its declared field order."""

    annotations: list[Any]
    text: str
    type: str
    logprobs: None


class OutputMessage(msgspec.Struct):
    """Why: openai's `ResponseOutputMessage` as vLLM fills it (no parser configured)."""

    id: str
    content: list[OutputText]
    role: str
    status: str
    type: str
    phase: None


class InputTokensDetails(msgspec.Struct):
    """Why: vLLM's `InputTokensDetails`: the prefix-cache hits and writes of the prompt."""

    cached_tokens: int
    cache_write_tokens: int
    input_tokens_per_turn: list[int] = msgspec.field(default_factory=list)
    cached_tokens_per_turn: list[int] = msgspec.field(default_factory=list)


class OutputTokensDetails(msgspec.Struct):
    """Why: vLLM's `OutputTokensDetails` (a single-turn text answer: all zero or empty)."""

    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    output_tokens_per_turn: list[int] = msgspec.field(default_factory=list)
    tool_output_tokens_per_turn: list[int] = msgspec.field(default_factory=list)


class ResponseUsage(msgspec.Struct):
    """Why: vLLM's `ResponseUsage`: input, cached and output tokens of a Responses answer."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    """Why: why a Responses answer is incomplete (vLLM sets only "max_output_tokens")."""

    reason: str


class ResponsesResponse(msgspec.Struct):
    """Why: vLLM's `ResponsesResponse` for a text answer, in its field order."""

    id: str
    created_at: int
    incomplete_details: IncompleteDetails | None
    instructions: Any
    metadata: Any
    model: str
    object: str
    output: list[OutputMessage]
    parallel_tool_calls: Any
    temperature: float
    tool_choice: Any
    tools: Any
    top_p: float
    background: Any
    max_output_tokens: int
    max_tool_calls: Any
    previous_response_id: Any
    prompt: Any
    reasoning: Any
    service_tier: Any
    status: str
    text: Any
    top_logprobs: Any
    truncation: Any
    usage: ResponseUsage
    user: Any
    presence_penalty: float
    frequency_penalty: float
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    input_messages: None = None
    output_messages: None = None


class TranscriptionUsage(msgspec.Struct):
    """Why: vLLM's `TranscriptionUsageAudio`: the audio's length, not tokens."""

    type: str
    seconds: int


class TranscriptionResponse(msgspec.Struct):
    """Why: vLLM's `TranscriptionResponse` (`response_format` "json")."""

    text: str
    usage: TranscriptionUsage


class Refusal(NamedTuple):
    """Why: a request the server answers with an error: its HTTP status, message and body."""

    status: int
    message: str
    body: bytes


def refusal(message: str, status: int = 400, kind: str = "BadRequestError",
            param: str | None = None) -> Refusal:
    """vLLM's error answer: `ErrorResponse` with `code` the status."""
    body = _encode(ErrorResponse(ErrorInfo(message, kind, param, status)))
    return Refusal(status, message, body)


def unsupported(path: str) -> Refusal:
    """The answer to an endpoint the model does not serve, as run-batch writes its row:
    status 400 and the bare message as the error (a JSON string, not an error object)."""
    message = f"Model does not support endpoint: {path}"
    return Refusal(400, message, _encode(message))
