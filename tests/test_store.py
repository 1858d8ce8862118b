"""The durable store: full map, duplicates, late completions, bad input, recovery, segment
deletion, payloads and the shape guard, against a real LMDB environment in a temp dir."""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import msgspec
import pytest
from store_helpers import SyncStore

from fabricctl.core.broker import ShapeGuardError
from fabricctl.core.types import Contract, Item, ItemResult, Work
from fabricctl.errors import SegmentMissingError, StoreError, StoreFullError, StoreLockedError
from fabricctl.formats.results import ResultRecord
from fabricctl.store.durable import DurableBroker, Refused, StoreConfig
from fabricctl.store.env import MiB, StoreEnv
from fabricctl.store.keys import entry_key_of, rseq_key

MODEL = "m"
SIG = 0xC0FFEE
CONTRACT = Contract(MODEL, 16, 4096, 4096)


def items(n: int, prefix: str = "i", sig: int = SIG, tokens: int = 100,
          payload: bytes = b"") -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, sig, tokens, 8, payload or f"p{k}".encode())
            for k in range(n)]


def answer(w: Work) -> list[ItemResult]:
    return [ItemResult(it.id, text=f"r:{it.id}", tokens_out=2) for it in w.items]


def drain(store: DurableBroker, now: float = 1.0, consumer: str = "gpu") -> int:
    """Pull and complete until nothing is left; returns the results stored."""
    if consumer not in store.view.consumers:
        store.register(consumer, CONTRACT, now)
    stored = 0
    while (w := store.pull(consumer, now)) is not None:
        n = store.complete(w.id, answer(w), now)
        assert n == len(w.items)
        stored += n
    return stored


def db_entries(store: DurableBroker, name: str) -> int:
    with store.env.read() as txn:
        return int(txn.stat(store.env.dbs[name])["entries"])


def result_ids(store: DurableBroker) -> list[str]:
    return [rec.id for _, rec in store.results_since(0, limit=1_000_000)]


@pytest.fixture
def store(tmp_path: Path) -> DurableBroker:
    s = SyncStore(tmp_path / "data", 0.0)
    yield s  # type: ignore[misc]
    s.close()


# -- full map ----------


def test_full_map_refuses_clearly_keeps_acked_and_resumes_after_draining(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = StoreConfig(map_size=1 * MiB, map_ceiling=2 * MiB, segment_entries=64)
    store = SyncStore(data, 0.0, store=cfg)
    acked: list[str] = []
    payload = bytes(range(256)) * 2 + b"x" * 88  # 600 bytes
    err: StoreFullError | None = None
    for c in range(200):
        chunk = items(50, prefix=f"c{c}-", payload=payload)
        try:
            rejects = store.ingest(chunk, 0.0)
        except StoreFullError as e:
            err = e
            break
        assert rejects == []
        acked.extend(it.id for it in chunk)
    assert err is not None
    msg = str(err)
    assert str(data) in msg
    assert "free" in msg
    assert "ceiling" in msg
    assert len(acked) >= 500
    # the refused call stored nothing and left the counts alone
    assert store.view.ledger.items_received == len(acked)
    assert store.meta.ledger.items_received == len(acked)
    assert db_entries(store, "data") == len(acked)
    with pytest.raises(StoreFullError):
        store.ingest(items(50, prefix="again-", payload=payload), 0.0)
    store.close()

    # a restart finds every acknowledged item and nothing else
    store = SyncStore(data, 1.0, store=cfg)
    assert store.recovery.items == len(acked)
    assert store.recovery.ledger_ok is True
    assert store.view.ledger.items_queued == len(acked)
    # completion still works on a full store; it deletes segments and so makes room
    assert drain(store) == len(acked)
    assert sorted(result_ids(store)) == sorted(acked)
    assert len(store.segs) == 0
    assert db_entries(store, "data") == 0
    # ingest resumes without a restart
    assert store.ingest(items(50, prefix="after-", payload=payload), 2.0) == []
    assert store.view.ledger.items_queued == 50
    store.close()


def test_full_map_ingest_resumes_after_reopen_with_a_bigger_ceiling(tmp_path: Path) -> None:
    data = tmp_path / "data"
    small = StoreConfig(map_size=1 * MiB, map_ceiling=1 * MiB)
    store = SyncStore(data, 0.0, store=small)
    n = 0
    with pytest.raises(StoreFullError):
        for c in range(100):
            store.ingest(items(50, prefix=f"c{c}-", payload=b"y" * 600), 0.0)
            n += 50
    store.close()
    store = SyncStore(data, 1.0, store=StoreConfig(map_size=1 * MiB, map_ceiling=8 * MiB))
    assert store.recovery.items == n
    assert store.ingest(items(200, prefix="more-", payload=b"y" * 600), 1.0) == []
    assert store.view.ledger.items_queued == n + 200
    assert store.env.map_size > 1 * MiB
    store.close()


def test_drains_may_grow_a_full_map_past_its_ceiling_ingest_may_not(tmp_path: Path) -> None:
    env = StoreEnv(tmp_path / "env", 1 * MiB, 1 * MiB)
    data = env.dbs["data"]
    value = b"v" * 600
    n = 0

    def put_100(txn: lmdb.Transaction) -> None:
        for k in range(n, n + 100):
            txn.put(k.to_bytes(8, "big"), value, db=data)

    with pytest.raises(StoreFullError, match="ingest refused: the LMDB map reached its ceiling"):
        while True:
            env.write(put_100)
            n += 100
    assert env.map_size == 1 * MiB
    env.write(put_100, drain=True)  # a completion on a full store still commits
    n += 100
    assert 1 * MiB < env.map_size <= 1 * MiB + env.headroom
    with pytest.raises(StoreFullError, match="write refused"):
        while True:
            env.write(put_100, drain=True)
            n += 100
    assert env.map_size == 1 * MiB + env.headroom
    env.close()


def test_ingest_is_refused_below_the_disk_reserve(tmp_path: Path) -> None:
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(disk_reserve=1 << 62))
    with pytest.raises(StoreFullError, match="the disk is nearly full") as err:
        store.ingest(items(1), 0.0)
    assert str(tmp_path / "d") in str(err.value)
    assert store.view.ledger.items_received == 0
    store.close()


