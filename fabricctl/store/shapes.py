"""The records of finished shapes: kept in the `shapes` table, the last N of them.

Contract: `FinishedShapes.write(txn)` takes the records the core has made since the last
call (`Broker.take_finished`) into its pending list, numbered on from the last row, and
puts every pending record into `txn` (the commit of an ingest or a completion), then drops
the oldest rows past `finished_shapes_kept`; `committed()` forgets the pending records that
commit wrote (a transaction staged again after a full map writes the same numbers again).
`flush(env)` writes what is pending in its own transaction (on close). `recent(limit)` is
the newest `limit` records, newest first: the pending ones, then those on disk, in one short
read transaction. Only the store writes this table; the server reads it through `Reads`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lmdb
import msgspec

from fabricctl.core.snapshot import ShapeView
from fabricctl.store.keys import rseq_key, rseq_of

if TYPE_CHECKING:
    from fabricctl.core.broker import Broker
    from fabricctl.store.env import StoreEnv

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ShapeView).decode


class FinishedShapes:
    """Why: a finished shape leaves the core; its record must outlive it and the process."""

    def __init__(self, env: StoreEnv, core: Broker, kept: int) -> None:
        self.env = env
        self.core = core
        self.kept = max(0, kept)
        self.pending: list[tuple[int, ShapeView]] = []  # (finish number, record), oldest first
        self._written = 0  # how many of `pending` the staged transaction holds
        with env.read() as txn:
            cur = txn.cursor(db=env.dbs["shapes"])
            self.next = rseq_of(cur.key()) + 1 if cur.last() else 1

    def _take(self) -> None:
        for view in self.core.take_finished():
            self.pending.append((self.next, view))
            self.next += 1

    def write(self, txn: lmdb.Transaction) -> int:
        """Put the pending records into `txn` and trim the table to the bound; returns how
        many records it wrote."""
        self._take()
        self._written = 0
        if not self.pending:
            return 0  # most commits: nothing finished, nothing to trim
        db = self.env.dbs["shapes"]
        for n, view in self.pending:
            txn.put(rseq_key(n), _encode(view), db=db)
        over = txn.stat(db)["entries"] - self.kept
        if over > 0:
            cur = txn.cursor(db=db)
            cur.first()
            while over > 0 and cur.delete():
                over -= 1
        self._written = len(self.pending)
        return self._written

    def waiting(self) -> bool:
        """Whether records wait for a commit (a shape finished since the last one)."""
        self._take()
        return bool(self.pending)

    def committed(self) -> None:
        """The transaction `write` filled is durable: those records are no longer pending."""
        del self.pending[:self._written]
        self._written = 0

    def flush(self) -> None:
        """Write the pending records in a transaction of their own."""
        self._take()
        if self.pending:
            self.env.write(self.write, drain=True)
            self.committed()

    def recent(self, limit: int) -> list[ShapeView]:
        """The newest `limit` records, newest first (pending ones included, once each)."""
        self._take()
        out = [(n, view) for n, view in reversed(self.pending)][:limit]
        if len(out) < limit:
            with self.env.read() as txn:
                cur = txn.cursor(db=self.env.dbs["shapes"])
                oldest_pending = out[-1][0] if out else self.next
                at = cur.last()
                while at and len(out) < limit:
                    n = rseq_of(cur.key())
                    if n < oldest_pending:  # not one committed but still listed as pending
                        out.append((n, _decode(cur.value())))
                    at = cur.prev()
        return [view for _, view in out]
