"""Rolling lanes: the open rule at its exact boundaries, the free list, quiescing, starving."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.config import CoreConfig
from fabricctl.core.lanes import Lane, LaneSet
from fabricctl.core.types import Entry

_keys = itertools.count(1)


def put(ls: LaneSet, n: int, now: float = 0.0) -> Lane:
    """Assign an item of n tokens and queue it, as the broker does."""
    lane = ls.assign(n, now)
    lane.push(Entry(next(_keys), n, 16, now))
    return lane


def take(lane: Lane) -> Entry:
    """Dispatch the lane's oldest entry and settle it at once."""
    e = lane.queue.popleft()
    lane.tokens -= e.tokens
    return e


# -- the threshold ----------------------------------------------------------------------------


def test_threshold_with_no_lanes() -> None:
    assert LaneSet(CoreConfig()).threshold() == 0.01


def test_threshold_at_2048_lanes() -> None:
    ls = LaneSet(CoreConfig())
    for k in range(2048):
        ls.open_lane(k, 200 * (k + 1), 0.0)
    assert len(ls) == 2048
    assert ls.threshold() == pytest.approx(0.10)


def test_threshold_rises_linearly_with_small_cap() -> None:
    ls = LaneSet(CoreConfig(lanes_max=8))
    for k in range(4):
        ls.open_lane(k, 1000 * (k + 1), 0.0)
    assert ls.threshold() == pytest.approx(0.01 + 0.09 * 4 / 8)


# -- the open rule --------------------------------------------------------------------------------


def test_first_item_opens_a_lane_at_its_length() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 700)
    assert lane.id == 0
    assert lane.target == 700
    assert ls.targets() == [700]
    assert ls.counters.new_lanes == 1


def test_waste_15_above_threshold_reuses() -> None:
    ls = LaneSet(CoreConfig())
    first = put(ls, 1000)
    # waste 15, fraction 0.015 > threshold 0.01004: below the 16-token floor, so it fits
    assert put(ls, 985) is first
    assert ls.targets() == [1000]
    assert ls.counters.reuses == 1


def test_waste_16_above_threshold_opens() -> None:
    ls = LaneSet(CoreConfig())
    first = put(ls, 1000)
    lane = put(ls, 984)
    assert lane is not first
    assert lane.id == 1
    assert ls.targets() == [984, 1000]


def test_waste_128_below_threshold_reuses() -> None:
    ls = LaneSet(CoreConfig())
    first = put(ls, 20000)
    # fraction 128/20000 = 0.0064 < threshold: only the 128-token cap could open a lane
    assert put(ls, 19872) is first
    assert ls.targets() == [20000]


def test_waste_129_below_threshold_opens() -> None:
    ls = LaneSet(CoreConfig())
    first = put(ls, 20000)
    lane = put(ls, 19871)
    assert lane is not first
    assert ls.targets() == [19871, 20000]


def test_fraction_at_or_below_threshold_reuses_despite_floor() -> None:
    ls = LaneSet(CoreConfig())
    first = put(ls, 10000)
    # waste 100 >= 16 but fraction 0.01 <= threshold 0.01004 and 100 <= 128
    assert put(ls, 9900) is first


def test_joining_lower_neighbour_raises_its_target() -> None:
    ls = LaneSet(CoreConfig())
    low = put(ls, 1000)
    high = put(ls, 2000)
    # 1010 above the lower lane: raising it costs 10 tokens (0.0099), the upper one 990
    assert put(ls, 1010) is low
    assert low.target == 1010
    assert high.target == 2000
    assert ls.targets() == [1010, 2000]


def test_lower_neighbour_compared_on_fraction() -> None:
    ls = LaneSet(CoreConfig())
    low = put(ls, 1000)
    high = put(ls, 1050)
    # n = 1040: upper waste 10/1050 = 0.0095, lower 40/1040 = 0.038: the upper lane wins
    assert put(ls, 1040) is high
    assert ls.targets() == [1000, 1050]
    assert low.target == 1000


def test_item_above_every_lane_opens_when_lower_waste_is_large() -> None:
    ls = LaneSet(CoreConfig())
    put(ls, 1000)
    lane = put(ls, 1200)
    assert lane.target == 1200
    assert ls.targets() == [1000, 1200]


# -- the cap and the free list ----------------------------------------------------------------