# -- duplicate and late completions ----------


def test_duplicate_completion_returns_minus_one_and_stores_one_result(
    store: DurableBroker,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    assert store.ingest(items(10), 0.0) == []
    w = store.pull("gpu", 0.0)
    assert w is not None
    assert store.complete(w.id, answer(w), 0.0) == 10
    assert store.complete(w.id, answer(w), 0.0) == -1
    assert store.complete_many([(w.id, answer(w), None)], 0.0) == [-1]
    assert result_ids(store) == [f"i{k}" for k in range(10)]
    assert store.counters().duplicate_completions == 2
    assert store.view.ledger.items_completed == 10
    assert store.meta.ledger.items_completed == 10


def test_same_batch_twice_in_one_group_commit_counts_once(store: DurableBroker) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(10), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    assert store.complete_many([(w.id, answer(w), 0), (w.id, answer(w), 0)], 0.0) == [10, -1]
    assert len(result_ids(store)) == 10


def test_late_completion_after_fail_creates_no_second_result(store: DurableBroker) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(10), 0.0)
    first = store.pull("gpu", 0.0)
    assert first is not None
    store.fail(first.id, 0.0)  # the consumer was lost: the items go back to their lane
    assert store.view.ledger.items_queued == 10
    again = store.pull("gpu", 0.0)
    assert again is not None
    assert [it.id for it in again.items] == [it.id for it in first.items]
    assert store.complete(first.id, answer(first), 0.0) == -1  # the late answer
    assert result_ids(store) == []
    assert store.complete(again.id, answer(again), 0.0) == 10
    assert store.complete(first.id, answer(first), 0.0) == -1
    assert result_ids(store) == [f"i{k}" for k in range(10)]
    assert store.view.ledger.difference() == (0, 0)


def test_late_completion_after_consumer_disconnect_is_refused(store: DurableBroker) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(10), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    assert store.disconnect("gpu", 0.0, "lost") == 10  # what the server does on a lost socket
    assert store.complete(w.id, answer(w), 0.0) == -1
    assert drain(store, consumer="gpu2") == 10
    assert len(result_ids(store)) == 10


