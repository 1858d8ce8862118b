"""The payload convention between producers and engines (the broker never reads it).

A payload is msgpack of `Payload`: the cacheable components in order, the part that differs,
and token counts for each, so a simulated engine can derive prompt blocks without a tokenizer;
and the request as its producer wrote it, so a real engine sends exactly that:
- `path`: the endpoint the request goes to (`/v1/embeddings`, `/v1/score`, `/v1/rerank`,
  `/v1/responses`); empty for the completion endpoints, which `chat` tells apart:
- `chat`: the request goes to `/v1/chat/completions` (else `/v1/completions`);
- `body`: the request body as JSON, as written, less `model` (the engine sets the served
  name) and, for completions, less `prompt` (the engine sends `"".join(components) + prompt`,
  which is the prompt as written). Native lines have their `params` and top-level
  `max_tokens` here. Empty (an older payload): the body is `{"prompt", "max_tokens"}`.
"""

from __future__ import annotations

import msgspec


class Payload(msgspec.Struct, omit_defaults=True):
    """Why: engines need the text (real) or the component identities and sizes (simulated)."""

    components: list[str]
    prompt: str
    component_tokens: list[int]
    prompt_tokens: int
    chat: bool = False
    body: bytes = b""  # JSON object; see the module contract
    path: str = ""  # the endpoint, when not a completion one; see the module contract

    def text(self) -> str:
        """The full prompt a real engine receives: the components then the varying part."""
        return "".join(self.components) + self.prompt


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Payload)


def encode_payload(payload: Payload) -> bytes:
    return _encoder.encode(payload)


def decode_payload(data: bytes) -> Payload:
    return _decoder.decode(data)
