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
    taken: list[Entry] = []
    longest = 0
    while queue and len(taken) < max_batch_size:
        n = queue[0].tokens
        m = n if n > longest else longest
        if taken and (len(taken) + 1) * round_up(m, pad_multiple) > max_batch_tokens:
            break
        taken.append(queue.popleft())
        longest = m
    return taken, max(round_up(longest, pad_multiple), pad_multiple)
