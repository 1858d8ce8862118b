"""The simulated GPU's per-request state and counters (see simgpu.py for the scheduler).

Contract: a `SimRequest` is created by `SimGPU.add` and mutated only by the SimGPU; callers
read `finish_time`, `finish_reason`, `first_token_time`, `out`, `cached_tokens` and
`latency`. `SimCounters` only grows: `EngineCounters` (named after vLLM's metrics where
vLLM has one) plus the simulator's own.
`item_result` turns a finished request into an ItemResult: finish_reason "length" (output
stops at max_tokens, as vLLM reports it), a deterministic text from `sim_text` (up to 16
words picked by the hash of the id), the tokens generated and the cached tokens.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import xxhash

from fabricctl.core.types import ItemResult
from fabricctl.engines.base import EngineCounters
from fabricctl.engines.prefix_cache import CacheSeq

LENGTH_EXCEEDED = "length_exceeded"
_WORDS = (
    "alpha", "bravo", "cargo", "delta", "echo", "fabric", "gamma", "harbor",
    "index", "joule", "kilo", "lane", "metric", "nexus", "orbit", "prefix",
)  # fmt: skip
TEXT_WORDS_MAX = 16


def sim_text(rid: str, tokens: int) -> str:
    """Deterministic stand-in output: up to 16 words chosen by the hash of the request id."""
    h = xxhash.xxh3_64_intdigest(rid.encode("utf-8"))
    n = min(tokens, TEXT_WORDS_MAX)
    return " ".join(_WORDS[(h >> (4 * i)) & 15] for i in range(n))


class SimCounters(EngineCounters):
    """Why: what the simulated GPU did: every engine's counters plus the simulator's own."""

    preemptions: int = 0  # vllm:num_preemptions_total
    requests: int = 0  # finished requests, length_exceeded included
    length_exceeded: int = 0
    prewarms: int = 0
    steps: int = 0


class SimRequest:
    """Why: one request's scheduling state and timings on the simulated GPU."""

    __slots__ = (
        "admitted", "arrival", "cached_tokens", "finish_reason", "finish_time",
        "first_token_time", "key", "max_out", "num_computed", "out", "preemptions",
        "prompt_len", "rid", "seq", "tag",
    )  # fmt: skip

    def __init__(
        self, rid: str, hashes: Sequence[int], prompt_len: int, max_out: int,
        key: Hashable | None, arrival: float, tag: object = None,
    ) -> None:  # fmt: skip
        self.rid = rid
        self.seq = CacheSeq(hashes)
        self.prompt_len = prompt_len
        self.max_out = max_out
        self.key = key
        self.arrival = arrival
        self.tag = tag  # the caller's own data (e.g. the Item)
        self.num_computed = 0  # tokens whose KV is written
        self.out = 0  # tokens generated
        self.cached_tokens = 0  # prefix-cache hit at first admission
        self.admitted = False
        self.preemptions = 0
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason = ""

    @property
    def done(self) -> bool:
        return self.finish_time is not None

    @property
    def latency(self) -> float:
        """Arrival to completion, in simulated seconds (nan while unfinished)."""
        return math.nan if self.finish_time is None else self.finish_time - self.arrival


def item_result(item_id: str, r: SimRequest | None) -> ItemResult:
    """The ItemResult of a finished request; None stands for an item refused as too long."""
    if r is None:
        return ItemResult(id=item_id, text="", finish_reason=LENGTH_EXCEEDED, tokens_out=0)
    return ItemResult(
        id=item_id,
        text=sim_text(item_id, r.out),
        finish_reason=r.finish_reason,
        tokens_out=r.out,
        cached_tokens=r.cached_tokens,
    )
