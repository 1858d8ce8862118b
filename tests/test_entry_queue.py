"""A lane's queue as columns behaves as the deque of entries it replaces."""

from __future__ import annotations

import sys
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.entry_queue import TAIL_MAX, EntryQueue
from fabricctl.core.types import Entry, Item


def entry(k: int, item: bool = False) -> Entry:
    it = Item(f"q{k}", "m", 7, 10 + k, 4) if item else None
    return Entry(k, 10 + k, 4 + k % 3, 0.5 * k, it, k % 5)


def test_fifo_with_put_back_at_the_front() -> None:
    q = EntryQueue((entry(k) for k in range(5)), tail_max=2)
    assert len(q) == 5 and q and q.head == 0.0
    assert q.head_tokens(3) == [10, 11, 12]
    taken = q.take(2)
    assert [e.key for e in taken] == [0, 1]
    assert taken[1] == entry(1)
    q.push_front(taken)
    assert [e.key for e in q] == [0, 1, 2, 3, 4]
    q.push_front([entry(9)])  # more than the slots taken before the front: inserted
    assert [e.key for e in q] == [9, 0, 1, 2, 3, 4]
    assert [e.key for e in reversed(q)] == [4, 3, 2, 1, 0, 9]
    assert q[-1] == entry(4) and q[0] == entry(9)


def test_items_ride_along_and_leave_with_their_entry() -> None:
    q = EntryQueue([entry(1, item=True), entry(2)], tail_max=0)
    assert q[0].item == Item("q1", "m", 7, 11, 4)
    assert q[1].item is None
    [first] = q.take(1)
    assert first.item is not None and q[0].item is None
    assert q.popleft() == entry(2)
    assert not q and len(q) == 0


def test_retain_returns_what_it_drops_in_order() -> None:
    q = EntryQueue(entry(k) for k in range(6))
    dropped = q.retain(lambda e: e.key % 2 == 0)
    assert [e.key for e in dropped] == [1, 3, 5]
    assert [e.key for e in q] == [0, 2, 4]


def test_a_queued_item_costs_a_few_dozen_bytes_not_an_object() -> None:
    n, base = 10_000, 1 << 32  # keys as the store makes them (segment << 32 | offset)
    entries = [Entry(base + k, 300 + k, 16, 1.5, None, 1) for k in range(n)]
    q = EntryQueue(entries)
    assert len(q._tail) <= TAIL_MAX  # the newest, as objects; the rest in columns
    columns = sum(sys.getsizeof(c) for c in q._columns())
    assert columns / (n - len(q._tail)) < 40  # 28 bytes of fields, plus the arrays' room
    boxed = deque(entries)  # what a lane held: the deque's slot, the Struct, its two ints
    objects = sys.getsizeof(boxed) + sum(sys.getsizeof(e) + sys.getsizeof(e.key)
                                         + sys.getsizeof(e.tokens) for e in boxed)
    assert objects / n > 120


ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 10**6), st.booleans()),
    st.tuples(st.just("take"), st.integers(0, 7)),
    st.tuples(st.just("put_back"), st.integers(0, 7)),
    st.tuples(st.just("retain"), st.integers(2, 4)),
    st.tuples(st.just("set"), st.integers(0, 50), st.integers(0, 10**6)),
    st.tuples(st.just("clear"),),
), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from([0, 1, 2, 5, 256]))
def test_behaves_as_a_deque_of_entries(script: list[tuple], tail_max: int) -> None:
    q, model = EntryQueue(tail_max=tail_max), deque[Entry]()
    taken: list[Entry] = []
    for n, op in enumerate(script):  # keys are unique, as the store's are
        if op[0] == "append":
            e = entry(op[1] * 1000 + n, item=op[2])
            q.append(e)
            model.append(e)
        elif op[0] == "take":
            got = q.take(op[1])
            want = [model.popleft() for _ in range(min(op[1], len(model)))]
            assert got == want
            taken = got
        elif op[0] == "put_back":
            back = taken[:op[1]]
            q.push_front(back)
            model.extendleft(reversed(back))
            taken = []
        elif op[0] == "retain":
            m = op[1]
            assert q.retain(lambda e, m=m: e.key % m != 0) == [e for e in model if e.key % m == 0]
            model = deque(e for e in model if e.key % m != 0)
        elif op[0] == "set" and model:
            i = op[1] % len(model)
            q[i] = model[i] = entry(op[2] * 1000 + n, item=True)
        elif op[0] == "clear":
            q.clear()
            model.clear()
        assert len(q) == len(model)
        assert list(q) == list(model)
        assert list(reversed(q)) == list(reversed(model))
        assert bool(q) == bool(model)
        assert len(q._tail) <= tail_max  # the rest are columns
        if model:
            assert q.head == model[0].t
            assert q.head_tokens(3) == [e.tokens for e in list(model)[:3]]
