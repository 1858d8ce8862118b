"""What the simulated engine answers on the endpoints beyond completions, as vLLM 0.32 does.

SIMULATED. The bodies and refusals are vLLM 0.32's (`fabricctl.engines.simbodies`).

Contract:
- `endpoint_of(path, chat)` is a payload's canonical endpoint (`Source.url`; an empty path
  is `/v1/completions`, or `/v1/chat/completions` for chat), or the path itself when no
  OpenAI batch line may name it. `SIMULATED` are the endpoints the simulator answers.
- `parse_ask(endpoint, request, model)` reads a body as the server would: an `EmbedAsk`,
  `ScoreAsk`, `RerankAsk` or `ResponsesAsk`, or a `Refusal` (400 `BadRequestError`, vLLM's
  message where it has one) for a body vLLM refuses or a parameter not modelled.
- Vectors are deterministic: `embedding(key)` is `EMBED_DIM` values from the xxh3 hash of
  the input, cut to `dimensions` (1..EMBED_DIM, else vLLM's 400), unit-normalised (unless
  `use_activation` is false) and rounded to float32, written as vLLM writes a float32;
  base64 is the float32 (or float16) bytes, little-endian unless `endianness` is "big". A
  score is the cosine of the two texts' vectors (rerank's relevance too). A transcript is
  `sim_text` of its `file_url` (the audio is not read), json only.
- An ask's `prompts` are the texts the server would run (one per engine request);
  `body(...)` is the JSON answer given the prompt tokens (responses: also the output and the
  cache counts). Ids are vLLM's prefixes (`embd-`, `score-`, `resp_`, `msg_`), "sim-" and a
  hash of the item id; `created` is 0. A Responses answer echoes the request's fields as
  written, with vLLM's defaults where absent (temperature and top_p 1.0, penalties 0.0,
  tool_choice "none" without tools, truncation "disabled", service_tier "auto").
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import xxhash

from fabricctl.core.endpoints import BY_SOURCE, URL_SOURCES, Source
from fabricctl.engines.simbodies import (
    EmbeddingData,
    EmbeddingResponse,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    PoolingUsage,
    Refusal,
    RerankDocument,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ResponsesResponse,
    ResponseUsage,
    ScoreData,
    ScoreResponse,
    TranscriptionResponse,
    TranscriptionUsage,
    refusal,
    unsupported,
)
from fabricctl.engines.simrequest import sim_text

TRANSCRIPT_WORDS = 8  # a simulated transcript's words, drawn from the audio's url
EMBED_DIM = 16  # the simulated model's hidden size: small, so test bodies stay short
COMPLETIONS = BY_SOURCE[Source.COMPLETIONS].url
CHAT = BY_SOURCE[Source.CHAT].url
GENERATION = frozenset({COMPLETIONS, CHAT})
_DTYPES = {"float32": "f", "float16": "e"}
_F32 = struct.Struct("<f")
_encode = msgspec.json.encode


def endpoint_of(path: str, chat: bool = False) -> str:
    """The canonical endpoint of a payload path (see the module contract)."""
    if not path:
        return CHAT if chat else COMPLETIONS
    source = URL_SOURCES.get(path)
    url = source.url if source is not None else None
    return url or path


# --- the simulated model's outputs --------------------------------------------------------------


def _f32(x: float) -> float:
    """`x` rounded to float32, as a Python float (what `tensor.tolist()` gives)."""
    return float(_F32.unpack(_F32.pack(x))[0])


def embedding(key: str, dims: int | None = None, normalise: bool = True) -> list[float]:
    """The simulated model's vector for one input: see the module contract."""
    data = key.encode("utf-8")
    raw = [xxhash.xxh3_64_intdigest(data, seed=i) / 2.0**63 - 1.0 for i in range(EMBED_DIM)]
    vec = raw[:dims] if dims else raw
    if normalise:
        norm = math.sqrt(sum(x * x for x in vec)) or 1.0
        vec = [x / norm for x in vec]
    return [_f32(x) for x in vec]