def test_force_fit_at_small_cap() -> None:
    ls = LaneSet(CoreConfig(lanes_max=8))
    for k in range(8):
        put(ls, 1000 * (k + 1))
    assert len(ls) == 8
    lane = put(ls, 1500)  # would open a lane (waste 500), but the set is full
    assert len(ls) == 8
    assert ls.counters.force_fits == 1
    assert lane.target == 2000  # the upper lane: 500/2000 beats raising 1000 by 500/1500
    assert ls.targets() == [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]
    big = put(ls, 50000)
    assert big.target == 50000  # force-fit into the top lane raises its target
    assert ls.targets() == [1000, 2000, 3000, 4000, 5000, 6000, 7000, 50000]
    assert ls.counters.force_fits == 2


def test_force_fit_when_every_lane_is_quiescing() -> None:
    ls = LaneSet(CoreConfig(lanes_max=2))
    low = put(ls, 100, now=0.0)
    high = put(ls, 1000, now=0.0)
    assert ls.tick(5.0) == [low, high]
    assert ls.targets() == []
    lane = put(ls, 900, now=5.0)  # at the cap: the nearest quiescing lane is taken back
    assert lane is high
    assert lane.quiescing is False
    assert low.quiescing is True
    assert ls.targets() == [1000]
    assert len(ls) == 2
    assert ls.counters.force_fits == 1


def test_released_id_is_reused_before_a_new_one() -> None:
    ls = LaneSet(CoreConfig())
    lanes = [put(ls, 1000 * (k + 1)) for k in range(4)]
    assert [la.id for la in lanes] == [0, 1, 2, 3]
    for lane in (lanes[1], lanes[3]):
        take(lane)
        ls.release(lane)
    assert sorted(ls.lanes) == [0, 2]
    assert ls.targets() == [1000, 3000]
    assert put(ls, 10000).id == 3  # the free list is used first (last released first)
    assert put(ls, 20000).id == 1
    assert put(ls, 30000).id == 4  # then new ids
    assert ls.counters.recycled_ids == 2
    assert ls.counters.releases == 2


def test_release_needs_an_idle_lane() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 100)
    with pytest.raises(AssertionError):
        ls.release(lane)


# -- quiescing and starving ------------------------------------------------------------------------


def test_quiescing_exactly_at_five_seconds() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 100, now=10.0)
    assert ls.tick(14.999) == []
    assert lane.quiescing is False
    assert ls.tick(15.0) == [lane]
    assert lane.quiescing is True
    assert ls.targets() == []  # a quiescing lane takes no new item
    assert 0 in ls.lanes  # still holds its item
    fresh = put(ls, 100, now=15.0)
    assert fresh is not lane
    assert fresh.id == 1


def test_three_items_quiesce_four_do_not() -> None:
    ls = LaneSet(CoreConfig())
    three = put(ls, 100, now=0.0)
    for _ in range(2):
        assert put(ls, 100, now=0.0) is three
    four = put(ls, 5000, now=0.0)
    for _ in range(3):
        assert put(ls, 5000, now=0.0) is four
    assert len(three.queue) == 3
    assert len(four.queue) == 4
    assert ls.tick(5.0) == [three]
    assert four.quiescing is False
    assert ls.tick(100.0) == []
    assert four.quiescing is False


def test_quiescing_lane_returns_its_id_once_idle() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 100, now=0.0)
    ls.tick(5.0)
    assert lane.quiescing is True
    take(lane)
    lane.inflight = 1  # out with a consumer: not idle yet
    ls.tick(6.0)
    assert 0 in ls.lanes
    lane.inflight = 0
    ls.tick(7.0)
    assert ls.lanes == {}
    assert put(ls, 100, now=7.0).id == 0
    assert ls.counters.recycled_ids == 1


def test_empty_lane_quiesces_and_is_released_in_one_tick() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 100, now=0.0)
    take(lane)
    assert ls.tick(5.0) == [lane]
    assert ls.lanes == {}
    assert ls.counters.releases == 1


def test_assignment_resets_the_quiesce_clock() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 100, now=0.0)
    assert put(ls, 100, now=3.0) is lane
    assert ls.tick(7.999) == []
    assert ls.tick(8.0) == [lane]


def test_starving_strictly_after_thirty_seconds() -> None:
    ls = LaneSet(CoreConfig())
    put(ls, 100, now=0.0)
    put(ls, 5000, now=1.0)
    assert ls.starving(30.0) == 0
    assert ls.starving(30.001) == 1
    assert ls.starving(31.001) == 2


def test_starving_counts_the_oldest_item() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 100, now=0.0)
    put(ls, 100, now=20.0)
    assert ls.starving(30.001) == 1
    take(lane)
    assert ls.starving(30.001) == 0
    assert ls.starving(50.001) == 1


