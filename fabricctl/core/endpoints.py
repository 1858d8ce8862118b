"""The endpoints fabricctl serves: one `EndpointSpec` entry each, in `ENDPOINTS`.

Contract: an entry names its `Source` (the number results and the mix record), its `name`
(a native line's `endpoint`, the mix's label), its canonical `url` and the `aliases` an
OpenAI batch line may name instead, its `kind` (how its answer is read and simulated:
`Kind`), and `multipart` (the request goes as form data with the audio `file`, not JSON).
`BY_SOURCE`, `URL_SOURCES` (every url a line may name, canonical ones first) and the sets
below are derived from the table; the readers (`formats.endpoints.READERS`) and the
simulator (`engines.simendpoints.ASKS`) each key one function by `Source`, and a test checks
every entry beyond completions and chat has both. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum


class Source(IntEnum):
    """Why: an OpenAI batch line's result must come back as an OpenAI batch output line."""

    NATIVE = 0
    COMPLETIONS = 1  # OpenAI batch, url /v1/completions
    CHAT = 2  # OpenAI batch, url /v1/chat/completions
    EMBEDDINGS = 3  # OpenAI batch, url /v1/embeddings
    SCORE = 4  # OpenAI batch, url /v1/score or /score
    RERANK = 5  # OpenAI batch, url /v1/rerank, /rerank or /v2/rerank
    RESPONSES = 6  # OpenAI batch, url /v1/responses
    TRANSCRIPTIONS = 7  # OpenAI batch, url /v1/audio/transcriptions

    @property
    def is_openai(self) -> bool:
        return self is not Source.NATIVE

    @property
    def url(self) -> str | None:
        """The OpenAI endpoint the line named (its canonical path), or None for native lines."""
        spec = BY_SOURCE.get(self)
        return spec.url if spec is not None else None


class Kind(Enum):
    """Why: how an endpoint's answer is read (real engine) and made (simulator)."""

    GENERATION = 1  # choices with text and a finish_reason (completions, chat)
    POOLING = 2  # prefill only, the body kept whole (embeddings, score, rerank)
    RESPONSES = 3  # output items with text, usage as input/output tokens
    TRANSCRIPTION = 4  # `{"text", "usage"}` of an audio file, the body kept whole


@dataclass(frozen=True)
class EndpointSpec:
    """Why: everything fabricctl's layers know of one endpoint, said once."""

    source: Source
    name: str
    url: str
    kind: Kind
    aliases: tuple[str, ...] = ()
    multipart: bool = False


ENDPOINTS = (
    EndpointSpec(Source.COMPLETIONS, "completions", "/v1/completions", Kind.GENERATION),
    EndpointSpec(Source.CHAT, "chat", "/v1/chat/completions", Kind.GENERATION),
    EndpointSpec(Source.EMBEDDINGS, "embeddings", "/v1/embeddings", Kind.POOLING),
    EndpointSpec(Source.SCORE, "score", "/v1/score", Kind.POOLING, ("/score",)),
    EndpointSpec(Source.RERANK, "rerank", "/v1/rerank", Kind.POOLING,
                 ("/rerank", "/v2/rerank")),
    EndpointSpec(Source.RESPONSES, "responses", "/v1/responses", Kind.RESPONSES),
    EndpointSpec(Source.TRANSCRIPTIONS, "transcriptions", "/v1/audio/transcriptions",
                 Kind.TRANSCRIPTION, multipart=True),
)
BY_SOURCE = {spec.source: spec for spec in ENDPOINTS}
# Every url an OpenAI batch line may name (vLLM serves the short and the v2 forms too).
URL_SOURCES = {**{spec.url: spec.source for spec in ENDPOINTS},
               **{alias: spec.source for spec in ENDPOINTS for alias in spec.aliases}}
BY_URL = {spec.url: spec for spec in ENDPOINTS}  # canonical urls only
POOLING_URLS = frozenset(spec.url for spec in ENDPOINTS if spec.kind is Kind.POOLING)
MULTIPART_URLS = frozenset(spec.url for spec in ENDPOINTS if spec.multipart)
