"""What the daemon reads from the store: entries, results, disk usage; never a write.

Contract: every read opens one short read transaction and closes it before it returns (the
env's rule: none is held across an await), so a reader sees the newest commit. `entry(key)`
is the stored entry of an in-memory entry key, or None once its segment is gone;
`results_since(seq, limit)` pages the results in storage order as (sequence number,
ResultRecord); `results_by_key(after, limit)` pages them in entry-key (ingest) order as
(entry key in 24 hex digits, the record's msgpack as stored), after the key `after` ("" from
the first); `job_results(job, after_line, limit)` pages one job's results in input-line
order; `result(item_id, job)` is one item's result; `usage()` the data dir and its space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from fabricctl.core.records import ResultRecord
from fabricctl.store.keys import (
    ENTRY_KEY_BYTES,
    StoredEntry,
    entry_decoder,
    entry_key_of,
    id_key,
    job_key,
    jres_key,
    rseq_key,
    rseq_of,
)

if TYPE_CHECKING:
    from fabricctl.store.env import StoreEnv

_result_decoder = msgspec.msgpack.Decoder(ResultRecord)


class Reads:
    """Why: the server asks the store for data, never for its tables; these are the asks."""

    def __init__(self, env: StoreEnv) -> None:
        self.env = env

    def entry(self, key: int) -> StoredEntry | None:
        """The stored entry of an in-memory entry key, or None when it is not on disk."""
        with self.env.read() as txn:
            raw = txn.get(entry_key_of(key), db=self.env.dbs["data"])
        return entry_decoder.decode(raw) if raw is not None else None

    def results_since(self, seq: int, limit: int = 1000) -> list[tuple[int, ResultRecord]]:
        """Up to `limit` results stored after sequence number `seq`, oldest first."""
        dbs = self.env.dbs
        start = seq + 1
        size = ENTRY_KEY_BYTES
        with self.env.read() as txn:
            cur = txn.cursor(db=dbs["rseq"])
            order: list[tuple[int, bytes]] = []
            # the run that holds `start` begins at or before it
            at = cur.set_range(rseq_key(start))
            if not at or cur.key() != rseq_key(start):
                at = cur.prev() if at else cur.last()
                if not at:
                    at = cur.first()
            while at and len(order) < limit:
                first, keys = rseq_of(cur.key()), cur.value()
                for j in range(max(0, start - first), len(keys) // size):
                    order.append((first + j, keys[size * j:size * j + size]))  # type: ignore[arg-type]
                    if len(order) >= limit:
                        break
                at = cur.next()
            found = dict(txn.cursor(db=dbs["results"]).getmulti([k for _, k in order]))
        decode = _result_decoder.decode
        return [(s, decode(found[k])) for s, k in order if k in found]

    def results_by_key(self, after: str, limit: int) -> list[tuple[str, Any]]:
        """Up to `limit` stored results in entry-key order, after the entry key `after` (24 hex
        digits; "" from the first). The `results` table is keyed by entry key, so this is one
        cursor walk; the records go out as stored (msgpack `ResultRecord`), not re-encoded."""
        start = bytes.fromhex(after) if after else b""
        out: list[tuple[str, Any]] = []
        with self.env.read() as txn:
            cur = txn.cursor(db=self.env.dbs["results"])
            at = cur.set_range(start) if start else cur.first()
            if at and start and cur.key() == start:
                at = cur.next()
            while at and len(out) < limit:
                out.append((cur.key().hex(), msgspec.Raw(cur.value())))
                at = cur.next()
        return out

    def job_results(self, job: int, after_line: int, limit: int) -> list[ResultRecord]:
        """Up to `limit` results of a job's items, in input-line order, of lines after
        `after_line`: one walk of the `jres` rows, then the results by entry key."""
        prefix = job_key(job)
        start = jres_key(job, max(0, after_line + 1), b"")
        keys: list[bytes] = []
        with self.env.read() as txn:
            cur = txn.cursor(db=self.env.dbs["jres"])
            at = cur.set_range(start)
            while at and len(keys) < limit:
                k = bytes(cur.key())
                if k[:4] != prefix:
                    break
                keys.append(k[12:])
                at = cur.next()
            found = dict(txn.cursor(db=self.env.dbs["results"]).getmulti(keys))
        decode = _result_decoder.decode
        return [decode(found[k]) for k in keys if k in found]

    def result(self, item_id: str, job: int = 0) -> ResultRecord | None:
        """The stored result of an item (of `job`), or None while it has none."""
        dbs = self.env.dbs
        with self.env.read() as txn:
            key = txn.get(id_key(job, item_id.encode()), db=dbs["ids"])
            raw = txn.get(key, db=dbs["results"]) if key is not None else None
        return _result_decoder.decode(raw) if raw is not None else None

    def usage(self) -> dict[str, Any]:
        """The data dir, the space its map uses and may use, and the disk's free space."""
        env = self.env
        return {"data_dir": str(env.data_dir), "used_bytes": env.used_bytes(),
                "map_size": env.map_size, "free_disk": env.free_disk()}
