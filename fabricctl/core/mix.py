"""A job's endpoint mix: how many of its items go to each endpoint, counted at ingest.

Contract: `endpoint_of(item)` is the endpoint an item's request goes to, as a `Source` value
(COMPLETIONS .. RESPONSES), read from the item's own fields and never from its payload (the
broker is content-blind): `Item.endpoint`, which the reader sets from the line it parsed (a
native line's `endpoint`, else `messages` for chat, `prompt` for completions; an OpenAI line's
`url`), else `Item.source` (an OpenAI line's url names its endpoint); 0 (`UNKNOWN`) for an
item whose producer stated neither (an `Item` built by hand, or sent by an older producer).
`ENDPOINT_NAMES` names them (each `core.endpoints` entry's `name`, and `unknown`): the keys
of `JobRecord.endpoints` and the values of the metrics' `endpoint` label.
`count_endpoints(items)` counts a group of items by endpoint number; `add_endpoints(job,
counts)` adds such counts to a job's record (the store does, in the commit that stores the
items: each item once); `mix(counts)` lists a record's counts as `MixPart`s (name, items,
share of the counted items), most items first.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from fabricctl.core.endpoints import ENDPOINTS
from fabricctl.core.jobs import JobRecord
from fabricctl.core.types import Item

UNKNOWN = 0  # no endpoint stated (Source.NATIVE's number: a native line with no endpoint)
ENDPOINT_NAMES: dict[int, str] = {
    UNKNOWN: "unknown", **{spec.source: spec.name for spec in ENDPOINTS}}
ENDPOINT_ORDER = [*list(ENDPOINT_NAMES.values())[1:], "unknown"]  # how listings order them


class MixPart(msgspec.Struct, frozen=True):
    """Why: `jobs show`, `status` and `top` print a job's mix from the same parts."""

    endpoint: str
    items: int
    share: float  # of the items counted by endpoint


def endpoint_of(item: Item) -> int:
    """The endpoint of an item's request (a `Source` value), or `UNKNOWN`."""
    return item.endpoint or item.source


def count_endpoints(items: Iterable[Item]) -> Counter[int]:
    """Items per endpoint number (`endpoint_of`); runs at ingest, once per item."""
    items = list(items)
    counts = Counter([it.endpoint for it in items])  # the reader sets it on every item it builds
    unstated = counts.pop(UNKNOWN, 0)
    if unstated:  # hand-built items: an OpenAI source still names the endpoint
        counts.update(it.source for it in items if not it.endpoint)
    return counts


def add_endpoints(job: JobRecord, counts: dict[int, int]) -> None:
    """Add items per endpoint number to the job's `endpoints` (kept by name)."""
    if not counts:
        return
    have = dict(job.endpoints)
    for n, k in counts.items():
        name = ENDPOINT_NAMES.get(n, "unknown")
        have[name] = have.get(name, 0) + k
    job.endpoints = have


def mix(counts: dict[str, int]) -> list[MixPart]:
    """The parts of a mix with items, most first (ties in `ENDPOINT_ORDER`)."""
    total = sum(counts.values())
    rank = {name: i for i, name in enumerate(ENDPOINT_ORDER)}
    parts = sorted(((n, k) for n, k in counts.items() if k > 0),
                   key=lambda nk: (-nk[1], rank.get(nk[0], len(rank))))
    return [MixPart(n, k, k / total) for n, k in parts]
