"""A vLLM server's /metrics, reduced to what fabricctl reads: cache counters and load gauges.

Contract: `parse_metrics(text)` reads Prometheus text into a `MetricsSample`: the counters of
`COUNTERS` (summed over label sets, named as `EngineStats` fields), the block size from
`vllm:cache_config_info`, the process start time (a restart), and the running and waiting
requests (`GAUGES`, None when the server shows none); unknown series are ignored.
`counter_delta` is a counter's increase, a decrease read as a restart.
"""

from __future__ import annotations

import msgspec
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}
GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}


class MetricsSample(msgspec.Struct):
    """One scrape of a server's /metrics, reduced to what cache accounting needs."""

    counters: dict[str, float]  # EngineStats field name -> value summed over label sets
    block_size: int | None = None
    start_time: float | None = None
    running: int | None = None  # vllm:num_requests_running (a shared server's load)
    waiting: int | None = None  # vllm:num_requests_waiting


def parse_metrics(text: str) -> MetricsSample:
    """Parse Prometheus text into the counters fabricctl tracks (unknown series ignored)."""
    counters = dict.fromkeys(COUNTERS.values(), 0.0)
    sample = MetricsSample(counters=counters)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in COUNTERS:
                counters[COUNTERS[s.name]] += s.value
            elif s.name == "vllm:cache_config_info" and s.labels.get("block_size"):
                sample.block_size = int(s.labels["block_size"])
            elif s.name == "process_start_time_seconds":
                sample.start_time = s.value
            elif s.name in GAUGES:
                now = getattr(sample, GAUGES[s.name]) or 0
                setattr(sample, GAUGES[s.name], now + int(s.value))
    return sample


def counter_delta(prev: float | None, cur: float) -> float:
    """Increase of a counter since `prev`; a decrease means it was reset (restart)."""
    if prev is None:
        return 0.0
    return cur - prev if cur >= prev else cur