def test_completion_from_before_a_restart_is_refused(tmp_path: Path) -> None:
    store = SyncStore(tmp_path / "d", 0.0)
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(10), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    store.close()
    store = SyncStore(tmp_path / "d", 1.0)
    assert store.recovery.items == 10  # the pending batch is available again
    assert store.complete(w.id, answer(w), 1.0) == -1
    assert drain(store) == 10
    assert len(result_ids(store)) == 10
    store.close()


def test_missing_results_are_stored_as_errors(store: DurableBroker) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(3), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    assert store.complete(w.id, answer(w)[:1], 0.0) == 3
    rec = store.result("i2")
    assert rec is not None
    assert rec.finish_reason == "error"
    assert rec.error == "the engine returned no result for this item"
    ok = store.result("i0")
    assert ok is not None
    assert ok.text == "r:i0"
    assert ok.prompt_tokens == 100
    assert ok.signature == SIG


# -- duplicate ids and bad fields ----------


def test_duplicate_ids_within_a_chunk_across_chunks_and_after_completion(
    tmp_path: Path,
) -> None:
    store = SyncStore(tmp_path / "d", 0.0)
    chunk = [*items(3), Item("i1", MODEL, SIG, 50, 8, b"other")]
    assert store.ingest(chunk, 0.0) == [chunk_reject(3, "i1")]
    # across chunks, while queued
    assert store.ingest([Item("new", MODEL, SIG, 10, 8), *items(1)], 0.0) == [
        chunk_reject(1, "i0")]
    assert store.view.ledger.items_received == 4
    # after completion (and after its segment is gone)
    assert drain(store) == 4
    assert len(store.segs) == 0
    assert store.ingest(items(2), 1.0) == [chunk_reject(0, "i0"), chunk_reject(1, "i1")]
    store.close()
    # and after a restart
    store = SyncStore(tmp_path / "d", 2.0)
    assert store.ingest([Item("new", MODEL, SIG, 10, 8), Item("fresh", MODEL, SIG, 10, 8)],
                        2.0) == [chunk_reject(0, "new")]
    assert store.view.ledger.items_queued == 1
    assert len(result_ids(store)) == 4
    store.close()


def chunk_reject(index: int, ident: str) -> Refused:
    return Refused(index, f"duplicate id {ident!r}")


def test_bad_fields_are_rejected_by_index_and_the_rest_stored(store: DurableBroker) -> None:
    good = items(3, prefix="ok")
    bad = [
        Item("", MODEL, SIG, 10, 8),
        Item("x" * 257, MODEL, SIG, 10, 8),
        Item("nomodel", "", SIG, 10, 8),
        Item("zero-in", MODEL, SIG, 0, 8),
        Item("zero-out", MODEL, SIG, 10, 0),
        Item("neg-sig", MODEL, -1, 10, 8),
        Item("big-sig", MODEL, 1 << 64, 10, 8),
        Item("é" * 256, MODEL, SIG, 10, 8),  # 256 characters, 512 bytes: over LMDB's key limit
    ]
    chunk = [good[0], *bad[:4], good[1], *bad[4:], good[2]]
    rejects = store.ingest(chunk, 0.0)
    assert [(r.index, r.reason) for r in rejects] == [
        (1, "id must be a non-empty string"),
        (2, "id is longer than 256 characters"),
        (3, "model must be a non-empty string"),
        (4, "input_tokens must be at least 1"),
        (6, "max_tokens must be at least 1"),
        (7, "signature must be an unsigned 64-bit integer"),
        (8, "signature must be an unsigned 64-bit integer"),
        (9, "id is longer than 511 bytes in UTF-8"),
    ]
    assert store.view.ledger.items_received == 3
    assert db_entries(store, "data") == 3
    assert db_entries(store, "ids") == 3
    assert drain(store) == 3


# -- recovery ----------


def lane_state(store: DurableBroker) -> dict[tuple[str, int], object]:
    """Per shape: label, counts, and per lane (id, target, items, tokens, entry keys)."""
    out: dict[tuple[str, int], object] = {}
    for shape in store.view.shapes():
        lanes = sorted((lane.id, lane.target, len(lane.queue), lane.tokens,
                        tuple(e.key for e in lane.queue)) for lane in shape.lanes.lanes.values())
        out[shape.key] = (shape.label, shape.state.value, shape.items, shape.tokens,
                          shape.lanes.targets(), lanes)
    return out


