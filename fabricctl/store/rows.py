"""Row-level writes inside a caller's write transaction, shared by ingest, completion and
recovery.

Contract: nothing here begins or commits a transaction: each function writes through the
`txn` it is given. `put_steps` puts new rows (never overwriting; in append mode when every
key is above every stored one) and returns how many went in, so the caller can check it;
`put_sequence` numbers a commit's new results on from the last (a number already taken is a
broken invariant: `AssertionError`); `delete_segment` (and its stepped form) deletes a
segment whole: its entries and its header, never its ids or results.
"""

from __future__ import annotations

from collections.abc import Mapping

import lmdb

from fabricctl.store.keys import entry_key, rseq_key, seg_key
from fabricctl.store.steps import STEP_DELETES, STEP_PUTS, Steps, run_steps


def put_steps(txn: lmdb.Transaction, db: lmdb._Database, rows: list[tuple[bytes, bytes]],
              append: bool = False) -> Steps[int]:
    """`_putmulti` in slices of `STEP_PUTS` rows, pausing before each but a first one of
    fewer than `STEP_PUTS // 4` rows (a small table's rows go with what came before)."""
    added = 0
    for k in range(0, len(rows), STEP_PUTS):
        if k or len(rows) >= STEP_PUTS // 4:
            yield
        added += _putmulti(txn, db, rows[k:k + STEP_PUTS], append)
    return added


def _putmulti(txn: lmdb.Transaction, db: lmdb._Database, rows: list[tuple[bytes, bytes]],
              append: bool = False) -> int:
    """Put new rows (never overwriting); returns how many went in."""
    if not rows:
        return 0
    return txn.cursor(db=db).putmulti(rows, overwrite=False, append=append)[1]


def put_sequence(txn: lmdb.Transaction, db: lmdb._Database, last: int, keys: list[bytes]) -> None:
    """Number a commit's new results `last + 1`, `last + 2`, ...: one row, keyed by the first
    number, holding their entry keys in order."""
    if keys and not txn.put(rseq_key(last + 1), b"".join(keys), db=db, append=True):
        raise AssertionError("result sequence out of order: the meta table is stale")


def delete_segment(txn: lmdb.Transaction, dbs: Mapping[str, lmdb._Database], seg_id: int) -> None:
    """Delete a segment whole: its entries and header (ids and results stay: a completed id
    remains a duplicate, and its result remains readable)."""
    run_steps(delete_segment_steps(txn, dbs, seg_id))


def delete_segment_steps(txn: lmdb.Transaction, dbs: Mapping[str, lmdb._Database], seg_id: int,
                         budget: list[int] | None = None) -> Steps[None]:
    """`delete_segment`, pausing every `STEP_DELETES` keys, counted across the calls that
    share `budget` (the keys left before the next pause: 0 pauses first), so a commit that
    deletes many small segments does not pause for each one."""
    left = budget if budget is not None else [STEP_DELETES]
    lo, hi = entry_key(seg_id, 0), entry_key(seg_id + 1, 0)
    cur = txn.cursor(db=dbs["data"])
    if cur.set_range(lo):
        while (k := cur.key()) and k < hi:  # type: ignore[operator]
            if left[0] <= 0:
                left[0] = STEP_DELETES
                yield
            if not cur.delete():
                break
            left[0] -= 1
    txn.delete(seg_key(seg_id), db=dbs["seg"])
