"""The data every layer shares: items, contracts, batches, results and pre-warm signals.

These are msgspec Structs so the same objects are validated and encoded on the wire
(u32 length + msgpack) without hand-written codecs.
"""

from __future__ import annotations

import msgspec


class Item(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """Why: one prompt as a producer submits it; the broker never parses `payload`."""

    id: str
    model: str
    signature: int
    input_tokens: int
    max_tokens: int
    payload: bytes = b""
    label: str = ""
    source: int = 0  # the input format (formats.common.Source): results go back in kind
    line: int = 0  # its input line number within its job (results per job come in this order)
    job: int = 0  # the job it belongs to (its number; 0: none), set by the broker
    endpoint: int = 0  # where its request goes (a Source value; 0: not stated): `core.mix`


class Entry(msgspec.Struct, gc=False):
    """Why: a lane queues what scheduling needs of an item, plus where the item lives.

    `key` locates the item in its store (a segment/offset in LMDB); in memory mode `item`
    holds the item itself.
    """

    key: int
    tokens: int
    max_tokens: int
    t: float
    item: Item | None = None
    job: int = 0  # the job of its item (0: none): the shape choice weighs jobs' terms


class Contract(msgspec.Struct, frozen=True):
    """Why: the names a consumer serves and the three integers it registers; the broker
    knows nothing else of it."""

    model: str  # the name its server serves its base model under
    max_batch_size: int
    max_batch_tokens: int
    max_input_len: int
    names: tuple[str, ...] = ()  # the other names the same server answers (LoRA adapters)

    def served(self) -> tuple[str, ...]:
        """Every name an item may carry to reach this consumer, its model's first."""
        return (self.model, *self.names) if self.names else (self.model,)


class BatchHead(msgspec.Struct):
    """Why: what a batch is, as the broker and the consumer both know it: one shape's lane."""

    id: int
    model: str
    signature: int
    lane: int
    epoch: int
    pad_to: int
    max_tokens: int
    max_input_len: int


class Batch(BatchHead, gc=False):
    """Why: items from one lane of one shape, padded to a multiple of 8, one output limit."""

    consumer: str
    entries: list[Entry]
    tokens: int  # sum of the entries' input tokens, kept for the ledger
    mixed: bool = False  # a swept shape's batch (`core.sweep`): entries of many signatures

    def oversized(self) -> list[int]:
        """Indexes of entries longer than the consumer's max input (the engine refuses them)."""
        return [i for i, e in enumerate(self.entries) if e.tokens > self.max_input_len]


class Work(BatchHead, array_like=True):
    """Why: a batch as its consumer and engine need it: the items with their payloads."""

    items: list[Item]


class ItemResult(msgspec.Struct, omit_defaults=True):
    """Why: what an engine produced for one item; exactly one is kept per item id.

    `prompt_tokens` is the engine's own count (None: it gave none, the item's estimate
    stands); `body` is the engine's response body as it sent it (JSON: the completion, or
    for a refused request its error object) and `status` the HTTP status of a refusal.
    """

    id: str
    text: str = ""
    finish_reason: str = "stop"
    tokens_out: int = 0
    cached_tokens: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    body: bytes = b""
    status: int = 0


class Prewarm(msgspec.Struct):
    """Why: a consumer told which shape comes next can prefill its prefix before the switch."""

    model: str
    signature: int
    label: str
    epoch: int
    lanes: list[tuple[int, int]]  # (lane id, target length)
    sample: Item | None = None  # one item of the shape; the server fills it in
    consumer: str | None = None  # "consumer" scope: the one consumer the shape warms for
