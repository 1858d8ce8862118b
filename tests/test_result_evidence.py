"""The cache evidence a consumer reports from its items' own answers (one request each)."""

from __future__ import annotations

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, ItemResult, Work
from fabricctl.supervisor.evidence import result_evidence


def _work() -> Work:
    payload = encode_payload(Payload(["S" * 40], "q", [64], 36))
    items = [Item(id=f"i{k}", model="m", signature=1, input_tokens=100, max_tokens=4,
                  payload=payload) for k in range(3)]
    return Work(id=1, model="m", signature=1, lane=0, epoch=1, pad_to=104, max_tokens=4,
                max_input_len=500, items=items)


def test_sums_the_engines_counts_and_scales_achievable_to_them() -> None:
    res = [ItemResult(id=f"i{k}", prompt_tokens=110, cached_tokens=32 * k) for k in range(3)]
    # achievable per item at block 32: 64 of its declared 100 tokens; scaled to 330 vs 300
    assert result_evidence(_work(), res, 32) == (330, 96, round(192 * 330 / 300))


def test_none_without_every_count_or_a_block_size() -> None:
    full = [ItemResult(id=f"i{k}", prompt_tokens=110, cached_tokens=0) for k in range(3)]
    assert result_evidence(_work(), full, 0) is None  # no /metrics read: block unknown
    partial = [*full[:2], ItemResult(id="i2", prompt_tokens=110)]
    assert result_evidence(_work(), partial, 32) is None
    skipped = [*full[:2], ItemResult(id="i2", finish_reason="error", error="HTTP 400: x")]
    assert result_evidence(_work(), skipped, 32) == (220, 0, round(128 * 220 / 200))
