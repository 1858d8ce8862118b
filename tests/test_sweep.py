"""The sweep (`core.sweep`): a job's loose shapes (sealed, unheld, half a batch at most) share
its swept shape's batches instead of each taking a GPU for one batch; core with an explicit
clock, and the durable store (the shape guard, a restart)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import SyncStore
from test_choice import BUDGET, fleet
from test_choice import items as choice_items

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.sweep import SWEPT_LABEL, loose, move, swept_signature
from fabricctl.core.terms import JobTerms
from fabricctl.core.types import Contract, Entry, Item, ItemResult, Work
from fabricctl.store.durable import DurableBroker

SEALED = 1  # the job of the helpers' items, sealed by each test that wants a sweep


def items(sig: int, n: int, job: int = SEALED, tokens: int = 100) -> list[Item]:
    return choice_items(sig, n, job=job, tokens=tokens)


def served(b: Broker, t0: float = 0.0, dt: float = 0.001, limit: int = 100_000
           ) -> list[list[Item]]:
    """Every consumer pulls and completes until nothing is left; the batches' items."""
    out: list[list[Item]] = []
    t = t0
    for _ in range(limit):
        got = False
        for c in list(b.consumers):
            batch = b.pull(c, t)
            if batch is not None:
                got = True
                out.append([e.item for e in batch.entries if e.item is not None])
                b.complete(batch.id, t)
        if not got and not (b.ledger.items_received - b.ledger.items_routed):
            break
        t = round(t + dt, 6)
    return out


# -- the parts, with literal asserts ----------


def test_swept_signatures_are_per_job_and_stable() -> None:
    assert swept_signature(1) == swept_signature(1)
    assert swept_signature(1) != swept_signature(2)
    assert swept_signature(0) != 0


def test_loose_needs_staged_unheld_sealed_and_half_a_batch() -> None:
    cfg = CoreConfig()
    s = Shape("m", 7, "", cfg, fleet().lane_counters, 0.0)
    s.lanes.assign(100, 0.0).push(Entry(1, 100, 16, 0.0, job=3))
    s.tokens, s.items, s.jobs = 100, 1, {3: 1}
    sealed = {3: JobTerms(sealed=True)}
    assert loose(s, sealed, BUDGET)
    assert not loose(s, {}, BUDGET)  # its job may still send more
    assert loose(s, sealed, 200)  # half a batch
    assert not loose(s, sealed, 199)  # more than half a batch: it runs alone
    s.held = 1
    assert not loose(s, sealed, BUDGET)
    s.held = 0
    s.swept = True
    assert not loose(s, sealed, BUDGET)
    s.swept = False
    s.state = ShapeState.ACTIVE
    assert not loose(s, sealed, BUDGET)


def test_move_keeps_a_shapes_items_together_and_moves_its_counts() -> None:
    b = fleet()
    src = Shape("m", 7, "", b.cfg, b.lane_counters, 0.0, tally=b.intake.tally)
    dst = Shape("m", 9, SWEPT_LABEL, b.cfg, b.lane_counters, 0.0, tally=b.intake.tally)
    for k, n in enumerate([120, 80, 300]):
        e = Entry(k + 1, n, 16, float(k), job=3)
        src.lanes.assign(n, 0.0).push(e)
        src.tokens += n
        src.items += 1
        src.count_job(3, 1, n)
    src.staged_since = 0.0
    assert move(src, dst, 1.0) == 500
    assert (src.items, src.tokens, src.jobs) == (0, 0, {})
    assert (dst.items, dst.tokens, dst.jobs) == (3, 500, {3: 3})
    assert dst.staged_since == 0.0
    lanes = [la for la in dst.lanes.lanes.values() if la.queue]
    assert len(lanes) == 1 and lanes[0].target >= 300  # one lane: the longest fits
    assert sorted(e.key for e in lanes[0].queue) == [1, 2, 3]
    assert b.intake.tally.items[3] == 3  # still queued: the shared tally is unchanged


