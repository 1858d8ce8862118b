"""Packing a lane's queue into one batch for a consumer's four-integer contract.

Contract: items leave in arrival order; pad_to is the longest taken item rounded up to a
multiple of `pad_multiple`; items are added until the batch holds `max_batch_size` items or
one more would make `count * pad_to > max_batch_tokens`. A batch always holds at least one
item, so a lone item over the budget still goes out. What does not fit stays at the front of
the queue in its original order. No input-length filtering happens here: an item longer than
the contract's max input is marked by the batch and refused by the engine.
"""

from __future__ import annotations

from collections import deque

from fabricctl.core.types import Entry


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple (n >= 0)."""
    return -(-n // multiple) * multiple


def pack(
    queue: deque[Entry], max_batch_size: int, max_batch_tokens: int, pad_multiple: int = 8
) -> tuple[list[Entry], int]:
    """Take the next batch off the front of `queue`; returns (entries, pad_to)."""
    count = 0
    pad_to = pad_multiple  # even an empty item takes one pad multiple, in the budget too
    for entry in queue:  # decide first, then pop: a peek costs less than a pop and a put-back
        if count == max_batch_size:
            break
        n = entry.tokens
        padded = round_up(n, pad_multiple) if n > pad_to else pad_to
        if count and (count + 1) * padded > max_batch_tokens:
            break
        pad_to = padded
        count += 1
    return [queue.popleft() for _ in range(count)], pad_to
