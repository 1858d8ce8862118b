"""Key and record layout of the LMDB environment, and the helpers that pack its keys.

Contract: keys are big-endian packed integers, so LMDB's order is numeric order and one
cursor range is one segment. An entry key is seg_id (u64) + offset (u32); in memory the same
pair is one int, seg_id << 32 | offset. Only this module knows that layout: everyone else
converts with `ref`, `seg_of`, `seg_base`, `entry_key`, `entry_key_of`, `ref_of` and
`split_entry_key`. A segment is shape-pure: one (model, signature) and one job, its entries
from consecutive ingest commits, each carrying its lane. Segment ids only grow and only the
newest segment takes entries, so entry keys are never reused and an ingest appends above
every key on disk. Named databases (`DB_NAMES`; an older `FORMAT` is refused):
- `seg`: seg_id -> `SegHeader` (model, signature, label), written when the segment is made;
- `data`: entry key -> `StoredEntry` (lane, counts, arrival, id, payload), written in the
  commit that acknowledges it, deleted only with its whole segment: a live segment's
  entries are offsets 0 .. count-1, the last on disk its readable boundary;
- `ids`: `id_key(job, id)` -> entry key of every item ever stored (the duplicate check, kept
  after completion): job 0 the plain UTF-8 id, job N > 0 NUL + N (u32) + the id (no NUL ids);
- `results`: entry key -> `ResultRecord`, the item's one result, marking it completed;
- `rseq`: results in stored order: per commit one row keyed by its first number (u64),
  holding its results' entry keys (12 bytes each) in order;
- `meta`: counters (meta.py); `shapes`: finish number (u64) -> the `ShapeView` of the last
  `finished_shapes_kept` finished shapes (shapes.py); `jobs`: job (u32) -> `JobRecord`, put
  by every commit that changes it (jobs.py); `jres`: job (u32) + input line (u64) + entry key
  -> empty: a job's results in input order, also after its segments are gone.
Why the writes append, and the layouts before: ARCHITECTURE.md, "The store on disk".
"""

from __future__ import annotations

import struct

import msgspec

FORMAT = 4  # bump when the layout above changes; an older data dir is refused with a message
TOMB_FORMAT = 3  # the layout before: its `tomb` table only repeated the results, so it is read
_SEG = struct.Struct(">Q")
_ENTRY = struct.Struct(">QI")

DB_NAMES = (b"seg", b"data", b"ids", b"results", b"rseq", b"meta", b"shapes", b"jobs",
            b"jres")


class SegHeader(msgspec.Struct, array_like=True, gc=False):
    """Why: the routing keys of a segment live once, here, not in every entry.

    Written once, when the segment is created (with `count` then and `deleted` 0). In
    memory `count` (entries written: the readable boundary) and `deleted` (entries with a
    result) are kept current; recovery recomputes both from the entries and results on disk.
    """

    model: str
    signature: int
    label: str
    count: int  # entries written (the readable boundary)
    deleted: int  # entries completed (with a result)
    created: float
    job: int = 0  # the job of every entry of the segment (0: none)


class StoredEntry(msgspec.Struct, array_like=True):
    """Why: one durable item; its routing keys come from the segment header.

    The scheduling fields come first so recovery can decode just them (`EntryHead`):
    `lane` is the lane it was assigned to and `target` that lane's target length once it
    was accepted (recovery restores each lane's target as the largest of its live entries').
    """

    tokens: int
    max_tokens: int
    t: float
    lane: int
    target: int
    id: str
    payload: bytes
    source: int = 0
    line: int = 0  # the item's input line within its job


class EntryHead(msgspec.Struct, array_like=True, gc=False):
    """Why: recovery decodes only the leading fields of a StoredEntry (the rest is skipped)."""

    tokens: int
    max_tokens: int
    t: float
    lane: int
    target: int


ENTRY_KEY_BYTES = _ENTRY.size  # a packed entry key: seg_id (u64) + offset (u32)
_OFFSET_BITS = 32


def seg_key(seg_id: int) -> bytes:
    return _SEG.pack(seg_id)


def seg_id_of(key: bytes | memoryview) -> int:
    """The segment id of a packed `seg` table key."""
    return int.from_bytes(key, "big")


def entry_key(seg_id: int, offset: int) -> bytes:
    return _ENTRY.pack(seg_id, offset)


def split_entry_key(key: bytes | memoryview) -> tuple[int, int]:
    """(segment, offset) of a packed entry key (bytes or a buffer)."""
    seg_id, offset = _ENTRY.unpack(key)
    return seg_id, offset


def ref(seg_id: int, offset: int) -> int:
    """The in-memory entry key of (segment, offset)."""
    return seg_id << _OFFSET_BITS | offset


def seg_base(seg_id: int) -> int:
    """The in-memory entry key of a segment's offset 0: its entries' keys are
    `seg_base(seg_id) | offset`."""
    return seg_id << _OFFSET_BITS


def seg_of(key: int) -> int:
    """The segment of an in-memory entry key."""
    return key >> _OFFSET_BITS


def entry_key_of(key: int) -> bytes:
    """The packed entry key of an in-memory one."""
    return key.to_bytes(ENTRY_KEY_BYTES, "big")  # the same bytes as _ENTRY.pack(seg, offset)


def ref_of(key: bytes | memoryview) -> int:
    """The in-memory entry key of a packed entry key."""
    return int.from_bytes(key, "big")


def id_key(job: int, idb: bytes) -> bytes:
    """The `ids` key of an item id (UTF-8) in a job: the plain id for job 0."""
    return idb if not job else b"\x00" + job.to_bytes(4, "big") + idb


def job_key(job: int) -> bytes:
    return job.to_bytes(4, "big")


def jres_key(job: int, line: int, entry: bytes) -> bytes:
    """The `jres` row of a job's result: job, input line, then the packed entry key."""
    return job.to_bytes(4, "big") + line.to_bytes(8, "big") + entry


def rseq_key(seq: int) -> bytes:
    return _SEG.pack(seq)


def rseq_of(key: bytes | memoryview) -> int:
    """The first sequence number of a packed `rseq` table key."""
    return int.from_bytes(key, "big")


header_encoder = msgspec.msgpack.Encoder()
header_decoder = msgspec.msgpack.Decoder(SegHeader)
entry_encoder = msgspec.msgpack.Encoder()
entry_decoder = msgspec.msgpack.Decoder(StoredEntry)
head_decoder = msgspec.msgpack.Decoder(EntryHead)