def snapshot_view(store: DurableBroker, now: float) -> object:
    snap = msgspec.to_builtins(store.view.snapshot(now))
    for s in snap["shapes"]:  # creation times and histories restart with the process
        for key in ("age", "history"):
            s.pop(key)
    return {"shapes": snap["shapes"], "ledger": snap["ledger"],
            "difference": snap["difference"]}


def test_recovery_of_100k_queued_items_restores_identical_lanes_and_counts(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)
    store = SyncStore(tmp_path / "d", 5.0)
    sigs = [0x1000 + k for k in range(4)]
    n = 0
    while n < 100_000:
        chunk = [Item(f"q{n + k}", MODEL, rng.choice(sigs),
                      max(1, int(rng.lognormvariate(5.5, 0.6))), rng.randint(1, 256),
                      b"%d" % (n + k), label=f"shape-{k % 2}")
                 for k in range(1000)]
        assert store.ingest(chunk, 5.0) == []
        n += len(chunk)
    before = lane_state(store)
    snap_before = snapshot_view(store, 5.0)
    segs_before = {k: (h.count, h.deleted, h.signature) for k, h in store.segs.items()}
    assert sum(len(v[5]) for v in before.values()) > 100  # many lanes  # type: ignore[index]
    store.close()

    store = SyncStore(tmp_path / "d", 5.0)
    try:
        rep = store.recovery
        assert rep.items == 100_000
        assert rep.ledger_ok is True
        assert rep.segments == len(segs_before)
        assert lane_state(store) == before
        assert snapshot_view(store, 5.0) == snap_before
        assert {k: (h.count, h.deleted, h.signature) for k, h in store.segs.items()} == segs_before
        assert store.view.ledger.items_queued == 100_000
    finally:
        store.close()


def test_recovery_skips_completed_entries_and_requeues_pending_ones(tmp_path: Path) -> None:
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=8))
    store.register("gpu", Contract(MODEL, 4, 4096, 4096), 0.0)
    store.ingest(items(20), 0.0)
    done = store.pull("gpu", 0.0)
    pending = store.pull("gpu", 0.0)
    assert done is not None
    assert pending is not None
    assert store.complete(done.id, answer(done), 0.0) == 4
    store.close()
    store = SyncStore(tmp_path / "d", 1.0, store=StoreConfig(segment_entries=8))
    assert store.recovery.items == 16
    assert store.recovery.ledger_ok is True
    store.register("gpu", Contract(MODEL, 4, 4096, 4096), 1.0)
    again = store.pull("gpu", 1.0)
    assert again is not None
    assert [it.id for it in again.items] == [it.id for it in pending.items]
    assert store.complete(again.id, answer(again), 1.0) == 4
    assert drain(store, consumer="gpu") == 12
    assert sorted(result_ids(store)) == sorted(f"i{k}" for k in range(20))
    store.close()


# -- segments ----------


def test_segments_are_deleted_when_every_entry_has_a_result(tmp_path: Path) -> None:
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=8))
    store.register("gpu", Contract(MODEL, 4, 4096, 4096), 0.0)
    store.ingest(items(20), 0.0)  # one lane: segments of 8, 8 and 4 entries
    assert sorted(h.count for h in store.segs.values()) == [4, 8, 8]
    first = min(store.segs)
    w = store.pull("gpu", 0.0)
    assert w is not None
    store.complete(w.id, answer(w), 0.0)
    assert store.segs[first].deleted == 4
    assert db_entries(store, "results") == 4  # a result marks its entry completed
    assert db_entries(store, "data") == 20
    w = store.pull("gpu", 0.0)
    assert w is not None
    store.complete(w.id, answer(w), 0.0)
    assert first not in store.segs  # all 8 have results: gone whole, in the same commit
    assert len(store.segs) == 2
    assert db_entries(store, "results") == 8
    assert db_entries(store, "data") == 12
    assert db_entries(store, "seg") == 2
    with store.env.read() as txn:
        assert txn.get(entry_key_of(first << 32), db=store.env.dbs["data"]) is None
    assert drain(store, consumer="gpu") == 12
    assert store.segs == {}
    for name in ("seg", "data"):
        assert db_entries(store, name) == 0
    assert db_entries(store, "results") == 20
    assert db_entries(store, "ids") == 20
    # the lane takes new items in a new segment
    store.ingest(items(3, prefix="later"), 1.0)
    assert [h.count for h in store.segs.values()] == [3]
    store.close()