def similarity(key_1: str, key_2: str) -> float:
    """The score of a pair: the cosine of the two full vectors, rounded to float32."""
    a, b = embedding(key_1), embedding(key_2)
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return _f32(dot / norms) if norms else 0.0


def _key(value: Any) -> str:
    """The text an input stands for: itself, or the JSON of token ids or messages."""
    return value if isinstance(value, str) else _encode(value).decode("utf-8")


def _ident(prefix: str, seed: str) -> str:
    """A deterministic id: `prefix` (vLLM's, with its separator), "sim-", the seed's hash."""
    return f"{prefix}sim-{xxhash.xxh3_64_hexdigest(seed.encode('utf-8'))}"


# --- the asks: a request as the server reads it -------------------------------------------------


class EmbedAsk(NamedTuple):
    """Why: an embeddings request reduced to what its answer depends on."""

    keys: list[str]  # one per input, the text its vector is drawn from
    dims: int | None
    as_base64: bool
    dtype: str  # struct format character: "f" float32, "e" float16
    order: str  # struct byte order: "<" or ">"
    normalise: bool

    @property
    def prompts(self) -> list[str]:
        return self.keys

    def body(self, model: str, seed: str, prompt_tokens: int) -> bytes:
        data = []
        for i, key in enumerate(self.keys):
            vec = embedding(key, self.dims, self.normalise)
            out: list[float] | str = vec
            if self.as_base64:
                raw = struct.pack(f"{self.order}{len(vec)}{self.dtype}", *vec)
                out = base64.b64encode(raw).decode("ascii")
            data.append(EmbeddingData(i, "embedding", out))
        return _encode(EmbeddingResponse(_ident("embd-", seed), "list", 0, model, data,
                                         PoolingUsage(prompt_tokens, prompt_tokens)))


class ScoreAsk(NamedTuple):
    """Why: a score request reduced to its pairs (text_1 broadcast over text_2 when single)."""

    pairs: list[tuple[str, str]]

    @property
    def prompts(self) -> list[str]:
        return [a + b for a, b in self.pairs]

    def body(self, model: str, seed: str, prompt_tokens: int) -> bytes:
        data = [ScoreData(i, "score", similarity(a, b)) for i, (a, b) in enumerate(self.pairs)]
        return _encode(ScoreResponse(_ident("score-", seed), "list", 0, model, data,
                                     PoolingUsage(prompt_tokens, prompt_tokens)))


class RerankAsk(NamedTuple):
    """Why: a rerank request reduced to its query, documents and `top_n`."""

    query: str
    documents: list[str]
    top_n: int

    @property
    def prompts(self) -> list[str]:
        return [self.query + d for d in self.documents]

    def body(self, model: str, seed: str, prompt_tokens: int) -> bytes:
        results = [RerankResult(i, RerankDocument(text=d), similarity(self.query, d))
                   for i, d in enumerate(self.documents)]
        results.sort(key=lambda r: r.relevance_score, reverse=True)
        top_n = self.top_n if self.top_n > 0 else len(results)
        if top_n < len(self.documents):
            results = results[:top_n]
        return _encode(RerankResponse(_ident("score-", seed), model,
                                      RerankUsage(prompt_tokens, prompt_tokens), results))


