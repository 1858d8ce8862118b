"""A lane's FIFO of queued entries: a backlog kept as columns, 28 bytes an item, not an object.

Contract: `EntryQueue` behaves as a `deque[Entry]` for what a lane does with its queue:
`append`/`extend` at the back, `push_front` (entries put back ahead of everything, in their
order), `take(n)` off the front (`popleft`: one), `head_tokens(m)` (the first m entries'
tokens, for packing), indexing (`q[i]`, `q[i] = e`), iteration, `len`, truth, `clear`, and
`retain(keep)`, which drops, in order, the entries `keep` refuses and returns them. `head` is
the front entry's arrival (`inf` when empty), an attribute: the hot reads of a lane's oldest
wait take no call. How: the newest entries (at most `tail_max`) stay the objects they came
as, in a list, so a lane that is drained as fast as it fills never converts one; past that,
the older ones move, in one pass, into columns: key (8 bytes), tokens and max_tokens (4
each), arrival (8) and job (4). A boxed `Entry` in a deque cost ~150 bytes (issue 39: RAM
grew with the queue). An entry read back from the columns is a new `Entry` equal to the one
that went in; item objects (memory mode, the replay) are a list column made only when one
carries an item.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from typing import Any

from fabricctl.core.types import Entry, Item

TAIL_MAX = 64  # entries kept as objects at the back of a lane (RAM: lanes x this, bounded)
# The columns of a queue that has never settled: shared, never grown (only `_settle` grows a
# column, and it gives the queue its own first), so a lane of a few items allocates none.
_NO_KEY, _NO_INT, _NO_T = array("Q"), array("i"), array("d")
_COMPACT = 4096  # taken column slots reclaimed once past this many and half the columns
INF = float("inf")


class EntryQueue:
    """Why: a backlog of millions of queued items must not cost an object per item."""

    __slots__ = ("_h", "_items", "_job", "_key", "_max", "_t", "_tail", "_tok", "head",
                 "tail_max")

    def __init__(self, entries: Iterable[Entry] = (), tail_max: int = TAIL_MAX) -> None:
        self.tail_max = tail_max
        self._h = 0  # the columns' front: slots before it were taken
        self._key = _NO_KEY
        self._tok = self._max = self._job = _NO_INT
        self._t = _NO_T
        self._items: list[Item | None] | None = None  # parallel to the columns, when needed
        self._tail: list[Entry] = []  # the newest entries, behind the columns
        self.head = INF  # the front entry's arrival
        self.extend(entries)

    def __len__(self) -> int:
        return len(self._key) - self._h + len(self._tail)

    def __bool__(self) -> bool:
        return self.head != INF

    def __repr__(self) -> str:
        return f"EntryQueue({list(self)!r})"

    def _cols(self) -> int:
        return len(self._key) - self._h

    def _at(self, j: int) -> Entry:
        items = self._items
        return Entry(self._key[j], self._tok[j], self._max[j], self._t[j],
                     None if items is None else items[j], self._job[j])

    def _index(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("EntryQueue index out of range")
        return i

    def __getitem__(self, i: int) -> Entry:
        i, c = self._index(i), self._cols()
        return self._at(self._h + i) if i < c else self._tail[i - c]

    def __setitem__(self, i: int, e: Entry) -> None:
        i, c = self._index(i), self._cols()
        if i >= c:
            self._tail[i - c] = e
        else:
            j = self._h + i
            self._key[j], self._tok[j], self._max[j] = e.key, e.tokens, e.max_tokens
            self._t[j], self._job[j] = e.t, e.job
            if e.item is not None or self._items is not None:
                self._item_column()[j] = e.item
        self._reset_head()

    def __iter__(self) -> Iterator[Entry]:
        yield from map(self._at, range(self._h, len(self._key)))
        yield from self._tail

    def __reversed__(self) -> Iterator[Entry]:
        yield from reversed(self._tail)
        yield from map(self._at, range(len(self._key) - 1, self._h - 1, -1))

    def _reset_head(self) -> None:
        h = self._h
        self.head = (self._t[h] if h < len(self._key)
                     else self._tail[0].t if self._tail else INF)

    def _item_column(self) -> list[Item | None]:
        if self._items is None:
            self._items = [None] * len(self._key)
        return self._items

    def append(self, e: Entry) -> None:
        tail = self._tail
        tail.append(e)
        if self.head == INF:
            self.head = e.t
        if len(tail) > self.tail_max:
            self._settle()

    def extend(self, entries: Iterable[Entry]) -> None:
        tail = self._tail
        tail.extend(entries)
        if self.head == INF and tail:
            self.head = tail[0].t
        if len(tail) > self.tail_max:
            self._settle()

    def _settle(self) -> None:
        """The tail into the columns."""
        es = self._tail
        self._tail = []
        if self._key is _NO_KEY:
            self._key, self._t = array("Q"), array("d")
            self._tok, self._max, self._job = array("i"), array("i"), array("i")
        items = [e.item for e in es]
        if self._items is not None or any(it is not None for it in items):
            self._item_column().extend(items)  # (before the columns grow: made to their size)
        self._key.extend([e.key for e in es])
        self._tok.extend([e.tokens for e in es])
        self._max.extend([e.max_tokens for e in es])
        self._t.extend([e.t for e in es])
        self._job.extend([e.job for e in es])

    def push_front(self, entries: list[Entry]) -> None:
        """Put `entries` back ahead of everything queued, in their order."""
        if not entries:
            return
        if not self._cols():  # nothing in the columns: the tail takes them (one list insert)
            self._tail[0:0] = entries
            self._settle_if_long()
            self.head = entries[0].t
            return
        k, h = len(entries), self._h
        items = [e.item for e in entries]
        if self._items is not None or any(it is not None for it in items):
            col = self._item_column()  # (before the columns grow: made to their size)
            if k <= h:
                col[h - k:h] = items
            else:
                col[h:h] = items
        _put_front(self._key, [e.key for e in entries], h)
        _put_front(self._tok, [e.tokens for e in entries], h)
        _put_front(self._max, [e.max_tokens for e in entries], h)
        _put_front(self._t, [e.t for e in entries], h)
        _put_front(self._job, [e.job for e in entries], h)
        if k <= h:
            self._h = h - k
        self.head = entries[0].t

    def _settle_if_long(self) -> None:
        if len(self._tail) > self.tail_max:
            self._settle()

    def head_tokens(self, m: int) -> list[int]:
        """The tokens of the first `m` entries (fewer when fewer are queued)."""
        h = self._h
        out = self._tok[h:h + m].tolist()
        if len(out) < m and self._tail:
            out += [e.tokens for e in self._tail[:m - len(out)]]
        return out

    def take(self, count: int) -> list[Entry]:
        """The first `count` entries, off the queue, in order."""
        h, n = self._h, len(self._key)
        out: list[Entry] = []
        if h < n:
            end = min(h + count, n)
            items = self._items
            its: Iterable[Item | None] = repeat(None) if items is None else items[h:end]
            out = list(map(Entry, self._key[h:end], self._tok[h:end], self._max[h:end],
                           self._t[h:end], its, self._job[h:end]))
            if items is not None:
                items[h:end] = repeat(None, end - h)  # the taken items are the caller's now
            self._h = end
            self._compact()
        rest = count - len(out)
        if rest > 0 and self._tail:
            tail = self._tail
            out += tail[:rest]
            del tail[:rest]
        self._reset_head()
        return out

    def popleft(self) -> Entry:
        if not self:
            raise IndexError("pop from an empty EntryQueue")
        return self.take(1)[0]

    def clear(self) -> None:
        self._key = _NO_KEY
        self._tok = self._max = self._job = _NO_INT
        self._t = _NO_T
        self._items = None
        self._tail = []
        self._h = 0
        self.head = INF

    def retain(self, keep: Callable[[Entry], bool]) -> list[Entry]:
        """Keep, in order, the entries `keep` accepts; the others, in order, are returned."""
        kept: list[Entry] = []
        dropped: list[Entry] = []
        for e in self:
            (kept if keep(e) else dropped).append(e)
        if dropped:
            self.clear()
            self.extend(kept)
        return dropped

    def _columns(self) -> tuple[array[int], array[int], array[int], array[float], array[int]]:
        return self._key, self._tok, self._max, self._t, self._job

    def _compact(self) -> None:
        h = self._h
        if h == len(self._key):
            for col in self._columns():
                del col[:]
            self._items = None
            self._h = 0
        elif h > _COMPACT and 2 * h > len(self._key):
            for col in self._columns():
                del col[:h]
            if self._items is not None:
                del self._items[:h]
            self._h = 0


def _put_front(col: array[Any], vals: list[Any], h: int) -> None:
    """`vals` into `col` just before slot `h`: into the taken slots there when they suffice."""
    new = array(col.typecode, vals)
    if len(vals) <= h:
        col[h - len(vals):h] = new
    else:
        col[h:h] = new