def data_keys(store: DurableBroker) -> list[bytes]:
    with store.env.read() as txn:
        return list(txn.cursor(db=store.env.dbs["data"]).iternext(values=False))


def test_every_ingest_appends_above_all_stored_keys_whatever_lanes_it_feeds(
    tmp_path: Path,
) -> None:
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=64))
    rng = random.Random(5)
    seen: list[bytes] = []
    for c in range(30):
        sigs = [SIG] if c % 3 == 0 else [SIG, SIG + 1, SIG + 2]
        chunk = [Item(f"c{c}-{k}", MODEL, rng.choice(sigs), rng.randint(1, 3000), 8, b"x")
                 for k in range(rng.randint(1, 90))]
        assert store.ingest(chunk, float(c)) == []
        keys = data_keys(store)
        new = keys[len(seen):]
        assert keys[:len(seen)] == seen  # nothing stored moved...
        assert len(new) == len(chunk) and min(new) > max(seen, default=b"")  # ...all above it
        seen = keys
    # segments are shape-pure (every queued entry's segment has its shape's signature),
    # while one segment feeds many lanes
    assert all(h.count <= 64 for h in store.segs.values())
    lanes_of: dict[int, set[int]] = {}
    for shape in store.view.models[MODEL].open.values():
        for lane in shape.lanes.lanes.values():
            for e in lane.queue:
                assert store.segs[e.key >> 32].signature == shape.signature
                lanes_of.setdefault(e.key >> 32, set()).add(lane.id)
    assert max(len(v) for v in lanes_of.values()) > 3
    store.close()


def test_the_newest_segment_grows_while_its_shape_keeps_coming(tmp_path: Path) -> None:
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=8))
    store.ingest(items(3, prefix="a"), 0.0)
    store.ingest(items(3, prefix="b"), 0.0)  # same shape: the newest segment grows
    assert [h.count for h in store.segs.values()] == [6]
    store.ingest(items(4, prefix="c"), 0.0)  # rolls over at 8
    assert [h.count for h in store.segs.values()] == [8, 2]
    store.ingest(items(2, prefix="d", sig=SIG + 1) + items(2, prefix="e"), 0.0)
    # another shape came first: the newest segment still takes its own shape's items
    assert [(h.signature - SIG, h.count) for h in store.segs.values()] == [(0, 8), (0, 4), (1, 2)]
    store.ingest(items(1, prefix="f"), 0.0)  # the newest segment is the other shape's now
    assert [(h.signature - SIG, h.count) for h in store.segs.values()] == [
        (0, 8), (0, 4), (1, 2), (0, 1)]
    store.close()
    store = SyncStore(tmp_path / "d", 1.0, store=StoreConfig(segment_entries=8))
    assert store.recovery.items == 15
    assert drain(store) == 15
    store.close()


def test_pulled_work_carries_payloads_intact(store: DurableBroker) -> None:
    rng = random.Random(3)
    sent = [Item(f"p{k}", MODEL, SIG, 100, 1 + k, rng.randbytes(rng.randint(0, 3000)),
                 source=k % 3) for k in range(40)]
    sent[0] = Item("p0", MODEL, SIG, 100, 1, b"")
    sent[1] = Item("p1", MODEL, SIG, 100, 2, b"\x00" * 100)
    assert store.ingest(sent, 0.0) == []
    store.register("gpu", CONTRACT, 0.0)
    got: dict[str, Item] = {}
    while (w := store.pull("gpu", 0.0)) is not None:
        assert w.model == MODEL
        assert w.signature == SIG
        for it in w.items:
            got[it.id] = it
        store.complete(w.id, answer(w), 0.0)
    assert len(got) == len(sent)
    for it in sent:
        g = got[it.id]
        assert g.payload == it.payload
        assert (g.model, g.signature, g.input_tokens, g.max_tokens, g.source) == (
            it.model, it.signature, it.input_tokens, it.max_tokens, it.source)


def test_results_since_pages_in_order(store: DurableBroker) -> None:
    store.ingest(items(30), 0.0)
    assert drain(store) == 30
    page1 = store.results_since(0, limit=12)
    page2 = store.results_since(page1[-1][0], limit=12)
    page3 = store.results_since(page2[-1][0], limit=12)
    seqs = [s for s, _ in page1 + page2 + page3]
    assert seqs == list(range(1, 31))
    assert [r.id for _, r in page1 + page2 + page3] == [f"i{k}" for k in range(30)]
    assert store.results_since(30) == []
    assert store.result("nope") is None