class ResponsesAsk(NamedTuple):
    """Why: a Responses request: the fields its answer echoes and its output limit."""

    request: dict[str, Any]
    limit: int | None  # max_output_tokens, when given
    ignore_eos: bool
    prompt: str  # instructions and input as text (what a character-a-token count reads)

    @property
    def prompts(self) -> list[str]:
        return [self.prompt]

    def body(self, model: str, seed: str, *, text: str, finish_reason: str,
             prompt_tokens: int, cached_tokens: int, cache_write_tokens: int,
             output_tokens: int, max_output_tokens: int) -> bytes:
        r = self.request
        temperature = _number(r.get("temperature"), 1.0)
        top_p = 1.0 if temperature < 1e-5 else _number(r.get("top_p"), 1.0)  # greedy: top_p 1
        include = r.get("include")
        logprobs = isinstance(include, list) and "message.output_text.logprobs" in include
        incomplete = finish_reason == "length"
        message = OutputMessage(
            id=_ident("msg_", seed),
            content=[OutputText([], text, "output_text", None)] if text else [],
            role="assistant", status="completed", type="message", phase=None)
        usage = ResponseUsage(
            input_tokens=prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens, cache_write_tokens),
            output_tokens=output_tokens, output_tokens_details=OutputTokensDetails(),
            total_tokens=prompt_tokens + output_tokens)
        parallel = r.get("parallel_tool_calls")
        tools = r.get("tools") or []
        choice = r.get("tool_choice", "auto")
        if not tools and choice == "auto":
            choice = "none"  # vLLM's request validator: no tools, no tool choice
        return _encode(ResponsesResponse(
            id=_ident("resp_", seed), created_at=0,
            incomplete_details=IncompleteDetails("max_output_tokens") if incomplete else None,
            instructions=r.get("instructions"), metadata=r.get("metadata"), model=model,
            object="response", output=[message],
            parallel_tool_calls=True if parallel is None else parallel,
            temperature=temperature, tool_choice=choice, tools=tools, top_p=top_p,
            background=r.get("background", False),
            max_output_tokens=max_output_tokens, max_tool_calls=r.get("max_tool_calls"),
            previous_response_id=r.get("previous_response_id"), prompt=r.get("prompt"),
            reasoning=r.get("reasoning"), service_tier=r.get("service_tier", "auto"),
            status="incomplete" if incomplete else "completed", text=r.get("text"),
            top_logprobs=r.get("top_logprobs", 0) if logprobs else None,
            truncation=r.get("truncation", "disabled"), usage=usage, user=r.get("user"),
            presence_penalty=_number(r.get("presence_penalty"), 0.0),
            frequency_penalty=_number(r.get("frequency_penalty"), 0.0)))


class TranscriptionAsk(NamedTuple):
    """Why: a transcription request: the audio it names and the prompt the decoder reads."""

    file_url: str
    prompt: str
    text: str  # the transcript: `sim_text` of the url

    @property
    def prompts(self) -> list[str]:
        return [self.prompt]

    def body(self, model: str, seed: str, prompt_tokens: int) -> bytes:
        seconds = 1 + xxhash.xxh3_64_intdigest(self.file_url.encode("utf-8")) % 30
        return _encode(TranscriptionResponse(self.text, TranscriptionUsage("duration", seconds)))


Ask = EmbedAsk | ScoreAsk | RerankAsk | ResponsesAsk | TranscriptionAsk


def _number(value: Any, default: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else default


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_messages(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value))


def parse_ask(endpoint: str, request: Any, model: str) -> Ask | Refusal:
    """The request as the server reads it, or its refusal (see the module contract)."""
    if not isinstance(request, dict):
        return refusal("the request body must be a JSON object")
    if request.get("stream") is True:
        return refusal("the simulated engine does not stream")
    source = URL_SOURCES.get(endpoint)
    read = ASKS.get(source) if source is not None else None
    return unsupported(endpoint) if read is None else read(request, model)


def _embed_inputs(request: dict[str, Any]) -> list[str] | None:
    """One key per input of an embeddings request (its four input forms), or None."""
    value = request["messages"] if "messages" in request else request.get("input")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return None
    if all(isinstance(v, str) for v in value):
        return list(value)
    if _is_messages(value) or all(_is_int(v) for v in value):
        return [_key(value)]
    if all(isinstance(v, list) and (all(_is_int(t) for t in v) or _is_messages(v))
           for v in value):
        return [_key(v) for v in value]
    return None


