"""Finished shapes are remembered and named one way: their records in the store's `shapes`
table (bounded, across restarts, an older data dir without the table still opens), and
`fabricctl.core.naming` (hex, label, unique hex prefix; ambiguity listed)."""

from __future__ import annotations

from pathlib import Path

import lmdb
from store_helpers import SyncStore
from test_store import db_entries, drain, items

from fabricctl.core.naming import describe, match
from fabricctl.core.snapshot import ShapeView
from fabricctl.store.durable import DurableBroker, StoreConfig

SIGS = (0xA1, 0xB2, 0xC3, 0xD4)


def run_shapes(s: DurableBroker, sigs: tuple[int, ...], t: float = 1.0) -> float:
    """One shape after another, each drained: every one but the last finishes."""
    for k, sig in enumerate(sigs):
        s.ingest(items(20, prefix=f"{sig:x}-{k}-", sig=sig), t)
        drain(s, t)
        t += 1
        s.tick(t)
        t += 1
    return t


def test_a_finished_shape_is_recorded_with_its_figures(tmp_path: Path) -> None:
    s = SyncStore(tmp_path / "data", 0.0)
    run_shapes(s, SIGS[:3])
    recs = s.finished_shapes()
    assert [r.signature for r in recs] == [0xB2, 0xA1]  # newest first; 0xC3 is still active
    a = recs[1]
    # 2 batches, under the line, but all of 0xA1's items in one run: short, not thrashing
    assert (a.state, a.finished_at, a.thrashed, a.thrash) == ("finished", 3.0, False, "")
    assert (a.batches, a.served_items, a.served_tokens, a.items) == (2, 20, 2000, 0)
    assert a.consumers == ["gpu"] and a.lanes is None
    assert [st for _, st in a.history] == ["staged", "active", "draining", "finished"]
    assert set(a.percentiles) == {"p50", "p90", "p99"}
    assert db_entries(s, "shapes") >= 1  # 0xA1's record rode on the next commit
    s.close()


def test_records_survive_a_restart_and_the_bound_drops_the_oldest(tmp_path: Path) -> None:
    cfg = StoreConfig(finished_shapes_kept=2)
    s = SyncStore(tmp_path / "data", 0.0, store=cfg)
    t = run_shapes(s, SIGS)  # 0xA1, 0xB2, 0xC3 finish; 0xC3's record is not committed yet
    assert [r.signature for r in s.finished_shapes()] == [0xC3, 0xB2]
    assert db_entries(s, "shapes") == 2  # 0xA1 and 0xB2 on disk, not yet trimmed
    s.close()  # the pending record is written on close, and the oldest dropped
    s = SyncStore(tmp_path / "data", t, store=cfg)
    assert [r.signature for r in s.finished_shapes()] == [0xC3, 0xB2]
    assert db_entries(s, "shapes") == 2
    run_shapes(s, (0xE5, 0xF6), t)  # 0xE5 finishes (0xD4 was done: nothing to restore)
    s.close()
    s = SyncStore(tmp_path / "data", t + 10, store=cfg)
    assert [r.signature for r in s.finished_shapes()] == [0xE5, 0xC3]  # numbered on
    s.close()


def test_a_data_dir_without_the_shapes_table_still_opens(tmp_path: Path) -> None:
    s = SyncStore(tmp_path / "data", 0.0)
    s.ingest(items(4), 0.0)
    s.close()
    env = lmdb.open(str(tmp_path / "data" / "fabric.lmdb"), max_dbs=10, lock=False)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"shapes", txn=txn), delete=True)
    env.close()
    s = SyncStore(tmp_path / "data", 1.0)
    assert s.finished_shapes() == [] and s.view.ledger.items_received == 4
    s.close()


def view(sig: int, label: str = "", model: str = "m") -> ShapeView:
    return ShapeView(model, sig, label, "finished", 1, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0,
                     {}, [])


def test_naming_by_hex_label_and_unique_prefix() -> None:
    a, b, c = view(0xABCD00000000000A, "alpha"), view(0xABCE00000000000B), view(0x1C, "gamma")
    pool = [a, b, c]
    assert match("abcd00000000000a", pool) == [a]
    assert match("0xABCD00000000000A", pool) == [a]
    assert match("1c", pool) == [c]  # a full number, leading zeros left out
    assert match("000000000000001c", pool) == [c]
    assert match("alpha", pool) == [a]
    assert match("abcd", pool) == [a]  # a unique prefix
    assert match("abc", pool) == [a, b]  # ambiguous: the caller lists them
    assert match("0xabc", pool) == []  # 0x: a number, never a prefix
    assert match("nothing", pool) == []
    assert describe(a) == "abcd00000000000a alpha (m)"


def test_naming_takes_the_first_of_a_key_and_keys_apart_by_model() -> None:
    live, old = view(0xAB, "x"), view(0xAB, "x")
    assert match("x", [live, old]) == [live]
    other = view(0xAB, "x", model="n")
    assert match("x", [live, old, other]) == [live, other]