def test_results_since_starts_inside_a_commits_run_at_every_number(tmp_path: Path) -> None:
    """A commit numbers its results in one row; a page may start and end anywhere in one."""
    store = SyncStore(tmp_path / "d", 0.0)
    store.register("gpu", Contract(MODEL, 3, 4096, 4096), 0.0)
    store.ingest(items(20), 0.0)
    batches = []
    while (w := store.pull("gpu", 0.0)) is not None:
        batches.append(w)
    for group in (batches[:1], batches[1:4], batches[4:5], batches[5:]):  # runs of 3, 9, 3, 5
        store.complete_many([(w.id, answer(w), None) for w in group], 0.0)
    order = [it.id for w in batches for it in w.items]
    assert db_entries(store, "rseq") == 4
    for since in range(22):
        for limit in (1, 2, 4, 7, 100):
            page = store.results_since(since, limit)
            assert [s for s, _ in page] == list(range(since + 1, min(since + limit, 20) + 1))
            assert [r.id for _, r in page] == order[since:since + limit]
    store.close()


# -- guards ----------


def test_shape_guard_stops_a_batch_whose_segment_has_another_signature(
    store: DurableBroker,
) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(10), 0.0)
    seg_id = next(iter(store.segs))
    store.segs[seg_id].signature ^= 0x1  # corrupt the header's signature in memory
    with pytest.raises(ShapeGuardError, match="shape guard"):
        store.pull("gpu", 0.0)


def test_a_batch_whose_segment_is_missing_goes_back_untouched(store: DurableBroker) -> None:
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(10), 0.0)
    seg_id = next(iter(store.segs))
    hdr = store.segs.pop(seg_id)
    with pytest.raises(SegmentMissingError):
        store.pull("gpu", 0.0)
    assert store.view.ledger.items_queued == 10
    assert store.view.inflight == {}
    store.segs[seg_id] = hdr
    assert drain(store) == 10


def test_a_second_broker_on_the_same_data_dir_is_refused(store: DurableBroker) -> None:
    with pytest.raises(StoreLockedError):
        SyncStore(store.env.data_dir, 0.0)


def test_a_data_dir_of_another_layout_version_is_refused(tmp_path: Path) -> None:
    store = SyncStore(tmp_path / "d", 0.0)
    store.ingest(items(2), 0.0)
    store.env.write(lambda txn: store.meta.write(txn, store.env.dbs["meta"], fmt=1))
    store.close()
    with pytest.raises(StoreError, match="layout version 1"):
        SyncStore(tmp_path / "d", 0.0)