def test_waste_fraction_of_a_lane() -> None:
    ls = LaneSet(CoreConfig())
    lane = put(ls, 1000)
    put(ls, 990)
    assert lane.waste_fraction() == pytest.approx(1 - 1990 / 2000)
    assert Lane(9, 100, 0.0).waste_fraction() == 0.0


# -- properties -----------------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("assign"), st.integers(min_value=0, max_value=40000)),
    st.tuples(st.just("assign"), st.integers(min_value=1, max_value=2000)),
    st.tuples(st.just("take"), st.integers(min_value=0, max_value=10_000)),
    st.tuples(st.just("wait"), st.integers(min_value=1, max_value=7)),
)


def check_ops(cfg: CoreConfig, ops: list[tuple[str, int]]) -> None:
    ls = LaneSet(cfg)
    now = 0.0
    seen_target: dict[int, tuple[Lane, int]] = {}  # lane id -> (lane, last target seen)
    released: list[int] = []
    max_id = -1
    for op, arg in ops:
        if op == "assign":
            free_before = list(ls._free)
            lanes_before = set(ls.lanes)
            lane = put(ls, arg, now)
            assert lane.target >= arg
            assert not lane.quiescing
            if lane.id not in lanes_before:  # a lane opened
                if free_before:
                    assert lane.id == free_before[-1]  # a released id before a new one
                else:
                    assert lane.id == max_id + 1
                max_id = max(max_id, lane.id)
        elif op == "take":
            live = [la for la in ls.lanes.values() if la.queue]
            if live:
                take(live[arg % len(live)])
        else:
            now += arg
            before = set(ls.lanes)
            ls.tick(now)
            released.extend(before - set(ls.lanes))
        targets = ls.targets()
        assert targets == sorted(targets)
        assert len(ls) <= cfg.lanes_max
        assert all(0 <= i < cfg.lanes_max for i in ls.lanes)
        listed = [la for la in ls.lanes.values() if not la.quiescing]
        assert sorted(la.target for la in listed) == targets
        for lane_id, lane in ls.lanes.items():
            assert lane.id == lane_id
            prev = seen_target.get(lane_id)
            if prev is not None and prev[0] is lane:
                assert lane.target >= prev[1]  # no target ever falls
            seen_target[lane_id] = (lane, lane.target)
            assert lane.tokens == sum(e.tokens for e in lane.queue)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=120))
def test_lane_properties_default_cap(ops: list[tuple[str, int]]) -> None:
    check_ops(CoreConfig(), ops)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=120))
def test_lane_properties_small_cap(ops: list[tuple[str, int]]) -> None:
    check_ops(CoreConfig(lanes_max=8), ops)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=60))
def test_lane_properties_tiny_cap(ops: list[tuple[str, int]]) -> None:
    check_ops(CoreConfig(lanes_max=2), ops)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=100_000), max_size=200))
def test_assign_only_never_lowers_a_target(lengths: list[int]) -> None:
    ls = LaneSet(CoreConfig(lanes_max=8))
    for n in lengths:
        before = {lane.id: lane.target for lane in ls.lanes.values()}
        lane = put(ls, n)
        assert lane.target >= n
        for lane_id, target in before.items():
            assert ls.lanes[lane_id].target >= target
        assert ls.targets() == sorted(ls.targets())
        assert len(ls) <= 8


def lane_state(ls: LaneSet) -> list[tuple[int, int, float, bool]]:
    return [(la.id, la.target, la.last_assign, la.quiescing) for la in ls.lanes.values()]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=6000), max_size=40), max_size=6),
       st.sampled_from([2, 8, 2048]))
def test_assign_many_is_assign_in_order(rounds: list[list[int]], cap: int) -> None:
    one, many = LaneSet(CoreConfig(lanes_max=cap)), LaneSet(CoreConfig(lanes_max=cap))
    for k, ns in enumerate(rounds):  # each round a chunk, a tick between them
        now = 3.0 * k
        want, want_targets = [], []
        for n in ns:
            lane = one.assign(n, now)
            want.append(lane.id)
            want_targets.append(lane.target)  # its target once the item was accepted
        accepted: list[int] = []
        assert [la.id for la in many.assign_many(ns, now, accepted)] == want
        assert accepted == want_targets
        assert lane_state(many) == lane_state(one)
        assert many.targets() == one.targets()
        assert many.counters == one.counters
        one.tick(now + 6.0)
        many.tick(now + 6.0)
