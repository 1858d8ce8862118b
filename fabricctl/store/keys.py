"""Key and record layout of the LMDB environment.

Contract: keys are big-endian packed integers so LMDB's memcmp order is numeric order and
one cursor range is one segment: `seg` holds seg_id (u64) -> SegHeader (the routing keys,
stored once), `data` and `tomb` hold seg_id (u64) + offset (u32) -> StoredEntry / 4-byte
tombstone. An in-memory entry key is the same pair as one int: seg_id << 32 | offset.
"""

from __future__ import annotations

import struct

import msgspec

TOMBSTONE = b"\x00\x00\x00\x01"
_SEG = struct.Struct(">Q")
_ENTRY = struct.Struct(">QI")

DB_NAMES = (b"seg", b"data", b"tomb", b"ids", b"results", b"rseq", b"meta")


class SegHeader(msgspec.Struct, array_like=True):
    """Why: the routing keys of a segment live once, here, not in every entry."""

    model: str
    signature: int
    label: str
    lane: int
    seg_no: int  # this segment's rank among the lane's segments
    target: int  # the lane's target length when last written
    count: int  # entries written (the readable boundary)
    deleted: int  # entries tombstoned
    created: float


class StoredEntry(msgspec.Struct, array_like=True):
    """Why: one durable item; its routing keys come from the segment header."""

    id: str
    tokens: int
    max_tokens: int
    t: float
    payload: bytes
    source: int = 0


def seg_key(seg_id: int) -> bytes:
    return _SEG.pack(seg_id)


def entry_key(seg_id: int, offset: int) -> bytes:
    return _ENTRY.pack(seg_id, offset)


def split_entry_key(key: bytes) -> tuple[int, int]:
    seg_id, offset = _ENTRY.unpack(key)
    return seg_id, offset


def ref(seg_id: int, offset: int) -> int:
    """The in-memory entry key of (segment, offset)."""
    return seg_id << 32 | offset


def unref(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


def entry_key_of(key: int) -> bytes:
    return _ENTRY.pack(key >> 32, key & 0xFFFFFFFF)


def rseq_key(seq: int) -> bytes:
    return _SEG.pack(seq)


header_encoder = msgspec.msgpack.Encoder()
header_decoder = msgspec.msgpack.Decoder(SegHeader)
entry_encoder = msgspec.msgpack.Encoder()
entry_decoder = msgspec.msgpack.Decoder(StoredEntry)