def _embed_ask(request: dict[str, Any], model: str) -> EmbedAsk | Refusal:
    keys = _embed_inputs(request)
    if keys is None:
        return refusal("input: must be a string, a list of strings, token ids or messages")
    if not keys:
        return refusal("You must pass at least one prompt")
    fmt = request.get("encoding_format", "float")
    if fmt in ("bytes", "bytes_only"):
        return refusal(f"the simulated engine answers in JSON: encoding_format {fmt!r}")
    if fmt not in ("float", "base64"):
        return refusal("encoding_format: Input should be 'float', 'base64', 'bytes' or "
                       "'bytes_only'")
    dtype = request.get("embed_dtype", "float32")
    if dtype not in _DTYPES:
        return refusal(f"the simulated engine encodes float32 and float16 only: {dtype!r}")
    dims = request.get("dimensions")
    if dims is not None and (not _is_int(dims) or not 1 <= dims <= EMBED_DIM):
        return refusal(f"Model {model!r} only supports dimensions in range [1, {EMBED_DIM}], "
                       f"got {dims}.")
    return EmbedAsk(keys, dims, fmt == "base64", _DTYPES[dtype],
                    ">" if request.get("endianness") == "big" else "<",
                    request.get("use_activation") is not False)


def _texts(value: Any) -> list[str] | None:
    """A score input as a list of texts (one text, or a list), None if not text."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


_SCORE_FIELDS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                 ("data_1", "data_2"))


def _score_ask(request: dict[str, Any], model: str) -> ScoreAsk | Refusal:
    names = next((f for f in _SCORE_FIELDS if f[0] in request and f[1] in request), None)
    if names is None:
        return refusal("text_1, text_2: Field required")
    data_1, data_2 = _texts(request[names[0]]), _texts(request[names[1]])
    if data_1 is None or data_2 is None:
        return refusal("MultiModalParam is not supported for the simulated model")
    if len(data_1) > 1 and len(data_1) != len(data_2):
        return refusal("Input lengths must be either 1:1, 1:N or N:N")
    if not data_1:
        return refusal("At least one text element must be given")
    if not data_2:
        return refusal("At least one text_pair element must be given")
    firsts = data_1 * len(data_2) if len(data_1) == 1 else data_1
    return ScoreAsk(list(zip(firsts, data_2, strict=True)))


def _rerank_ask(request: dict[str, Any], model: str) -> RerankAsk | Refusal:
    query, documents = request.get("query"), _texts(request.get("documents"))
    if not isinstance(query, str) or documents is None:
        return refusal("query, documents: text fields required (the simulated model reads "
                       "text only)")
    if not documents:
        return refusal("At least one text_pair element must be given")
    top_n = request.get("top_n", 0)
    if not _is_int(top_n) or top_n < 0:
        return refusal("top_n: Input should be greater than or equal to 0")
    return RerankAsk(query, documents, top_n)


def _responses_ask(request: dict[str, Any], model: str) -> ResponsesAsk | Refusal:
    given = request.get("input")
    if not isinstance(given, str | list):
        return refusal("input: Field required")
    if not request.get("tools") and request.get("tool_choice") == "required":
        return refusal("Tool choice 'required' must be specified with 'tools' parameter.",
                       param="tool_choice")
    limit = request.get("max_output_tokens")
    if limit is not None and (not _is_int(limit) or limit < 1):
        return refusal(f"max_tokens must be at least 1, got {limit}.", param="max_tokens")
    instructions = request.get("instructions")
    prompt = (instructions if isinstance(instructions, str) else "") + _key(given)
    return ResponsesAsk(request, limit, request.get("ignore_eos") is True, prompt)


def _transcription_ask(request: dict[str, Any], model: str) -> TranscriptionAsk | Refusal:
    url, prompt = request.get("file_url"), request.get("prompt", "")
    if not isinstance(url, str) or not url:
        return refusal("file_url: Field required")
    if not isinstance(prompt, str):
        return refusal("prompt: Input should be a valid string")
    if request.get("response_format", "json") != "json":
        return refusal("the simulated engine answers response_format json only")
    return TranscriptionAsk(url, prompt, sim_text(url, TRANSCRIPT_WORDS))


# How each endpoint beyond completions and chat reads its body: every `core.endpoints`
# entry of another kind has one.
ASKS: dict[Source, Callable[[dict[str, Any], str], Ask | Refusal]] = {
    Source.EMBEDDINGS: _embed_ask, Source.SCORE: _score_ask, Source.RERANK: _rerank_ask,
    Source.RESPONSES: _responses_ask, Source.TRANSCRIPTIONS: _transcription_ask}
SIMULATED = GENERATION | {BY_SOURCE[source].url for source in ASKS}  # what it answers
