"""Key and record layout of the LMDB environment.

Contract: keys are big-endian packed integers so LMDB's memcmp order is numeric order and
one cursor range is one segment. An entry key is seg_id (u64) + offset (u32); in memory the
same pair is one int, seg_id << 32 | offset. Only this module knows that layout: everyone
else converts with its helpers (`ref`, `seg_of`, `seg_base`, `entry_key`,
`entry_key_of`, `ref_of`, `split_entry_key`). A segment is shape-pure: the entries of one
(model, signature) and one job from one or more consecutive ingest commits, each carrying
its lane.
Segment ids only grow and a segment takes new entries only while it is the newest one, so
every key an ingest writes is larger than every key on disk: ingest appends at the end of
the tables (LMDB's append mode, return counts checked), whatever the number of lanes it
feeds. Named databases:

- `seg`: seg_id -> SegHeader, the routing keys (model, signature, label), written once,
  when the segment is created;
- `data`: entry key -> StoredEntry (the item: lane, counts, arrival time, id, payload).
  Entries are written in the transaction that acknowledges them and deleted only with their
  whole segment, so a live segment's entries are exactly offsets 0 .. count-1: the last
  entry on disk is the segment's persisted readable boundary;
- `ids`: item id -> entry key, for every item ever stored (the duplicate check; kept after
  completion so a completed id stays a duplicate). Ids are scoped per job (`id_key`): for
  job 0 (none) the key is the plain UTF-8 id (as every layout before jobs wrote it), for
  job N > 0 it is NUL + N (u32) + the id, so two jobs may use the same id (ids holding NUL
  are refused);
- `results`: entry key -> ResultRecord, the item's one result (kept after its segment goes).
  A result marks its entry completed: recovery skips the entries of a live segment whose
  keys are in `results` (layout 3 also wrote a tombstone per entry, in a `tomb` table);
- `rseq`: the order results were stored in: a commit's new results are numbered on from the
  last, in one row keyed by the first number (u64) holding their entry keys (12 bytes
  each) in order (layout 3 wrote one row per result: a run of one);
- `meta`: counters (meta.py);
- `shapes` (added in layout 4 without a new FORMAT: a data dir without it still opens and
  the table is created): finish number (u64, counting on from the last row) -> the
  `ShapeView` record of a shape that finished, the last `finished_shapes_kept` of them
  (the oldest rows dropped in the commit that writes past the bound). shapes.py.
- `jobs` (added like `shapes`): job number (u32) -> its `JobRecord`, rewritten in every
  transaction that changes its counts (the ingest of its items, their results, a cancel)
  or its state (open, seal, cancel, settle). jobs.py.
- `jres` (added like `shapes`): job (u32) + input line (u64) + entry key -> empty, one row
  per result of an item of a job (N > 0), written with the result: a job's results read
  back in input order, also after its segments are deleted.
Entry keys are never reused: segment ids only grow.

Cost model: an LMDB commit costs about one page write per page it dirties, so every write
the store makes is shaped to touch few pages. A segment holds one shape's entries of
consecutive commits (each entry records its lane), and only the newest segment takes more
entries, so an ingest's entry keys all lie above every stored key: it appends them
(`putmulti` in append mode, return counts checked) onto fresh, full pages at the end of the
table, whatever the number of lanes it feeds. Lane-keyed segments cost one dirty leaf per
lane an ingest fed: about 600 scattered page writes per 1,024-item commit, a third of the
ingest rate. Results are keyed by entry key (a batch's results are neighbours when its lane
filled in order), result sequence numbers are appended, and segment headers are rewritten
only when a segment is created or its deleted count moves.
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


class SegHeader(msgspec.Struct, array_like=True):
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
