"""The figures a replay reports per policy, and the table that shows them.

Contract: tokens/s = (prompt + generated tokens) / makespan; KV hit rate = cached prompt
tokens / prompt tokens of the workload's requests (pre-warm requests excluded); achievable =
every cacheable block hit except one prefill of each shape's prefix on each GPU that served
it; shape switches per GPU = shape runs - 1 on that GPU, mid-stream = runs - distinct shapes
(a GPU that returns to a shape left it while it still had work); latency from arrival to
finish. Every figure is simulated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from fabricctl.engines.blocks import achievable_cached_tokens

if TYPE_CHECKING:
    from fabricctl.replay.sim import Simulation


class PolicyResult(msgspec.Struct):
    """One policy's row (all simulated)."""

    policy: str
    items: int
    tokens_per_s: float
    makespan_s: float
    kv_hit_rate: float
    kv_hit_achievable: float
    switches_per_gpu: float
    midstream_switches: int
    padding_waste: float
    graph_builds: int
    preemptions: int
    thrash_events: int
    p50_latency_s: float
    p99_latency_s: float


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def summarise(sim: Simulation) -> PolicyResult:
    bs = sim.costs.block_size
    prompt = gen = hits = 0
    lat = []
    start = min((r.arrival for r, _ in sim.finished), default=0.0)
    end = max((q.finish_time for _, q in sim.finished), default=0.0)
    achievable = 0
    prefixes: dict[tuple[str, int], int] = {}
    for r, q in sim.finished:
        prompt += q.prompt_len
        gen += q.out
        hits += q.cached_tokens
        lat.append(q.finish_time - r.arrival)
        achievable += achievable_cached_tokens(r.prefix, q.prompt_len, bs)
        prefixes[r.shape] = r.prefix
    achievable -= sum(prefixes.get(shape, 0) // bs * bs for shape, _ in sim.served)
    runs = [len(seq) for seq in sim.runs]
    distinct = [len(set(seq)) for seq in sim.runs]
    makespan = max(end - start, 1e-9)
    fig = sim.policy.figures()
    return PolicyResult(
        policy=sim.policy.name, items=len(sim.finished),
        tokens_per_s=round((prompt + gen) / makespan, 1), makespan_s=round(makespan, 3),
        kv_hit_rate=round(hits / prompt, 4) if prompt else 0.0,
        kv_hit_achievable=round(max(0, achievable) / prompt, 4) if prompt else 0.0,
        switches_per_gpu=round(sum(max(0, n - 1) for n in runs) / len(runs), 2),
        midstream_switches=sum(n - d for n, d in zip(runs, distinct, strict=True)),
        padding_waste=round(fig["padding_waste"], 4),
        graph_builds=sum(g.counters.graph_builds for g in sim.gpus),
        preemptions=sum(g.counters.preemptions for g in sim.gpus),
        thrash_events=int(fig["thrash_events"]),
        p50_latency_s=round(_pct(lat, 50), 3), p99_latency_s=round(_pct(lat, 99), 3),
    )
