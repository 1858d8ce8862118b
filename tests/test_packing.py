"""Packing a lane's queue to a consumer's contract."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.entry_queue import EntryQueue
from fabricctl.core.lanes import Lane
from fabricctl.core.packing import pack, pack_counted, round_up
from fabricctl.core.types import Entry


def queue_of(lengths: list[int]) -> EntryQueue:
    return EntryQueue(Entry(k, n, 32, float(k)) for k, n in enumerate(lengths))


def test_round_up() -> None:
    assert round_up(0, 8) == 0
    assert round_up(1, 8) == 8
    assert round_up(8, 8) == 8
    assert round_up(9, 8) == 16


def test_pads_to_the_longest_item_in_the_batch_not_the_queue() -> None:
    q = queue_of([100, 90, 101, 5000])
    entries, pad_to = pack(q, 3, 1_000_000)
    assert [e.tokens for e in entries] == [100, 90, 101]
    assert pad_to == 104
    assert [e.tokens for e in q] == [5000]


def test_budget_is_in_padded_tokens() -> None:
    q = queue_of([60, 60, 60, 60])
    entries, pad_to = pack(q, 256, 192)  # 3 x 64 = 192 fits, 4 x 64 would not
    assert len(entries) == 3
    assert pad_to == 64
    assert len(q) == 1


def test_a_longer_item_that_breaks_the_budget_stays_at_the_front() -> None:
    q = queue_of([10, 10, 10, 200, 10])
    entries, pad_to = pack(q, 256, 400)  # 4 x 200 = 800 > 400
    assert [e.key for e in entries] == [0, 1, 2]
    assert pad_to == 16
    assert [e.key for e in q] == [3, 4]


def test_lone_oversized_item_still_goes_out() -> None:
    q = queue_of([9000, 10])
    entries, pad_to = pack(q, 256, 4096)
    assert [e.key for e in entries] == [0]
    assert pad_to == 9000
    assert [e.key for e in q] == [1]


def test_max_batch_size() -> None:
    q = queue_of([8] * 10)
    entries, pad_to = pack(q, 4, 1_000_000)
    assert [e.key for e in entries] == [0, 1, 2, 3]
    assert pad_to == 8
    assert [e.key for e in q] == [4, 5, 6, 7, 8, 9]


def test_zero_token_items_pad_to_eight_within_budget() -> None:
    q = queue_of([0] * 10)
    entries, pad_to = pack(q, 256, 32)
    assert pad_to == 8
    assert len(entries) == 4


def test_other_pad_multiple() -> None:
    q = queue_of([17, 3])
    entries, pad_to = pack(q, 256, 1000, pad_multiple=16)
    assert len(entries) == 2
    assert pad_to == 32


def test_overflow_put_back_in_front_in_order() -> None:
    lane = Lane(0, 100, 0.0)
    for e in queue_of([10, 20, 30, 40, 50]):
        lane.push(e)
    entries, _ = pack(lane.queue, 3, 1_000_000)
    lane.tokens -= sum(e.tokens for e in entries)
    assert [e.key for e in lane.queue] == [3, 4]
    lane.push_front(entries)
    assert [e.key for e in lane.queue] == [0, 1, 2, 3, 4]
    assert lane.tokens == 150


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=20000),
)
def test_pack_properties(lengths: list[int], max_size: int, max_tokens: int) -> None:
    q = queue_of(lengths)
    entries, pad_to = pack(q, max_size, max_tokens)
    n = len(entries)
    assert 1 <= n <= max_size
    # arrival order: the batch is a prefix, the rest stays in order at the front
    assert [e.key for e in entries] == list(range(n))
    assert [e.key for e in q] == list(range(n, len(lengths)))
    # pad_to: a multiple of 8, the batch's longest item rounded up (never the queue's)
    assert pad_to % 8 == 0
    assert pad_to >= 8
    assert all(e.tokens <= pad_to for e in entries)
    assert pad_to == max(round_up(max(e.tokens for e in entries), 8), 8)
    # the padded-token budget holds except for a lone oversized item
    if n > 1:
        assert n * pad_to <= max_tokens
    # nothing that fits was left behind
    if q and n < max_size:
        longest = max(pad_to, round_up(q[0].tokens, 8))
        assert (n + 1) * longest > max_tokens


def pack_item_by_item(queue: EntryQueue, max_batch_size: int, max_batch_tokens: int,
                      pad_multiple: int = 8) -> tuple[list[Entry], int]:
    """The contract's rule, one item at a time (what `pack` computes by bisection)."""
    count = 0
    pad_to = pad_multiple
    for entry in queue:
        if count == max_batch_size:
            break
        n = entry.tokens
        padded = round_up(n, pad_multiple) if n > pad_to else pad_to
        if count and (count + 1) * padded > max_batch_tokens:
            break
        pad_to = padded
        count += 1
    return [queue.popleft() for _ in range(count)], pad_to


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=3000), max_size=300),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=-5, max_value=70000),
    st.sampled_from([1, 8, 16]),
)
def test_pack_is_the_item_by_item_rule(lengths: list[int], max_size: int, max_tokens: int,
                                       multiple: int) -> None:
    fast, slow = queue_of(lengths), queue_of(lengths)
    entries, pad_to, tokens = pack_counted(fast, max_size, max_tokens, multiple)
    want, want_pad = pack_item_by_item(slow, max_size, max_tokens, multiple)
    assert [e.key for e in entries] == [e.key for e in want]
    assert pad_to == want_pad
    assert tokens == sum(e.tokens for e in want)
    assert [e.key for e in fast] == [e.key for e in slow]
