"""A replay workload: items with arrival times, their block hashes and prefix sizes.

Contract: `load(items, block_size, rate, seed)` turns parsed items into `ReplayItem`s sorted
by arrival: all at t = 0 when `rate` is 0 (an offline batch job), else Poisson arrivals at
`rate` items per simulated second from `seed`. Block hashes come from the payload exactly as
the simulated engine derives them, so every policy sees the same requests. `generated(...)`
builds one from the examples' generator; `distinct_prefix_tokens` is what a workload keeps
alive in a prefix cache.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from fabricctl.core.types import Item
from fabricctl.engines.blocks import decode_item_payload, item_blocks, prefix_tokens
from fabricctl.formats.reader import Parsed, parse_lines
from fabricctl.formats.workload import generate


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


def parse_items(lines: Iterable[bytes]) -> list[Item]:
    """Items from JSONL lines exactly as `fabricctl submit` reads them (bad lines dropped)."""
    return [p.item for p in parse_lines(lines) if isinstance(p, Parsed)]


def generated(block_size: int = 16, rate: float = 0.0, seed: int = 0, **workload: Any
              ) -> list[ReplayItem]:
    """A replay workload from `fabricctl.formats.workload.generate(**workload)` (the examples'
    generator), through the same JSONL reader as a real workload."""
    lines = [msgspec.json.encode(d) for d in generate(**workload)]
    return load(parse_items(lines), block_size, rate, seed)


def distinct_prefix_tokens(items: list[ReplayItem], block_size: int = 16) -> int:
    """The cacheable prefix tokens the workload keeps alive: its distinct full prefix blocks
    (shapes that share leading components, e.g. a system prompt, share those blocks)."""
    blocks: set[int] = set()
    done: set[tuple[str, int]] = set()
    for r in items:
        if r.shape not in done:
            done.add(r.shape)
            blocks.update(r.hashes[: r.prefix // block_size])
    return len(blocks) * block_size
