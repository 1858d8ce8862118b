"""How a prompt becomes prefix-cache blocks without a tokenizer (the simulated engine's view).

Contract: a prompt is a virtual token stream. Component i of its `Payload` contributes
`component_tokens[i]` tokens whose identities are (component_hash(component_i), offset in the
component); the varying part contributes `prompt_tokens` tokens whose identities are
(hash of item id + prompt text, offset), so they are unique to the item. Full blocks of B
tokens are hashed in a chain, as vLLM does: block i's hash = xxh3_64(parent hash, the block's
token identities), with a fixed seed as the parent of block 0. A block is described by its
runs of consecutive tokens from one source, (source, first offset, length), so hashing costs
O(blocks + components), never O(tokens); equal token streams give equal hashes. Only full
blocks are hashed: `BlockChain.hashes` has exactly floor(total / B) entries. A LoRA
adapter's requests hash apart from the base model's, as vLLM keys an adapter's blocks by its
name: `adapter` (its name; "" for the base model) seeds block 0's parent. An item whose
payload cannot be decoded is treated as one unique run of `item.input_tokens` tokens; a
payload whose component and token-count lists differ in length is a `WorkloadError`.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import NamedTuple

import msgspec
import xxhash

from fabricctl.core.payload import Payload, decode_payload
from fabricctl.core.signature import component_hash
from fabricctl.core.types import Item
from fabricctl.errors import WorkloadError

_xxh = xxhash.xxh3_64_intdigest
_pack4 = struct.Struct("<4Q").pack
SEED_HASH = _xxh(b"fabricctl/sim/apc/none-hash")  # vLLM's NONE_HASH: parent of block 0

BlockSource = tuple[int, int]  # one prefix component: (its hash, its token count)
Segment = tuple[int, int, int]  # (source hash, first offset, length)


class BlockChain(NamedTuple):
    """Why: what the prefix cache needs from a prompt: its full-block hashes and its length."""

    hashes: list[int]
    tokens: int


class _Chain(NamedTuple):
    """Why: the state of a half-hashed stream, so a shared component prefix is hashed once."""

    hashes: tuple[int, ...]
    parent: int
    pending: tuple[Segment, ...]  # the runs of the partial block not yet hashed
    pending_len: int


def _block_hash(parent: int, segments: list[Segment] | tuple[Segment, ...]) -> int:
    flat: list[int] = [parent]
    for seg in segments:
        flat.extend(seg)
    return _xxh(struct.pack(f"<{len(flat)}Q", *flat))


def _extend(chain: _Chain, sources: tuple[BlockSource, ...], block_size: int) -> _Chain:
    """Hash the blocks that `sources`, appended to `chain`'s stream, complete."""
    out = list(chain.hashes)
    parent, pending, pending_len = chain.parent, list(chain.pending), chain.pending_len
    bs = block_size
    for src, n in sources:
        if n <= 0:
            continue
        off = 0
        if pending_len:
            take = min(bs - pending_len, n)
            pending.append((src, 0, take))
            pending_len += take
            off = take
            if pending_len < bs:
                continue
            parent = _block_hash(parent, pending)
            out.append(parent)
            pending, pending_len = [], 0
        full_end = off + (n - off) // bs * bs
        while off < full_end:  # blocks entirely inside this source: (parent, src, off, B)
            parent = _pack_hash(parent, src, off, bs)
            out.append(parent)
            off += bs
        if off < n:
            pending, pending_len = [(src, off, n - off)], n - off
    return _Chain(tuple(out), parent, tuple(pending), pending_len)


def _pack_hash(parent: int, src: int, off: int, length: int) -> int:
    return _xxh(_pack4(parent, src, off, length))


_EMPTY = _Chain((), SEED_HASH, (), 0)


def _start(adapter: str) -> _Chain:
    """An empty stream: the base model's, or an adapter's (its name seeds the chain)."""
    if not adapter:
        return _EMPTY
    return _Chain((), _xxh(struct.pack("<Q", SEED_HASH) + adapter.encode("utf-8")), (), 0)


@lru_cache(maxsize=4096)
def _prefix_chain(sources: tuple[BlockSource, ...], block_size: int, adapter: str = ""
                  ) -> _Chain:
    """The chain over a shape's components, memoised: every item of a shape shares it."""
    return _extend(_start(adapter), sources, block_size)


def unique_source(item_id: str, prompt: str) -> int:
    """The source hash of an item's varying part: its tokens are shared with no other item."""
    return _xxh(item_id.encode("utf-8") + b"\x00" + prompt.encode("utf-8"))


def prefix_sources(payload: Payload) -> tuple[BlockSource, ...]:
    """The runs of a payload's cacheable components: (component hash, tokens) each."""
    if len(payload.components) != len(payload.component_tokens):
        raise WorkloadError("payload has a token count per component mismatch")
    return tuple(
        (component_hash(c), int(n))
        for c, n in zip(payload.components, payload.component_tokens, strict=True)
    )


def prefix_block_hashes(sources: tuple[BlockSource, ...], block_size: int,
                        adapter: str = "") -> tuple[int, ...]:
    """The hashes of the full blocks of a prefix (`prefix_sources`): floor(prefix / B) of
    them, the leading hashes of every prompt that starts with it."""
    return _prefix_chain(sources, block_size, adapter).hashes


def payload_blocks(payload: Payload, block_size: int, item_id: str = "",
                   adapter: str = "") -> BlockChain:
    """Full-block hashes and token count of a payload's virtual token stream."""
    sources = prefix_sources(payload)
    prefix = _prefix_chain(sources, block_size, adapter)
    total = sum(max(0, n) for _, n in sources) + max(0, payload.prompt_tokens)
    if payload.prompt_tokens > 0:
        tail = ((unique_source(item_id, payload.prompt), payload.prompt_tokens),)
        return BlockChain(list(_extend(prefix, tail, block_size).hashes), total)
    return BlockChain(list(prefix.hashes), total)


def prefix_tokens(payload: Payload) -> int:
    """Tokens of the cacheable components: the shape's shared prefix length."""
    return sum(max(0, n) for n in payload.component_tokens)


def decode_item_payload(item: Item) -> Payload | None:
    """The item's payload, or None when it is missing or not a valid `Payload`."""
    if not item.payload:
        return None
    try:
        payload = decode_payload(item.payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(payload.components) != len(payload.component_tokens):
        return None
    return payload


def item_blocks(item: Item, block_size: int, adapter: str = "") -> BlockChain:
    """An item's blocks: from its payload, else its whole prompt unique (input_tokens long)."""
    payload = decode_item_payload(item)
    if payload is not None:
        return payload_blocks(payload, block_size, item.id, adapter)
    n = max(0, item.input_tokens)
    chain = _extend(_EMPTY, ((unique_source(item.id, ""), n),), block_size)
    return BlockChain(list(chain.hashes), n)


def achievable_cached_tokens(prefix_len: int, prompt_len: int, block_size: int) -> int:
    """The most a warm cache can give one request: floor(min(prefix, L-1)/B)*B
    (docs/engine-notes.md, section 2)."""
    usable = min(prefix_len, prompt_len - 1)
    if usable <= 0:
        return 0
    return usable // block_size * block_size
