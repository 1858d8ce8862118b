"""The payload convention between producers and engines (the broker never reads it).

A payload is msgpack of `Payload`: the cacheable components in order, the part that differs,
and token counts for each, so a simulated engine can derive prompt blocks without a tokenizer
and a real engine can send `"".join(components) + prompt`.
"""

from __future__ import annotations

import msgspec


class Payload(msgspec.Struct, omit_defaults=True):
    """Why: engines need the text (real) or the component identities and sizes (simulated)."""

    components: list[str]
    prompt: str
    component_tokens: list[int]
    prompt_tokens: int

    def text(self) -> str:
        """The full prompt a real engine receives: the components then the varying part."""
        return "".join(self.components) + self.prompt


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Payload)


def encode_payload(payload: Payload) -> bytes:
    return _encoder.encode(payload)


def decode_payload(data: bytes) -> Payload:
    return _decoder.decode(data)
