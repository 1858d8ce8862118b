"""A replay workload: items with arrival times, their block hashes and prefix sizes.

Contract: `load(items, block_size, rate, seed)` turns parsed items into `ReplayItem`s sorted
by arrival: all at t = 0 when `rate` is 0 (an offline batch job), else Poisson arrivals at
`rate` items per simulated second from `seed`. Block hashes come from the payload exactly as
the simulated engine derives them, so every policy sees the same requests.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from fabricctl.core.types import Item
from fabricctl.engines.blocks import decode_item_payload, item_blocks, prefix_tokens


@dataclass(slots=True)
class ReplayItem:
    """Why: one request as every policy sees it, hashed once."""

    item: Item
    arrival: float
    hashes: list[int]
    tokens: int
    prefix: int  # tokens of its shape's cacheable components

    @property
    def shape(self) -> tuple[str, int]:
        return (self.item.model, self.item.signature)


def load(items: Iterable[Item], block_size: int, rate: float = 0.0, seed: int = 0
         ) -> list[ReplayItem]:
    rng = random.Random(seed)
    t = 0.0
    out: list[ReplayItem] = []
    for item in items:
        if rate > 0:
            t += rng.expovariate(rate)
        chain = item_blocks(item, block_size)
        payload = decode_item_payload(item)
        out.append(ReplayItem(item, t, chain.hashes, chain.tokens,
                              prefix_tokens(payload) if payload else 0))
    return out


def distinct_prefix_tokens(items: list[ReplayItem]) -> int:
    """The cacheable prefix tokens the workload keeps alive: one prefix per shape."""
    seen: dict[tuple[str, int], int] = {}
    for r in items:
        seen[r.shape] = r.prefix
    return sum(seen.values())