# -- through the broker ----------


def test_one_item_shapes_of_a_sealed_job_share_batches() -> None:
    b = fleet()
    b.ingest([it for sig in range(1, 1_001) for it in items(sig, 1, tokens=96)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    batches = served(b)
    assert sum(len(x) for x in batches) == 1_000
    assert len({it.id for x in batches for it in x}) == 1_000  # each once
    assert len(batches) == 100  # 10 a batch (10 x 96 tokens fit the budget), not 1,000
    assert max(len({it.signature for it in x}) for x in batches) == 10  # mixed batches
    assert b.ledger.consistent()
    ms = b.models["m"]
    assert sum(1 for e in b.events.since(0, limit=10_000) if e.kind is EventKind.SWEEP) == 1
    assert ms.switches <= 2


def test_an_open_job_is_not_swept() -> None:
    b = fleet()
    b.ingest([it for sig in range(1, 51) for it in items(sig, 1)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=False))
    batches = served(b)
    assert len(batches) == 50  # it may still send more of each shape: each waits alone
    assert all(len(x) == 1 for x in batches)


def test_a_shape_worth_a_batch_is_not_swept() -> None:
    b = fleet()
    b.ingest(items(1, 6) + [it for sig in range(2, 12) for it in items(sig, 1)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    batches = served(b)
    big = [x for x in batches if any(it.signature == 1 for it in x)]
    assert all({it.signature for it in x} == {1} for x in big)  # ran as its own shape
    assert sum(len(x) for x in batches) == 16


def test_each_job_has_its_own_swept_shape_and_both_progress() -> None:
    b = fleet(2, amortise_batches=4)
    b.ingest([it for sig in range(1, 3_001) for it in items(sig, 1, job=1)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    t = 0.0
    for _ in range(20):  # the big job is under way on both consumers
        for c in ("c0", "c1"):
            batch = b.pull(c, t)
            assert batch is not None
            b.complete(batch.id, t)
        t += 0.001
    b.ingest([it for sig in range(5_001, 5_101) for it in items(sig, 1, job=2)], t)
    b.set_job_terms(2, JobTerms(sealed=True))
    done: dict[int, float] = {}
    sigs: set[int] = set()
    while (b.ledger.items_received - b.ledger.items_routed):
        for c in ("c0", "c1"):
            batch = b.pull(c, t)
            if batch is None:
                continue
            for e in batch.entries:
                assert e.item is not None
                done[e.item.job] = t
            sigs.add(batch.signature)
            b.complete(batch.id, t)
        t = round(t + 0.001, 6)
    ms = b.models["m"]
    assert {swept_signature(1), swept_signature(2)} <= sigs
    # 100 items = 10 batches: the small job ends long before the big one (2,600 items left)
    assert done[2] < done[1] - 0.05
    assert ms.preemptions >= 1


def test_a_failed_mixed_batch_comes_back_and_is_served_once() -> None:
    b = fleet()
    b.ingest([it for sig in range(1, 31) for it in items(sig, 1)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    first = b.pull("c0", 0.0)
    assert first is not None
    while (batch := b.pull("c0", 0.1)) is not None:  # the swept shape finishes dispatching
        b.complete(batch.id, 0.1)
    back = b.fail(first.id, 0.2)  # its shape finished: the key's new open shape takes it
    again = served(b, 0.3)
    assert sorted(it.id for x in again for it in x) == sorted(
        e.item.id for e in back.entries if e.item is not None)
    assert b.ledger.consistent()


settings_ = settings(max_examples=40, deadline=None)


@settings_
@given(shapes=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 12), st.integers(8, 900)),
                       min_size=1, max_size=120),
       consumers=st.integers(1, 3), sealed=st.booleans())
def test_every_item_is_served_once_and_loose_shapes_never_run_alone(
        shapes: list[tuple[int, int, int]], consumers: int, sealed: bool) -> None:
    b = fleet(consumers)
    sent = []
    totals: dict[int, int] = {}
    for sig, (job, n, tokens) in enumerate(shapes, start=1):
        its = items(sig, n, job=job, tokens=tokens)
        totals[sig] = n * tokens
        sent += [it.id for it in its]
        b.ingest(its, 0.0)
    for job in (1, 2, 3):
        b.set_job_terms(job, JobTerms(sealed=sealed))
    got = [it.id for x in served(b) for it in x]
    assert sorted(got) == sorted(sent)
    assert b.ledger.consistent()
    finished = b.lifecycle.finished
    if sealed:  # every job ended its input before the first pull: no loose shape runs alone
        for s in finished:
            if not s.swept:
                assert 2 * totals[s.signature] > BUDGET, f"shape {s.signature} ran alone"
    else:
        assert not any(s.swept for s in finished)


# -- the durable store ----------


def test_the_store_serves_swept_batches_and_a_restart_sweeps_again(tmp_path: Path) -> None:
    contract = Contract("m", 16, 4096, 4096)

    def open_store() -> DurableBroker:
        s = SyncStore(tmp_path / "data", 0.0)
        s.register("gpu", contract, 0.0)
        return s

    def answer(w: Work) -> list[ItemResult]:
        return [ItemResult(it.id, text="r", tokens_out=1) for it in w.items]

    store = open_store()
    job = store.open_job("submit", 0.0, name="in.jsonl").number
    its = [Item(f"x{k}", "m", 100 + k, 50, 8, f"p{k}".encode(), line=k + 1)
           for k in range(200)]
    assert store.submit(its, 0.0, job=job) == ([], 0)
    store.seal_job(job, 200, 0.0)  # its input ended: every one-item shape is loose
    w = store.pull("gpu", 1.0)
    assert w is not None and len(w.items) == 16  # one batch of 16 shapes
    assert len({it.signature for it in w.items}) == 16
    assert all(it.signature == 100 + int(it.id[1:]) for it in w.items)  # each its own
    assert all(it.job == job for it in w.items)
    store.complete(w.id, answer(w), 1.0)
    first = {it.id for it in w.items}
    w = store.pull("gpu", 1.0)  # in flight when the broker stops: it comes back
    assert w is not None
    store.close()

    store = open_store()  # the restart: entries back in their own shapes, swept again
    ids: list[str] = []
    batches = 0
    while (w := store.pull("gpu", 2.0)) is not None:
        ids += [it.id for it in w.items]
        batches += 1
        store.complete(w.id, answer(w), 2.0)
    assert sorted(ids) == sorted(it.id for it in its if it.id not in first)
    assert batches == -(-184 // 16)  # swept again: full batches, not one per shape
    rec = store.job(job)
    assert rec is not None and rec.completed == 200
    store.close()


def test_a_shape_loose_again_is_swept_into_the_swept_shape_its_consumer_holds() -> None:
    """A one-item shape that ran alone (before its job ended) fails back after it finished:
    its item stages a new loose shape, which the consumer already on the job's swept shape
    sweeps into it and keeps serving (it does not leave a shape that just got work)."""
    b = fleet(1)
    b.ingest(items(1, 1), 0.0)
    alone = b.pull("c0", 0.0)  # the job is open: shape 1 goes alone
    assert alone is not None and not alone.mixed
    b.ingest([it for sig in range(2, 32) for it in items(sig, 1)], 0.1)
    b.set_job_terms(SEALED, JobTerms(sealed=True))
    out = []
    while (x := b.pull("c0", 0.2)) is not None:  # the swept shape, dispatched to the end
        assert x.mixed
        out.append(x)
    b.fail(alone.id, 0.3)  # shape 1 finished: its item stages a new, loose, shape
    again = b.pull("c0", 0.4)
    assert again is not None and again.mixed and len(again.entries) == 1
    assert b.models["m"].slots["c0"].current.swept  # type: ignore[union-attr]
    for x in (*out, again):
        b.complete(x.id, 0.5)
    assert b.ledger.consistent()
    assert b.ledger.items_completed == 31
