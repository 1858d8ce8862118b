"""Packing a lane's queue into one batch for a consumer's four-integer contract.

Contract: items leave in arrival order; pad_to is the longest taken item rounded up to a
multiple of `pad_multiple`; items are added until the batch holds `max_batch_size` items or
one more would make `count * pad_to > max_batch_tokens`. A batch always holds at least one
item, so a lone item over the budget still goes out. What does not fit stays at the front of
the queue in its original order. No input-length filtering happens here: an item longer than
the contract's max input is marked by the batch and refused by the engine. `pack_counted`
is `pack` that also returns the taken entries' input tokens (the broker's dispatch needs
their sum).

How: the rule is item by item, but its stopping point is monotone — the padded length of the
first k items never falls as k grows, so once one more item breaks the budget every longer
prefix does too. So the candidates' lengths are read in one slice of the queue's tokens
column, a batch of all of them is checked first, and otherwise the count is found by bisection
(each step scanning only the part not known to fit, in C); the entries leave the queue in one
`take`: the Python work per batch is O(log n) steps.
"""

from __future__ import annotations

from fabricctl.core.entry_queue import EntryQueue
from fabricctl.core.types import Entry


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple (n >= 0)."""
    return -(-n // multiple) * multiple


def pack(
    queue: EntryQueue, max_batch_size: int, max_batch_tokens: int, pad_multiple: int = 8
) -> tuple[list[Entry], int]:
    """Take the next batch off the front of `queue`; returns (entries, pad_to)."""
    entries, pad_to, _ = pack_counted(queue, max_batch_size, max_batch_tokens, pad_multiple)
    return entries, pad_to


def pack_counted(
    queue: EntryQueue, max_batch_size: int, max_batch_tokens: int, pad_multiple: int = 8
) -> tuple[list[Entry], int, int]:
    """`pack`, also returning the sum of the taken entries' tokens: (entries, pad_to, tokens)."""
    pm = pad_multiple
    size = max_batch_size if max_batch_size >= 0 else len(queue)  # < 0: no limit, as the rule
    if not queue or size == 0:
        return [], pm, 0  # even an empty batch takes one pad multiple
    first = queue.head_tokens(1)[0]
    pad0 = -(-first // pm) * pm if first > pm else pm
    # pad_to never falls below pad0, so no batch holds more than budget // pad0 items
    m = min(len(queue), size, max(1, max_batch_tokens // pad0))
    toks = queue.head_tokens(m)
    top = max(toks)
    pad_to = -(-top // pm) * pm if top > pm else pm
    count = m
    if m > 1 and m * pad_to > max_batch_tokens:
        # the first k in [1, m) whose item breaks the budget: bisection, each step scanning
        # only the part past the prefix known to fit (whose longest item is `peak`)
        lo, hi, peak = 1, m, first
        while lo < hi:
            mid = (lo + hi) // 2
            p = max(peak, max(toks[lo:mid + 1]))  # the longest of the first mid + 1
            pad = -(-p // pm) * pm if p > pm else pm
            if (mid + 1) * pad > max_batch_tokens:
                hi = mid
            else:
                lo, peak = mid + 1, p
        count = lo
        pad_to = -(-peak // pm) * pm if peak > pm else pm
    tokens = sum(toks) if count == m else sum(toks[:count])
    return queue.take(count), pad_to, tokens
