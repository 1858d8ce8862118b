"""The simulated GPU (continuous batching, costs, graphs) and the SimEngine protocol face."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import signature
from fabricctl.core.types import Item, Prewarm, Work
from fabricctl.engines.base import Engine, EngineLimits
from fabricctl.engines.prefix_cache import PrefixCache
from fabricctl.engines.sim import SimCosts, SimEngine, SimGPU, item_blocks
from fabricctl.engines.simbatch import run_work
from fabricctl.errors import EngineError, UsageError

SMALL = SimCosts(block_size=16, num_blocks=40, max_num_seqs=8, max_num_batched_tokens=256)


def make_item(
    iid: str, comps: list[str], comp_tokens: list[int], prompt_tokens: int, max_tokens: int = 4,
    **params: object,
) -> Item:
    """An item whose request runs to max_tokens (ignore_eos) unless `params` say otherwise."""
    body = msgspec.json.encode({"ignore_eos": True, **params, "max_tokens": max_tokens})
    payload = Payload(comps, f"prompt of {iid}", comp_tokens, prompt_tokens, body=body)
    total = sum(comp_tokens) + prompt_tokens
    return Item(iid, "m", signature(comps), total, max_tokens, encode_payload(payload))


def make_work(
    items: list[Item],
    *,
    lane: int = 0,
    epoch: int = 1,
    max_input_len: int = 8192,
    max_tokens: int = 0,
) -> Work:
    return Work(
        1, "m", items[0].signature if items else 0, lane, epoch, 0, max_tokens, max_input_len, items
    )


def counters(gpu: SimGPU) -> dict:
    return msgspec.structs.asdict(gpu.counters)


# --- batch mode ---------------------------------------------------------------------------------


def test_batch_results_in_order_with_length_exceeded() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    items = [make_item(f"i{k}", ["S"], [48], 20 + 10 * k, max_tokens=3 + k) for k in range(5)]
    items.insert(2, make_item("big", ["S"], [48], 500))  # input 548 > work limit 300
    results, seconds = run_work(gpu, make_work(items, max_input_len=300))
    assert [r.id for r in results] == ["i0", "i1", "big", "i2", "i3", "i4"]
    big = results[2]
    assert (big.text, big.finish_reason, big.tokens_out, big.cached_tokens) == (
        "",
        "length_exceeded",
        0,
        None,
    )
    assert [r.tokens_out for r in results if r.id != "big"] == [3, 4, 5, 6, 7]
    assert all(r.finish_reason == "length" and r.text for r in results if r.id != "big")
    c = gpu.counters
    assert c.prompt_tokens == sum(68 + 10 * k for k in range(5))  # "big" consumed nothing
    assert c.prefix_cache_queries == c.prompt_tokens
    assert (c.items, c.batches, c.length_exceeded, c.generation_tokens) == (6, 1, 1, 25)
    assert seconds == pytest.approx(c.busy_s) and seconds > 0
    # the engine's own max_input_len applies too
    results, _ = run_work(gpu, make_work([make_item("x", ["S"], [48], 160)]))
    assert results[0].finish_reason == "length_exceeded"


def test_batch_output_limit_clips_tokens() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    items = [make_item("a", [], [], 30, max_tokens=50), make_item("b", [], [], 30, max_tokens=2)]
    results, _ = run_work(gpu, make_work(items, max_tokens=5))
    assert [r.tokens_out for r in results] == [5, 2]


def test_batch_is_deterministic() -> None:
    items = [
        make_item(f"q{k}", ["sys", "shots"], [40, 30], 5 + 7 * k, max_tokens=1 + k % 9)
        for k in range(30)
    ]
    runs = []
    for _ in range(2):
        gpu = SimGPU(SMALL, max_input_len=300)
        out = [run_work(gpu, make_work(items)), run_work(gpu, make_work(items[::-1], lane=3))]
        runs.append((out, counters(gpu), gpu.now))
    assert runs[0] == runs[1]
    assert runs[0][1]["preemptions"] > 0  # 30 requests in 39 blocks: pressure was real


def test_cold_batch_shares_prefix_within_the_batch() -> None:
    gpu = SimGPU(SimCosts(), max_input_len=8192)
    n = 12
    items = [make_item(f"p{k}", ["system prompt"], [48], 30 + k) for k in range(n)]  # 3 blocks
    results, _ = run_work(gpu, make_work(items))
    assert [r.cached_tokens for r in results] == [0] + [48] * (n - 1)
    assert gpu.counters.prefix_cache_hits == (n - 1) * 3 * 16
    assert gpu.counters.steps == 4  # one prefill step for all, then 3 decode steps


def test_shape_switch_evicts_older_shape_deepest_blocks_first() -> None:
    """Capacity 19 blocks of 16; shape A (4 prefix blocks) runs once, then shape B repeatedly."""
    gpu = SimGPU(SimCosts(block_size=16, num_blocks=20), max_input_len=100)
    a = make_item("a0", ["A"], [64], 16, max_tokens=1)  # 80 tokens: 5 full blocks
    run_work(gpu, make_work([a]))
    probe = gpu.cache
    a_seq_hashes = item_blocks(make_item("a1", ["A"], [64], 16), 16).hashes
    depths = []
    for k in range(17):
        run_work(gpu, make_work([make_item(f"b{k}", ["B"], [64], 16, max_tokens=1)]))
        depth = 0
        for h in a_seq_hashes[:4]:
            if not probe.cached(h):
                break
            depth += 1
        depths.append(depth)
        b_prefix = item_blocks(make_item("bx", ["B"], [64], 16), 16).hashes[:4]
        assert all(probe.cached(h) for h in b_prefix)  # the shape in use stays warm
    # 14 never-used blocks and A's unique block go first, then A's prefix, deepest first
    assert depths == [4] * 11 + [3, 2, 1, 0, 0, 0]
    results, _ = run_work(gpu, make_work([make_item("a2", ["A"], [64], 16, max_tokens=1)]))
    assert results[0].cached_tokens == 0


def test_graph_cache_builds_once_per_lane_epoch() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    item = make_item("g", ["S"], [16], 8, max_tokens=1)
    keys = [(1, 1), (1, 1), (2, 1), (1, 2), (2, 1), (1, 2)]
    builds = []
    for lane, epoch in keys:
        run_work(gpu, make_work([item], lane=lane, epoch=epoch))
        builds.append(gpu.counters.graph_builds)
    assert builds == [1, 1, 2, 3, 3, 3]
    assert gpu.build_graph((7, 3)) and not gpu.build_graph((7, 3))
    assert gpu.counters.graph_builds == 4


def test_graph_cache_is_lru_bounded() -> None:
    gpu = SimGPU(SimCosts(graph_cache_size=2), max_input_len=200)
    for key in [(1, 1), (2, 1), (1, 1), (3, 1), (1, 1), (2, 1)]:
        gpu.build_graph(key)
    assert gpu.counters.graph_builds == 4  # (2,1) was dropped by (3,1), then rebuilt


def test_step_costs_literal() -> None:
    costs = SimCosts(
        step_overhead_s=0.5,
        forward_s=1.0,
        prefill_token_s=0.125,
        cached_token_s=0.0625,
        decode_seq_s=0.25,
        kv_token_s=0.0,
        graph_build_s=10.0,
    )
    gpu = SimGPU(costs, max_input_len=100)
    # prefill: 0.5 + max(1, 40 * 0.125) + graph 10 = 15.5; two decodes: 0.5 + 1 + 0.25 each
    results, seconds = run_work(gpu, make_work([make_item("c", [], [], 40, max_tokens=3)]))
    assert seconds == 19.0 and results[0].tokens_out == 3
    # same prompt again: 32 tokens cached (2 blocks), 8 computed: 0.5 + 1 + 2 * 0.0625 + ...
    again, seconds = run_work(gpu, make_work([make_item("c", [], [], 40, max_tokens=1)]))
    assert again[0].cached_tokens == 32 and seconds == 0.5 + 1.0 + 32 * 0.0625


# --- request mode -------------------------------------------------------------------------------


def _add(gpu: SimGPU, rid: str, prompt_len: int, max_tokens: int, shared: int = 0):
    full = prompt_len // 16
    hashes = [hash(("shared", i)) for i in range(min(shared // 16, full))]
    hashes += [hash((rid, i)) for i in range(len(hashes), full)]
    return gpu.add(rid, hashes, prompt_len, max_tokens)


def test_request_mode_respects_max_num_seqs() -> None:
    gpu = SimGPU(SimCosts(max_num_seqs=2), max_input_len=1000)
    reqs = [_add(gpu, f"r{k}", 100, 5) for k in range(6)]
    peak = 0
    while gpu.busy:
        gpu.step()
        peak = max(peak, len(gpu.running))
        assert len(gpu.running) <= 2
    assert peak == 2
    finish = [r.finish_time for r in reqs]
    assert finish == sorted(finish) and finish[0] == finish[1] < finish[2]  # FCFS in pairs
    assert all(r.out == 5 for r in reqs)


def test_request_mode_respects_kv_capacity_with_preemption() -> None:
    costs = SimCosts(block_size=16, num_blocks=12, max_num_seqs=8)  # 11 usable blocks
    gpu = SimGPU(costs, max_input_len=100)
    reqs = [_add(gpu, f"r{k}", 48, 40) for k in range(3)]  # 6 blocks each at the end
    while gpu.busy:
        gpu.step()
        held = {b for r in gpu.running for b in r.seq.blocks}
        assert len(held) <= 11 and gpu.cache.num_used == len(held)
        gpu.cache.check()
    assert gpu.counters.preemptions > 0
    assert [r.out for r in reqs] == [40, 40, 40]
    assert gpu.counters.generation_tokens == 120
    assert gpu.counters.prefix_cache_queries == 3 * 48  # re-admissions are not counted again
    assert gpu.cache.num_used == 0


def test_advance_to_and_latency() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    assert gpu.advance_to(5.0) == [] and gpu.now == 5.0  # idle: the clock jumps
    r = _add(gpu, "x", 64, 3)
    done = gpu.advance_to(5.0001)  # one step starts before 5.0001 and runs past it
    assert done == [] and gpu.now > 5.0001 and r.out == 1
    done = gpu.advance_to(100.0)
    assert done == [r] and gpu.now == 100.0
    assert r.latency == r.finish_time - 5.0 and r.first_token_time < r.finish_time
    late = gpu.add("late", [], 300, 1, arrival=99.0)  # over max_input_len
    assert gpu.step() == [late] and late.finish_reason == "length_exceeded"


def test_chunked_prefill_spreads_a_long_prompt() -> None:
    gpu = SimGPU(SimCosts(max_num_batched_tokens=64), max_input_len=1000)
    r = _add(gpu, "long", 200, 1)
    steps = 0
    while gpu.busy:
        gpu.step()
        steps += 1
    assert steps == 4 and r.out == 1  # ceil(200 / 64)


def _workload(gpu: SimGPU, seed: int, n: int) -> list:
    rng = random.Random(seed)
    reqs, t = [], 0.0
    for k in range(n):
        t += rng.expovariate(20.0)
        gpu.advance_to(t)
        reqs.append(
            _add(
                gpu,
                f"w{k}",
                rng.randint(1, 300),
                rng.randint(1, 60),
                shared=rng.choice([0, 64, 128]),
            )
        )
    gpu.drain()
    return reqs


@pytest.mark.parametrize(
    ("num_blocks", "max_num_seqs", "budget", "seed"),
    [(60, 6, 512, 7), (40, 64, 2048, 8), (200, 16, 16, 9)],  # seq-, KV-, budget-bound
)
def test_fast_forward_is_exact(num_blocks: int, max_num_seqs: int, budget: int, seed: int):
    costs = SimCosts(
        num_blocks=num_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget
    )
    fast = SimGPU(costs, max_input_len=400)
    slow = SimGPU(costs, max_input_len=400, fast_forward=False)
    a, b = _workload(fast, seed, 200), _workload(slow, seed, 200)
    key = [(r.finish_time, r.first_token_time, r.out, r.cached_tokens, r.preemptions) for r in a]
    assert key == [
        (r.finish_time, r.first_token_time, r.out, r.cached_tokens, r.preemptions) for r in b
    ]
    assert counters(fast) == counters(slow)
    assert list(fast.cache.free_queue) == list(slow.cache.free_queue)
    assert fast.counters.steps == slow.counters.steps


def test_sequential_requests_match_prefix_cache_model() -> None:
    """One request at a time with max_tokens 1: SimGPU caches exactly like PrefixCache.run."""
    costs = SimCosts(block_size=16, num_blocks=14)
    gpu, model = SimGPU(costs, max_input_len=150), PrefixCache(14, 16)
    rng = random.Random(3)
    for k in range(150):
        shared = rng.choice([0, 32, 64, 96])
        r = _add(gpu, f"s{k}", shared + rng.randint(1, 50), 1, shared=shared)
        hashes = list(r.seq.hashes)
        gpu.drain()
        assert r.cached_tokens == model.run(hashes, r.prompt_len, 1)
    assert list(gpu.cache.free_queue) == list(model.free_queue)


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.integers(1, 120), st.integers(1, 30), st.sampled_from([0, 32, 64]), st.floats(0, 0.2)
        ),
        min_size=1,
        max_size=25,
    ),
    max_num_seqs=st.integers(1, 5),
    num_blocks=st.integers(12, 30),
)
def test_request_mode_properties(reqs, max_num_seqs, num_blocks) -> None:
    costs = SimCosts(num_blocks=num_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=96)
    gpu = SimGPU(costs, max_input_len=min(120, costs.kv_tokens - 31))
    t, added = 0.0, []
    for k, (length, max_tokens, shared, gap) in enumerate(reqs):
        t += gap
        gpu.advance_to(t)
        assert len(gpu.running) <= max_num_seqs
        added.append(_add(gpu, f"h{k}", max(length, shared + 1), max_tokens, shared=shared))
    finished = gpu.drain()
    assert all(r.done for r in added) and set(finished) <= set(added)
    for r in added:
        assert r.cached_tokens % 16 == 0 and r.cached_tokens <= r.prompt_len - 1
        assert r.out == r.max_out and r.finish_time >= r.arrival
    assert gpu.counters.prefix_cache_queries == sum(r.prompt_len for r in added)
    assert all(ref == 0 for ref in gpu.cache.ref) and gpu.cache.num_used == 0
    gpu.cache.check()


# --- SimEngine ----------------------------------------------------------------------------------


async def test_engine_protocol_run_and_stats() -> None:
    eng = SimEngine(time_scale=0)
    assert eng.simulated and eng.name == "sim"
    _: Engine = eng  # the protocol's shape
    assert eng.limits() == EngineLimits(256, 16384, 8192)
    items = [make_item(f"e{k}", ["S", "F"], [40, 40], 20, max_tokens=2) for k in range(3)]
    results = await eng.run(make_work(items))
    assert [r.cached_tokens for r in results] == [0, 80, 80]
    s = eng.stats()
    assert s.simulated and s.block_size == 16
    assert (s.prefix_cache_queries, s.prefix_cache_hits, s.prompt_tokens) == (300, 160, 300)
    assert (s.generation_tokens, s.graph_builds, s.batches, s.items) == (6, 1, 1, 3)
    assert s.busy_s > 0
    await eng.close()
    with pytest.raises(EngineError):
        await eng.run(make_work(items))


async def test_engine_prewarm_warms_prefix_and_graphs() -> None:
    eng = SimEngine(time_scale=0, max_input_len=4096)
    sample = make_item("sample", ["sys", "tools"], [70, 50], 33)
    sig = Prewarm("m", sample.signature, "shape", 4, [(0, 160), (1, 200)], sample)
    await eng.prewarm(sig)
    c = eng.gpu.counters
    assert (c.prewarms, c.graph_builds) == (1, 2)
    assert (c.prefix_cache_queries, c.generation_tokens) == (120, 1)
    items = [make_item(f"w{k}", ["sys", "tools"], [70, 50], 40) for k in range(2)]
    results = await eng.run(make_work(items, lane=1, epoch=4))
    assert [r.cached_tokens for r in results] == [112, 112]  # floor(120 / 16) * 16
    assert c.graph_builds == 2  # (1, 4) was built by the pre-warm
    await eng.prewarm(Prewarm("m", 0, "", 5, [(2, 64)], None))  # no sample: graphs only
    assert (c.prewarms, c.graph_builds) == (2, 3)


def test_engine_rejects_negative_time_scale() -> None:
    with pytest.raises(UsageError, match="time_scale"):
        SimEngine(time_scale=-1)


# --- the request's own semantics (engines/simanswer.py) ----------------------------------------


def test_each_item_runs_to_its_own_max_tokens_or_stops_early() -> None:
    """Two items of one batch: 5 (ignore_eos: exactly 5) and 40 (stops when it "emits" EOS)."""
    gpu = SimGPU(SMALL, max_input_len=200)
    short = make_item("short", ["S"], [16], 8, max_tokens=5)
    long = make_item("long0", ["S"], [16], 8, max_tokens=40, ignore_eos=False)
    results, _ = run_work(gpu, make_work([short, long], max_tokens=40))
    assert (results[0].tokens_out, results[0].finish_reason) == (5, "length")
    assert results[1].tokens_out < 40 and results[1].finish_reason == "stop"


def test_drawn_output_lengths_mostly_stop_before_max_tokens() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    items = [make_item(f"d{k}", ["S"], [16], 4, max_tokens=20, ignore_eos=False)
             for k in range(200)]
    results, _ = run_work(gpu, make_work(items))
    assert all(1 <= r.tokens_out <= 20 for r in results)
    stopped = sum(r.finish_reason == "stop" for r in results)
    assert all((r.finish_reason == "length") == (r.tokens_out == 20) for r in results)
    assert 0.65 * 200 <= stopped <= 0.95 * 200  # about 4 in 5 by construction
    again, _ = run_work(SimGPU(SMALL, max_input_len=200), make_work(items))
    assert [r.tokens_out for r in again] == [r.tokens_out for r in results]


def test_n_choices_run_and_come_back_as_a_body() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    item = make_item("n2", ["S"], [16], 8, max_tokens=6, n=2)
    [res], _ = run_work(gpu, make_work([item]))
    body = msgspec.json.decode(res.body)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert res.tokens_out == body["usage"]["completion_tokens"] == 12
    assert gpu.counters.requests >= 2
