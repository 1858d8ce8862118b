"""The one engine interface a consumer drives: run a batch, pre-warm a shape, report stats.

A consumer never cares which engine it has. `run` returns exactly one ItemResult per item,
in the batch's order; an item longer than the batch's `max_input_len` gets an empty result
with finish_reason "length_exceeded". Engines raise `EngineError` (`fabricctl.errors`) for
failures of the whole batch that are worth retrying elsewhere (the broker puts the items
back).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from fabricctl.core.types import ItemResult, Prewarm, Work

# A consumer keeps this many batches of requests in a real server by default: with two, the
# server drained while the next batch's pull crossed the broker (measured with
# bench/vllm_bench.py --unpinned on a 2-core box: `fabricctl run` 0.63x the grouped client's
# req/s with two, 1.14-1.23x with three, the same prompt tokens computed and hit rate)
WINDOW_BATCHES = 3


def request_window(window: int, max_batch_size: int) -> int:
    """Requests a consumer keeps in a real engine at once: `window` when set (> 0), else the
    one default, `WINDOW_BATCHES` x the contract's max batch size (`[consumer] window`)."""
    return window if window > 0 else WINDOW_BATCHES * max(1, max_batch_size)


class EngineLimits(msgspec.Struct, frozen=True):
    """The engine's side of the contract; the consumer adds the model name."""

    max_batch_size: int
    max_batch_tokens: int
    max_input_len: int
    names: tuple[str, ...] = ()  # other names its server answers besides the model's (adapters)


class EngineCounters(msgspec.Struct, kw_only=True):
    """Why: the counters every engine keeps, named after vLLM's where vLLM has one."""

    prefix_cache_queries: int = 0  # vllm:prefix_cache_queries_total (tokens)
    prefix_cache_hits: int = 0  # vllm:prefix_cache_hits_total (tokens)
    prompt_tokens: int = 0  # vllm:prompt_tokens_total
    generation_tokens: int = 0  # vllm:generation_tokens_total
    graph_builds: int = 0
    batches: int = 0
    items: int = 0
    busy_s: float = 0.0


class SharedLoad(msgspec.Struct, frozen=True):
    """Why: a shared server's last reading, for `status` and `top` (`core.colocate`)."""

    capacity: int
    window: int
    live: int
    live_ttft_s: float | None = None
    target_s: float | None = None


class EngineStats(EngineCounters):
    """What an engine reports: whether it is simulated, its KV block size, its counters.

    The counters are keyword-only, so the encoded form (the heartbeat's dict, `top --json`)
    keeps `simulated` and `block_size` first.
    """

    simulated: bool
    block_size: int = 0
    shared: SharedLoad | None = None  # a server shared with live traffic: its last reading


class Engine(Protocol):
    """Why: one seam between a consumer and whatever actually runs the prompts."""

    name: str
    simulated: bool

    def limits(self) -> EngineLimits: ...

    async def run(self, work: Work) -> list[ItemResult]: ...

    async def prewarm(self, signal: Prewarm) -> None: ...

    def stats(self) -> EngineStats: ...

    async def close(self) -> None: ...
