"""The replay's oracle: placement by work (LPT, big shapes split), one shape at a time per
GPU, stealing when idle; every item runs once, and fabric is measured against it."""

from __future__ import annotations

from fabricctl.replay.oracle import place, shape_work
from fabricctl.replay.run import costs_for, limits_for, replay
from fabricctl.replay.workload import generated


def test_place_balances_shapes_by_work_and_splits_the_big_one() -> None:
    work = {("m", 1): 100, ("m", 2): 60, ("m", 3): 40}
    assert place(work, 2) == {("m", 1): [0], ("m", 2): [1], ("m", 3): [1]}
    big = {("m", 1): 300, ("m", 2): 10, ("m", 3): 10}
    homes = place(big, 2)
    assert homes[("m", 1)] == [0, 1]  # over the fair share of 160: split over both
    assert place(work, 1) == {s: [0] for s in work}


def test_shape_work_counts_each_prefix_once() -> None:
    items = generated(items=40, shapes=2, prefix_tokens=256, seed=3, median_tokens=32,
                      max_tokens=4)
    work = shape_work(items)
    assert set(work) == {r.shape for r in items}
    for s, w in work.items():
        mine = [r for r in items if r.shape == s]
        own = sum(r.tokens - r.prefix + r.item.max_tokens for r in mine)
        assert w == own + max(r.prefix for r in mine)


def test_the_oracle_runs_every_item_once_and_fabric_is_close_to_it() -> None:
    items = generated(items=600, shapes=24, prefix_tokens=1024, seed=5, median_tokens=64,
                      max_tokens=8)
    costs = costs_for(items, pressure=2.0, max_num_seqs=64)
    out = replay(items, ["fabric", "round-robin", "oracle"], 2, costs, limits_for(items, costs))
    assert out["oracle"].items == 600 and out["fabric"].items == 600
    assert out["oracle"].midstream_switches == 0 and out["oracle"].prewarms == 0
    assert out["oracle"].tokens_per_s > out["round-robin"].tokens_per_s
    assert out["fabric"].tokens_per_s >= 0.8 * out["oracle"].tokens_per_s