def test_a_data_dir_of_layout_3_is_taken_over_and_its_tombstones_dropped(
    tmp_path: Path,
) -> None:
    """Layout 3 wrote a tombstone beside every result; its stores open, read by their
    results, and lose the tombstone table."""
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=8))
    store.register("gpu", Contract(MODEL, 4, 4096, 4096), 0.0)
    store.ingest(items(20), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    assert store.complete(w.id, answer(w), 0.0) == 4

    def as_layout_3(txn: lmdb.Transaction) -> None:
        tomb = store.env.env.open_db(b"tomb", txn=txn)
        for k, _ in txn.cursor(db=store.env.dbs["results"]):
            txn.put(k, b"\x00\x00\x00\x01", db=tomb)
        rseq = store.env.dbs["rseq"]
        (first, run), = list(txn.cursor(db=rseq))  # layout 3 numbered each result in a row
        txn.delete(first, db=rseq)
        for j in range(len(run) // 12):
            txn.put(rseq_key(int.from_bytes(first, "big") + j), run[12 * j:12 * j + 12], db=rseq)
        store.meta.write(txn, store.env.dbs["meta"], fmt=3)

    store.env.write(as_layout_3)
    store.close()
    store = SyncStore(tmp_path / "d", 1.0, store=StoreConfig(segment_entries=8))
    assert (store.recovery.items, store.recovery.ledger_ok) == (16, True)
    assert store.meta.fmt == 4
    with store.env.env.begin() as txn, pytest.raises(lmdb.NotFoundError):
        store.env.env.open_db(b"tomb", txn=txn, create=False)
    store.register("gpu", Contract(MODEL, 4, 4096, 4096), 1.0)
    assert drain(store, consumer="gpu") == 16
    assert sorted(result_ids(store)) == sorted(f"i{k}" for k in range(20))
    assert [s for s, _ in store.results_since(2)] == list(range(3, 21))  # in a layout-3 row
    store.close()


def test_a_completion_meeting_an_existing_result_keeps_the_first(store: DurableBroker) -> None:
    """The one-put-at-a-time path: an entry that already has a result (which ingest's id
    check should make impossible) keeps it, and the rest of the batch still settles."""
    store.register("gpu", CONTRACT, 0.0)
    store.ingest(items(5), 0.0)
    w = store.pull("gpu", 0.0)
    assert w is not None
    first = store.view.inflight[w.id].batch.entries[0]
    stale = msgspec.msgpack.encode(ResultRecord("i0", MODEL, text="stale"))
    store.env.write(lambda txn: txn.put(entry_key_of(first.key), stale,
                                        db=store.env.dbs["results"]))
    assert store.complete(w.id, answer(w), 0.0) == 4
    assert store.meta.ledger.items_completed == 5
    assert store.view.ledger.difference() == (0, 0)
    assert [r.id for _, r in store.results_since(0)] == [f"i{k}" for k in range(1, 5)]
    kept = store.result("i0")
    assert kept is not None
    assert kept.text == "stale"
    assert store.segs == {}


def test_ingest_rows_are_the_items_placed_one_at_a_time(tmp_path: Path) -> None:
    """Ingest places and encodes a chunk a key at a time; what it writes is what placing the
    items one at a time gives: each item's lane and that lane's target once it was accepted
    (a shadow broker places them in arrival order), and its entry key from the segment rule
    (the newest segment grows for its own key, a segment takes `segment_entries`, new ones
    numbered in order of arrival)."""
    from fabricctl.core.broker import Broker
    from fabricctl.store.keys import StoredEntry, entry_decoder, entry_key, id_key

    limit = 8
    store = SyncStore(tmp_path / "d", 0.0, store=StoreConfig(segment_entries=limit))
    shadow = Broker()
    rng = random.Random(11)
    for c in range(25):
        now = float(c)
        keys = [(MODEL, SIG, 0), (MODEL, SIG + 1, 0), ("n", SIG, 0)]
        if c % 4 == 0:
            keys = keys[:1]  # a chunk of one key: the newest segment may grow
        picks = [rng.choice(keys) for _ in range(rng.randint(1, 40))]
        chunk = [Item(f"c{c}-{k}", m, sig, rng.randint(1, 3000), rng.randint(1, 64),
                      rng.randbytes(rng.randint(0, 40)), source=rng.randint(0, 2),
                      line=rng.randint(0, 99))
                 for k, (m, sig, _) in enumerate(picks)]
        next_seg, tail_seg = store.meta.next_seg, store._ingest.tail_seg
        tail = store.segs.get(tail_seg)
        runs: dict[tuple[str, int, int], list[int]] = {}
        want: dict[str, tuple[bytes, StoredEntry]] = {}
        for it in chunk:  # the rule, one item at a time
            p = shadow.place(it.model, it.signature, it.label, it.input_tokens, now)
            k = (it.model, it.signature, it.job)
            r = runs.get(k)
            if r is None or r[1] >= limit:
                if (r is None and tail is not None and tail.count < limit
                        and (tail.model, tail.signature, tail.job) == k):
                    r = [tail_seg, tail.count]
                    tail = None
                else:
                    r = [next_seg, 0]
                    next_seg += 1
                runs[k] = r
            want[it.id] = (entry_key(r[0], r[1]), StoredEntry(
                it.input_tokens, it.max_tokens, now, p.lane.id, p.lane.target, it.id,
                it.payload, it.source, it.line))
            r[1] += 1
        assert store.ingest(chunk, now) == []
        assert store.meta.next_seg == next_seg
        with store.env.read() as txn:
            for ident, (key, entry) in want.items():
                assert txn.get(id_key(0, ident.encode()), db=store.env.dbs["ids"]) == key
                raw = txn.get(key, db=store.env.dbs["data"])
                assert raw is not None and entry_decoder.decode(raw) == entry
    store.close()
