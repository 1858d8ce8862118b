"""The cache-truth audit's evidence for one batch: what the engine's cache gave its prompts.

Contract: both functions return (queries, hits, achievable) prompt tokens for one batch, or
None when the evidence is not trustworthy. `result_evidence` sums the items' own answers
(one request per item: vLLM's per-request `prompt_tokens` and `cached_tokens` are exact,
whatever ran beside it). `cache_evidence` takes the deltas of the engine's prefix-cache
counters over the batch, true only when nothing else ran on that engine meanwhile.
Achievable is what the items' declared prefixes allow at the engine's block size, scaled
from the declared token counts to the engine's.
"""

from __future__ import annotations

from fabricctl.core.types import ItemResult, Work
from fabricctl.engines.base import EngineStats
from fabricctl.engines.blocks import (
    achievable_cached_tokens,
    decode_item_payload,
    prefix_tokens,
)


def result_evidence(work: Work, results: list[ItemResult], block: int
                    ) -> tuple[int, int, int] | None:
    """(queries, hits, achievable) prompt tokens of one batch from its items' own answers:
    one request per item, so the engine's per-request prompt and cached tokens are exact
    whatever ran beside it. None unless every item that ran reported both, or while the
    engine's block size is unknown (no /metrics read yet)."""
    if block <= 0:
        return None
    q = h = declared = achievable = 0
    for item, res in zip(work.items, results, strict=False):
        if res.finish_reason in ("length_exceeded", "error"):
            continue
        if res.prompt_tokens is None or res.cached_tokens is None:
            return None
        q += res.prompt_tokens
        h += res.cached_tokens
        declared += item.input_tokens
        payload = decode_item_payload(item)
        if payload is not None:
            achievable += achievable_cached_tokens(prefix_tokens(payload), item.input_tokens,
                                                   block)
    if q <= 0 or declared <= 0:
        return None
    return q, h, round(achievable * q / declared)


def cache_evidence(work: Work, before: EngineStats, after: EngineStats
                   ) -> tuple[int, int, int] | None:
    """(queries, hits, achievable) prompt tokens of one batch, for the cache-truth audit.

    Queries and hits are the engine's own counters' deltas over the batch (vLLM's
    prefix_cache_{queries,hits}_total); achievable is what the items' declared prefixes
    allow at the engine's block size, scaled from declared to the engine's token counts.
    """
    q = after.prefix_cache_queries - before.prefix_cache_queries
    h = after.prefix_cache_hits - before.prefix_cache_hits
    block = after.block_size
    if q <= 0 or h < 0 or block <= 0:
        return None
    declared = achievable = 0
    for item in work.items:
        payload = decode_item_payload(item)
        declared += item.input_tokens
        if payload is not None:
            achievable += achievable_cached_tokens(prefix_tokens(payload), item.input_tokens,
                                                   block)
    if declared <= 0:
        return None
    return q, h, round(achievable * q / declared)
