"""The durable broker: the core's decisions, with every item kept in LMDB segments.

Contract:
- `ingest(items, now)` validates, de-duplicates (an id already stored, queued or completed,
  or repeated within the call is a reject), assigns each item to its lane (assigned first),
  writes the entries (which extend their segments' boundaries), their id index, new segment
  headers and the ledger in one durable commit (written second) and only then makes them
  dispatchable; it returns per-item rejects in index order. A full map or disk raises
  `StoreFullError` and stores nothing of that call.
- `pull(consumer, now)` takes a batch from the core, verifies every segment and entry exists
  and carries the batch's shape (the hard guard) before returning its `Work`; a failed
  check puts the batch back untouched. Pending entries live in memory only.
- `complete(batch_id, results, now)` writes each item's one result (keyed by its entry: it
  marks the entry completed) and its result sequence number and the ledger in one commit,
  and deletes a segment whose entries all have results in the same commit. A completion
  for a batch that is no longer in flight (settled, failed, or from before a restart) is
  dropped and returns -1: it creates no second result.
- `fail(batch_id, now, reason)` puts a batch back at the front of its lane;
  `disconnect(consumer, now, why, keep)` does so for every batch a lost consumer held,
  except those whose completion is settling or was received (`keep`).
- Each write is three steps, so a server can commit off its event loop: `prepare_ingest` /
  `prepare_complete` (on the caller's thread), `commit(ingest, complete)` (one durable
  transaction for either or both; LMDB only, so it may run on a writer thread), then
  `apply_ingest` / `apply_complete` (on the caller's thread). Batches being settled are in
  `core.settling` from prepare to apply: a fail or disconnect leaves them alone. `ingest`
  and `complete_many` run the three steps in a row. The long ones also come as generators
  that pause between parts (`ingest_steps`, `complete_steps`, `stage_steps`,
  `apply_ingest_steps`, `apply_complete_steps`; see `fabricctl.store.steps`): the server's
  writer lets its event loop serve sockets at each pause.
- Crash loops are bounded: every entry that comes back undone (failed, or held by a lost
  consumer) is counted in memory; one that was handed out `max_deliveries` times without a
  result is not handed out again: `pull` completes it with an error result ("quarantined
  after N deliveries without a result; last: <reason>") and sends the rest of its batch
  (with `deferred` set, those error results wait there for the server's next commit).
Everything but `commit` runs on the caller's thread; the server calls it from its event loop.

Cost model: an LMDB commit costs about one page write per page it dirties, so every write
here is shaped to touch few pages. A segment holds one shape's entries of consecutive
commits (each entry records its lane), and only the newest segment takes more entries, so an
ingest's entry keys all lie above every stored key: it appends them (`putmulti` in append
mode, return counts checked) onto fresh, full pages at the end of the table, whatever the
number of lanes it feeds. Lane-keyed segments cost one dirty leaf per lane an ingest fed:
about 600 scattered page writes per 1,024-item commit, a third of the ingest rate. Results
are keyed by entry key (a batch's results are neighbours when its lane filled in order),
result sequence numbers are appended, and segment headers are rewritten only when a segment
is created or its deleted count moves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import lmdb

from fabricctl.core.broker import Broker, ShapeGuardError, guard_signature
from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Batch, Item, ItemResult, Work
from fabricctl.faults import fault_point
from fabricctl.store.completion import CompletePlan, Completion, _Conflict
from fabricctl.store.env import MiB, Staged, StoreEnv
from fabricctl.store.errors import SegmentMissingError
from fabricctl.store.ingest import Ingest, IngestPlan, Reject

__all__ = ["DurableBroker", "Reject", "StoreConfig"]
from fabricctl.store.keys import SegHeader, entry_decoder
from fabricctl.store.meta import Meta, PersistedLedger
from fabricctl.store.recovery import RecoveryReport, recover
from fabricctl.store.steps import Steps, run_steps

log = logging.getLogger("fabricctl.store")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Why: the storage knobs an operator may need to turn, with safe defaults."""

    map_size: int = 256 * MiB
    map_ceiling: int = 64 * 1024 * MiB
    segment_entries: int = 1024  # a segment rolls over after this many entries
    disk_reserve: int = 4 * MiB  # refuse ingest below this much free disk (room to complete)
    max_deliveries: int = 5  # an entry handed out this often without a result is quarantined


