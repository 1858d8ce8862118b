"""Dispatch: the part of the durable broker that hands batches out and takes them back.

Contract: `pull(consumer, now)` takes a batch from the core, verifies every segment and
entry exists and carries the batch's shape (the hard guard: `ShapeGuardError` propagates)
before returning its `Work` (each item with its job, from its segment, and its input line);
any other failed check puts the batch back untouched and re-raises. `fail(batch_id, now,
reason)` puts a batch back at the front of its lane (a batch whose completion is settling
stays); `disconnect(consumer, now, why, keep)` does so for every batch a lost consumer held,
except those settling or in `keep`; `abort_complete(plan, now)` undoes `prepare_complete`
after a failed commit (a cancel's withdrawn entries go back to their lanes). Every entry
that comes back undone is counted in the shared `undone` table; one handed out
`max_deliveries` times without a result is quarantined at its next pull: it gets an error
result and the rest of its batch goes out. The error results wait in `deferred` for the
caller's next completion commit (`take_deferred()`): the server's writer, or a caller's
`steps.write`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fabricctl.core.broker import ShapeGuardError, guard_signature
from fabricctl.core.types import Batch, Item, ItemResult, Work
from fabricctl.errors import SegmentMissingError
from fabricctl.store.faults import fault_point
from fabricctl.store.keys import SegHeader, entry_decoder, entry_key_of, seg_of

if TYPE_CHECKING:
    from fabricctl.store.completion import CompletePlan
    from fabricctl.store.state import StoreState

log = logging.getLogger("fabricctl.store")

# one batch's completion as the writer hands it over: batch id, results, the GPU that ran it
Completed = tuple[int, list[ItemResult], "int | None"]


class Dispatch:
    """Why: handing out and taking back is where deliveries are counted and bad ones stopped."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self.quarantined = 0
        # quarantine results wait here for the caller's next completion commit
        self.deferred: list[Completed] = []

    def take_deferred(self) -> list[Completed]:
        """The quarantine results waiting for a commit (emptied)."""
        waiting = self.deferred
        if not waiting:
            return []
        self.deferred = []
        return waiting

    def pull(self, consumer: str, now: float) -> Work | None:
        """A batch for `consumer`, checked against the segments on disk, or None."""
        batch = self.state.core.pull(consumer, now)
        if batch is None:
            return None
        try:
            # step 1: every segment and entry exists and is of this shape, before anything moves
            fault_point("dispatch_step1")
            keys = []
            heads: list[SegHeader] = []  # each entry's segment's (its job, signature, label)
            last = -1
            segs = self.state.segs
            hdr: SegHeader | None = None
            for e in batch.entries:
                seg_id = seg_of(e.key)
                if seg_id != last:
                    hdr = segs.get(seg_id)
                    if hdr is None:
                        raise SegmentMissingError(f"segment {seg_id} of batch {batch.id} is gone")
                    if not batch.mixed:  # a swept shape's batch claims no one signature
                        guard_signature(batch.signature, hdr.signature, f"segment {seg_id}")
                    last = seg_id
                assert hdr is not None
                keys.append(entry_key_of(e.key))
                heads.append(hdr)
            with self.state.env.read() as txn:
                found = txn.cursor(db=self.state.env.dbs["data"]).getmulti(keys)
            if len(found) != len(keys):
                have = {k for k, _ in found}
                gone = next(k for k in keys if k not in have)
                raise SegmentMissingError(f"entry {gone.hex()} of batch {batch.id} is gone")
        except ShapeGuardError:
            raise
        except BaseException:
            self.state.core.fail(batch.id, now)
            raise
        decode = entry_decoder.decode
        model, sig = batch.model, batch.signature
        items = []
        for (_, v), h in zip(found, heads, strict=True):
            s = decode(v)
            items.append(Item(s.id, model, h.signature, s.tokens, s.max_tokens, s.payload,
                              h.label, s.source, s.line, h.job))
        fault_point("dispatch_step2")  # cursors advance: the core popped the lane queue
        fault_point("dispatch_step3")  # pending map: the core's in-flight table
        if self.state.undone:
            items = self._quarantine(batch, items, now)
            if not items:
                return self.pull(consumer, now)  # the whole batch was quarantined
        self.state.work[batch.id] = items
        return Work(batch.id, model, sig, batch.lane, batch.epoch, batch.pad_to,
                    batch.max_tokens, batch.max_input_len, items)

    def _quarantine(self, batch: Batch, items: list[Item], now: float) -> list[Item]:
        """Settle the entries of a fresh batch that were handed out `max_deliveries` times
        without a result, each with an error result; returns the items still to send."""
        limit = self.state.cfg.max_deliveries
        undone = self.state.undone
        bad = [i for i, e in enumerate(batch.entries)
               if undone.get(e.key, (0, ""))[0] >= limit]
        if not bad:
            return items
        results = []
        for i in bad:
            n, why = undone[batch.entries[i].key]
            results.append(ItemResult(items[i].id, finish_reason="error", error=(
                f"quarantined after {n} deliveries without a result"
                + (f"; last: {why}" if why else ""))))
        skip = set(bad)
        keep = [it for i, it in enumerate(items) if i not in skip]
        qid = batch.id if not keep else self.state.core.split(batch.id, bad).id
        self.state.work[qid] = [items[i] for i in bad]
        self.deferred.append((qid, results, None))  # committed with the next completions
        self.quarantined += len(bad)
        log.warning("quarantined %d item(s) of batch %d after %d deliveries without a result "
                    "(%s); they get an error result", len(bad), batch.id, limit,
                    results[0].error)
        return keep

    def _undone(self, batch_id: int, why: str) -> None:
        f = self.state.core.inflight.get(batch_id)
        if f is None:
            return
        undone = self.state.undone
        for e in f.batch.entries:
            undone[e.key] = (undone.get(e.key, (0, ""))[0] + 1, why)

    def fail(self, batch_id: int, now: float, reason: str = "") -> None:
        """A batch came back undone (not one whose completion is settling: it stays)."""
        if batch_id in self.state.core.settling:
            return
        if batch_id in self.state.core.inflight:
            self._undone(batch_id, reason or "failed back")
            self.state.core.fail(batch_id, now)
        self.state.work.pop(batch_id, None)

    def disconnect(self, consumer: str, now: float, why: str,
                   keep: frozenset[int] | set[int] = frozenset()) -> int:
        """A consumer is gone: every batch it held goes back (counted as undone), except
        those settling or whose completion was received (`keep`)."""
        c = self.state.core.consumers.get(consumer)
        stay = self.state.core.settling | keep
        for batch_id in list(c.batches) if c is not None else []:
            if batch_id not in stay:
                self._undone(batch_id, f"consumer {consumer} lost: {why}")
                self.state.work.pop(batch_id, None)
        return self.state.core.disconnect(consumer, now, why, keep)

    def abort_complete(self, plan: CompletePlan, now: float) -> None:
        """The commit failed: the batches are no longer settling; one whose consumer left
        meanwhile goes back to its lane (nobody else would ever return it)."""
        core = self.state.core
        settling, inflight = core.settling, core.inflight
        for _, batch_id in plan.settled:
            settling.discard(batch_id)
            f = inflight.get(batch_id)
            if f is not None and f.batch.consumer not in core.consumers:
                self.fail(batch_id, now, "its completion could not be stored")
        if plan.withdrawn:  # a cancel's entries go back to their lanes
            core.return_withdrawn(plan.withdrawn, now)
            plan.withdrawn = []
