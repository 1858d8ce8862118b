"""Ingest: the half of the durable broker that takes items in.

Contract: `ingest_steps(items, now)` (the broker's `prepare_ingest`) validates and
de-duplicates a chunk (an id already stored in the item's job, or repeated within the chunk, is
a reject, in index order; `plan.stored` names the rejects already stored, which a resumed
submit counts as skipped; an item of a job that takes no more items is refused), counts each
job's new items (`plan.jobs`, written on its record in the same commit, with the shapes
they join, the model of the job's first of them, `plan.job_models`, and how many go to each
endpoint, `plan.job_endpoints`: `core.mix.endpoint_of`, each item once), assigns each item
to its lane and encodes its entry, id and the new segment headers (a key at a time: the
same lanes, rows and segment numbers as item by item); `ingest_rows(txn, plan)`
writes them inside the caller's durable transaction (every key above every stored one:
append mode, return counts checked: a key not stored is a broken invariant, an
`AssertionError`); `apply_ingest_steps(plan, now)` (the broker's
`apply_ingest`), after the commit, makes the entries dispatchable (`Broker.admit_shape`, a run
at a time) and returns the rejects.
An entry whose lane or shape was retired while its commit ran (the tick, a shape switch)
joins its key's open shape instead. `Ingest` is the durable broker's ingest part: it works
on the shared `StoreState` (the core, the env, the segments, the meta counters, the
settings) and owns one thing itself, the tail segment (the newest one, the only one that may
take more entries). Segments are job-pure: entries of one (model, signature, job) each; the
tail grows only for its own key. Stepped forms pause as `fabricctl.store.steps` describes;
the broker runs them straight through.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import lmdb

from fabricctl.core.jobs import JobShape
from fabricctl.core.mix import count_endpoints
from fabricctl.core.types import Item
from fabricctl.errors import StoreFullError
from fabricctl.store.faults import fault_point
from fabricctl.store.keys import (
    SegHeader,
    id_key,
)
from fabricctl.store.placement import (
    Good,
    Group,
    IngestPlan,
    Refused,
    cut_runs,
    encode_runs,
    group_items,
    number_runs,
)
from fabricctl.store.rows import put_steps
from fabricctl.store.steps import STEP_ADMITS, STEP_ITEMS, STEP_ROWS, Steps

if TYPE_CHECKING:
    from fabricctl.store.state import StoreState

MAX_ID_CHARS = 256
MAX_ID_BYTES = 511  # LMDB's key size limit: the id is the key of the id index


def validate(item: Item) -> str | None:
    """Why an item cannot be stored, or None."""
    if not item.id:
        return "id must be a non-empty string"
    if len(item.id) > MAX_ID_CHARS:
        return f"id is longer than {MAX_ID_CHARS} characters"
    if "\x00" in item.id:
        return "id must not contain NUL"
    if not 0 <= item.line < 1 << 63:
        return "line must be a non-negative integer"
    if not item.model:
        return "model must be a non-empty string"
    if item.input_tokens < 1:
        return "input_tokens must be at least 1"
    if item.max_tokens < 1:
        return "max_tokens must be at least 1"
    if not 0 <= item.signature < 1 << 64:
        return "signature must be an unsigned 64-bit integer"
    return None


def _valid(item: Item) -> bool:
    """The common case of `validate` in one expression (the hot path of ingest)."""
    return (0 < len(item.id) <= MAX_ID_CHARS and bool(item.model) and item.input_tokens >= 1
            and item.max_tokens >= 1 and 0 <= item.signature < 1 << 64
            and "\x00" not in item.id and 0 <= item.line < 1 << 63)


def _screen_all(part: list[Item], at: int, seen: set[bytes], pending: set[bytes]
                ) -> list[tuple[int, Item, bytes]] | None:
    """The screen of a slice whose items are all valid, of one job and new (no id in `seen`,
    in `pending` or twice), in one pass per field: (index, item, `ids` key) for each, the
    keys added to `seen`; None when any item is not so (the caller screens them one by
    one, with the reasons)."""
    ids = [it.id for it in part]
    sigs = [it.signature for it in part]
    lines = [it.line for it in part]
    jobs = {it.job for it in part}
    if not (len(jobs) == 1 and min(map(len, ids)) > 0 and max(map(len, ids)) <= MAX_ID_CHARS
            and "\x00" not in "".join(ids) and all([it.model for it in part])
            and min([it.input_tokens for it in part]) >= 1
            and min([it.max_tokens for it in part]) >= 1
            and min(sigs) >= 0 and max(sigs) < 1 << 64 and min(lines) >= 0
            and max(lines) < 1 << 63):
        return None
    keys = [s.encode() for s in ids]
    job = jobs.pop()
    if job:
        prefix = id_key(job, b"")
        keys = [prefix + k for k in keys]
    fresh = set(keys)
    if (len(fresh) != len(keys) or max(map(len, keys)) > MAX_ID_BYTES
            or not fresh.isdisjoint(seen) or not fresh.isdisjoint(pending)):
        return None
    seen |= fresh
    return list(zip(range(at, at + len(part)), part, keys, strict=True))


class Ingest:
    """Why: taking items in is a third of the store's code; it lives apart from the rest."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self.tail_seg = 0  # the newest segment: the only one that may take more entries

    def _screen(
        self, items: list[Item], pending: set[bytes]
    ) -> Steps[tuple[list[Refused], list[tuple[int, Item, bytes]], set[int]]]:
        """Split a chunk into rejects, the items to store (index, item, `ids` key) and the
        indexes of rejects already stored in their job, pausing every `STEP_ROWS` items; ids
        in `pending` (being committed) count as stored. An item of a job that takes no
        more items (sealed, ended, unknown) is refused, unless it is already stored."""
        rejects: list[Refused] = []
        good: list[tuple[int, Item, bytes]] = []
        seen: set[bytes] = set()
        refuses = self.state.jobs.refuses_items
        closed: dict[int, str | None] = {}  # job -> why it takes no items (None: it does)
        for at in range(0, len(items), STEP_ROWS):
            if at:
                yield
            part = items[at:at + STEP_ROWS]
            fast = _screen_all(part, at, seen, pending)
            if fast is not None:  # every item valid, of one job, no duplicate
                job = part[0].job
                if job and job not in closed:
                    closed[job] = refuses(job)
                good += fast
                continue
            for i, item in enumerate(part, at):
                why = self._screen_one(i, item, seen, pending, closed, good)
                if why is not None:
                    rejects.append(Refused(i, why))
        stored_at: set[int] = set()
        if good:
            found = []
            for k in range(0, len(good), STEP_ROWS):  # no read transaction across a pause
                yield
                with self.state.env.read() as txn:
                    found += txn.cursor(db=self.state.env.dbs["ids"]).getmulti(
                        [g[2] for g in good[k:k + STEP_ROWS]])
            if found:
                stored = {k for k, _ in found}
                for i, item, key in good:
                    if key in stored:
                        rejects.append(Refused(i, f"duplicate id {item.id!r}"))
                        stored_at.add(i)
                good = [g for g in good if g[2] not in stored]
            if any(closed.values()):
                shut = [g for g in good if closed.get(g[1].job)]
                rejects.extend(Refused(i, closed[item.job] or "") for i, item, _ in shut)
                good = [g for g in good if not closed.get(g[1].job)]
            rejects.sort(key=lambda r: r.index)
        return rejects, good, stored_at

    def _screen_one(self, i: int, item: Item, seen: set[bytes], pending: set[bytes],
                    closed: dict[int, str | None], good: list[tuple[int, Item, bytes]]
                    ) -> str | None:
        """Screen one item (`_screen`, item by item): why it is refused, or None, when it
        joins `good` (and its key `seen`)."""
        why = None if _valid(item) else validate(item)
        if why is not None:
            return why
        job = item.job
        key = item.id.encode()
        if job:
            key = id_key(job, key)
            if job not in closed:
                closed[job] = self.state.jobs.refuses_items(job)
        if len(key) > MAX_ID_BYTES:
            return f"id is longer than {MAX_ID_BYTES - len(key) + len(item.id.encode())}" \
                " bytes in UTF-8"
        if key in seen or key in pending:
            return f"duplicate id {item.id!r}"
        seen.add(key)
        good.append((i, item, key))
        return None

    def ingest_steps(self, items: list[Item], now: float, landing: bool = False,
                     after: IngestPlan | None = None) -> Steps[IngestPlan]:
        """Screen, place and encode a chunk (nothing is written yet), pausing after the
        screen and every `STEP_ITEMS` items placed or encoded.

        `landing`: a commit is still running, to be applied before this one, and `after` is
        its ingest. Its ids count as stored, and this ingest starts new segments above its
        own: it never grows a segment while that commit (which may delete the segment, or
        be refused) is not applied. Should `after` be refused, prepare again."""
        env = self.state.env
        if env.free_disk() < self.state.cfg.disk_reserve:
            raise StoreFullError(env.full_message("the disk is nearly full"))
        pending = {idb for idb, _ in after.id_rows} if after is not None else set()
        rejects, good, stored_at = yield from self._screen(items, pending)
        plan = IngestPlan(rejects, now)
        plan.stored = stored_at
        if not good:
            return plan
        yield
        plan.releases = self.state.core.lane_counters.releases  # before any placement (apply)
        next_seg = self.state.meta.next_seg
        tail: SegHeader | None = self.state.segs.get(self.tail_seg)
        if landing:
            tail = None
            if after is not None and after.admits:
                next_seg = after.next_seg
        groups = yield from self._place(plan, group_items(good), now)
        cuts = cut_runs(groups, tail, self.tail_seg, self.state.cfg.segment_entries, now)
        next_seg = number_runs(cuts, next_seg)
        yield from encode_runs(plan, cuts, now)
        plan.next_seg = next_seg
        return plan

    def _place(self, plan: IngestPlan, keyed: dict[tuple[str, int, int], list[Good]],
               now: float) -> Steps[list[Group]]:
        """Each (model, shape, job) group's items placed in the lanes of its shape (the same
        lanes as one at a time, in arrival order), its job's counts moved; pauses every
        `STEP_ITEMS` items."""
        open_shape = self.state.core.open_shape
        jobs = plan.jobs
        groups: list[Group] = []
        job_items: dict[int, list[Item]] = {}  # counted by endpoint once a job, not a group
        since = 0
        for (model, sig, job), gs in keyed.items():
            its = [g[1] for g in gs]
            shape = open_shape(model, sig, its[0].label, now)
            if job:
                jobs[job] = jobs.get(job, 0) + len(its)
                plan.job_shapes.setdefault(job, set()).add(JobShape(model, sig, shape.label))
                first = (its[0].line, model)  # a group keeps arrival (line) order
                plan.job_models[job] = min(plan.job_models.get(job, first), first)
                job_items.setdefault(job, []).extend(its)
            group = Group(gs, shape, its, [it.input_tokens for it in its])
            ns, targets = group.tokens, group.targets
            for k in range(0, len(ns), STEP_ITEMS):
                if since >= STEP_ITEMS:
                    since = 0
                    yield
                chunk = ns[k:k + STEP_ITEMS]
                group.lanes += shape.lanes.assign_many(chunk, now, targets)
                since += len(chunk)
            groups.append(group)
        for job, its in job_items.items():
            plan.job_endpoints.setdefault(job, Counter()).update(count_endpoints(its))
        return groups

    def ingest_rows(self, txn: lmdb.Transaction, plan: IngestPlan) -> Steps[None]:
        """Write a prepared chunk inside the caller's transaction (the meta counters are the
        caller's to write), pausing every `STEP_PUTS` rows and between tables."""
        dbs = self.state.env.dbs
        # every new key is above every stored one: append (return counts checked)
        for db, rows, append in (("data", plan.data_rows, True), ("seg", plan.seg_rows, True),
                                 ("ids", plan.id_rows, False)):
            added = yield from put_steps(txn, dbs[db], rows, append)
            if added != len(rows):  # the screen ran just before, and we are the only writer
                raise AssertionError(f"ingest: {len(rows) - added} {db} keys were not "
                                     "stored (already there, or out of order)")
        fault_point("ingest_before_commit")

    def apply_ingest_steps(self, plan: IngestPlan, now: float) -> Steps[list[Refused]]:
        """After the commit: the new entries become dispatchable; returns the rejects. It
        pauses every `STEP_ADMITS` entries admitted (those admitted are dispatchable at
        once: they are committed)."""
        if not plan.admits:
            return plan.rejects
        self.state.meta.next_seg = plan.next_seg
        segs, core = self.state.segs, self.state.core
        for r in plan.runs:
            r.hdr.count = r.end
            if r.new:
                segs[r.seg_id] = r.hdr
        self.tail_seg = plan.runs[-1].seg_id
        since = 0
        for shape, lanes, entries in plan.admits:
            for k in range(0, len(entries), STEP_ADMITS):
                if since >= STEP_ADMITS:
                    since = 0
                    yield
                part = entries[k:k + STEP_ADMITS]
                core.admit_shape(shape, lanes[k:k + STEP_ADMITS], part, now, plan.releases)
                since += len(part)
        return plan.rejects