@dataclass(slots=True)
class StagedCommit:
    """Why: the writer thread commits what the event loop staged; this is the handle."""

    txn_staged: Staged
    ingest: bool
    complete: bool
    drain: bool


class DurableBroker(Ingest, Completion):
    """Why: the broker that loses no acknowledged item, whatever kills it."""

    def __init__(
        self, data_dir: Path, now: float, cfg: CoreConfig | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        self.store_cfg = store or StoreConfig()
        self.env = StoreEnv(Path(data_dir), self.store_cfg.map_size, self.store_cfg.map_ceiling)
        self.core = Broker(cfg)
        self.segs: dict[int, SegHeader] = {}
        self.tail_seg = 0  # the newest segment: the only one that may take more entries
        self.work: dict[int, list[Item]] = {}  # in-flight batch id -> its items (ids, source)
        self.meta = Meta()
        self.results_stored = 0
        self.duplicate_completions = 0
        self.undone: dict[int, tuple[int, str]] = {}  # entry key -> (times back undone, why)
        self.quarantined = 0
        # set by a server that commits on a writer thread: quarantine results wait here for
        # its next completion commit instead of being written on the caller's thread
        self.deferred: list[tuple[int, list[ItemResult], int | None]] | None = None
        try:
            self.recovery: RecoveryReport = recover(self, now)
        except BaseException:
            self.env.close()
            raise

    # -- writing ----------

    def ingest(self, items: list[Item], now: float) -> list[Reject]:
        """Store a chunk durably and make it dispatchable; returns the rejects."""
        plan = self.prepare_ingest(items, now)
        if plan.admits:
            self.commit(ingest=plan)
        return self.apply_ingest(plan, now)

    def commit(self, ingest: IngestPlan | None = None,
               complete: CompletePlan | None = None) -> None:
        """One durable transaction for a prepared ingest and/or completion, with the meta
        counters they move: `stage_commit`, then `env.finish` (growing a map that filled
        while committing), then `committed`. Apply the ingest first, then the completion.
        With an ingest in it, a full map past the ceiling is refused (`StoreFullError`); a
        completion alone may grow the map into the drain headroom."""
        while (staged := self.stage_commit(ingest, complete)) is not None:
            if self.env.finish(staged.txn_staged, staged.drain):
                self.committed(staged)
                return
            self.env.grow(staged.drain)

    def stage_commit(self, ingest: IngestPlan | None,
                     complete: CompletePlan | None) -> StagedCommit | None:
        """Write the plans into a new transaction, not committed yet (None: nothing to
        write). Its `env.finish` may run on a writer thread, while this thread goes on
        dispatching; nothing else may write until `committed` (or a failed finish)."""
        return run_steps(self.stage_steps(ingest, complete))

    def stage_steps(self, ingest: IngestPlan | None,
                    complete: CompletePlan | None) -> Steps[StagedCommit | None]:
        """`stage_commit` in steps: it pauses after the ingest's rows, after the results and
        between parts of segment deletes, its transaction open meanwhile."""
        ing = ingest if ingest is not None and ingest.admits else None
        com = complete if complete is not None and complete.settled else None
        if ing is None and com is None:
            return None
        dbs = self.env.dbs
        grown = ing.grown() if ing is not None and com is not None else {}

        def write(txn: lmdb.Transaction, batched: bool) -> Steps[PersistedLedger]:
            received = completed = (0, 0)
            if ing is not None:
                yield from self.ingest_rows(txn, ing)
                received = ing.received
                if com is not None:
                    yield
            if com is not None:
                completed = yield from self.settle_steps(txn, com, batched, grown)
            ledger = self.meta.ledger_after(received, completed)
            self.meta.write(txn, dbs["meta"], ledger=ledger,
                            next_seg=ing.next_seg if ing is not None else None,
                            rseq=com.seq if com is not None else None)
            for model, epoch in com.epochs.items() if com is not None else ():
                self.meta.write(txn, dbs["meta"], epoch=(model, epoch))
            return ledger

        drain = ing is None
        try:
            staged = yield from self.env.stage_steps(lambda txn: write(txn, True), drain)
        except _Conflict:  # an entry already has a result: one put at a time, first one kept
            staged = yield from self.env.stage_steps(lambda txn: write(txn, False), drain)
        return StagedCommit(staged, ing is not None, com is not None, drain)

    def committed(self, staged: StagedCommit) -> None:
        """The staged transaction is durable: the persisted counters move."""
        self.meta.ledger = staged.txn_staged.result  # type: ignore[assignment]
        if staged.ingest:
            fault_point("ingest_after_commit")
        if staged.complete:
            fault_point("complete_after_commit")

    # -- dispatch ----------

    def pull(self, consumer: str, now: float) -> Work | None:
        batch = self.core.pull(consumer, now)
        if batch is None:
            return None
        label = ""
        try:
            # step 1: every segment and entry exists and is of this shape, before anything moves
            fault_point("dispatch_step1")
            keys = []
            last = -1
            segs = self.segs
            for e in batch.entries:
                seg_id = e.key >> 32
                if seg_id != last:
                    hdr = segs.get(seg_id)
                    if hdr is None:
                        raise SegmentMissingError(f"segment {seg_id} of batch {batch.id} is gone")
                    guard_signature(batch.signature, hdr.signature, f"segment {seg_id}")
                    label = hdr.label
                    last = seg_id
                keys.append(e.key.to_bytes(12, "big"))
            with self.env.read() as txn:
                found = txn.cursor(db=self.env.dbs["data"]).getmulti(keys)
            if len(found) != len(keys):
                have = {k for k, _ in found}
                gone = next(k for k in keys if k not in have)
                raise SegmentMissingError(f"entry {gone.hex()} of batch {batch.id} is gone")
        except ShapeGuardError:
            raise
        except BaseException:
            self.core.fail(batch.id, now)
            raise
        decode = entry_decoder.decode
        model, sig = batch.model, batch.signature
        items = []
        for _, v in found:
            s = decode(v)
            items.append(Item(s.id, model, sig, s.tokens, s.max_tokens, s.payload, label,
                              s.source))
        fault_point("dispatch_step2")  # cursors advance: the core popped the lane queue
        fault_point("dispatch_step3")  # pending map: the core's in-flight table
        if self.undone:
            items = self._quarantine(batch, items, now)
            if not items:
                return self.pull(consumer, now)  # the whole batch was quarantined
        self.work[batch.id] = items
        return Work(batch.id, model, sig, batch.lane, batch.epoch, batch.pad_to,
                    batch.max_tokens, batch.max_input_len, items)

    def _quarantine(self, batch: Batch, items: list[Item], now: float) -> list[Item]:
        """Settle the entries of a fresh batch that were handed out `max_deliveries` times
        without a result, each with an error result; returns the items still to send."""
        limit = self.store_cfg.max_deliveries
        undone = self.undone
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
        qid = batch.id if not keep else self.core.split(batch.id, bad).id
        self.work[qid] = [items[i] for i in bad]
        if self.deferred is not None:  # the server commits it with its next completions
            self.deferred.append((qid, results, None))
        else:
            self.complete_many([(qid, results, None)], now)
        self.quarantined += len(bad)
        log.warning("quarantined %d item(s) of batch %d after %d deliveries without a result "
                    "(%s); they get an error result", len(bad), batch.id, limit,
                    results[0].error)
        return keep

    def _undone(self, batch_id: int, why: str) -> None:
        f = self.core.inflight.get(batch_id)
        if f is None:
            return
        undone = self.undone
        for e in f.batch.entries:
            undone[e.key] = (undone.get(e.key, (0, ""))[0] + 1, why)

    def fail(self, batch_id: int, now: float, reason: str = "") -> None:
        """A batch came back undone (not one whose completion is settling: it stays)."""
        if batch_id in self.core.settling:
            return
        if batch_id in self.core.inflight:
            self._undone(batch_id, reason or "failed back")
            self.core.fail(batch_id, now)
        self.work.pop(batch_id, None)

    def disconnect(self, consumer: str, now: float, why: str,
                   keep: frozenset[int] | set[int] = frozenset()) -> int:
        """A consumer is gone: every batch it held goes back (counted as undone), except
        those settling or whose completion was received (`keep`)."""
        c = self.core.consumers.get(consumer)
        stay = self.core.settling | keep
        for batch_id in list(c.batches) if c is not None else []:
            if batch_id not in stay:
                self._undone(batch_id, f"consumer {consumer} lost: {why}")
                self.work.pop(batch_id, None)
        return self.core.disconnect(consumer, now, why, keep)

    def close(self) -> None:
        self.env.close()
