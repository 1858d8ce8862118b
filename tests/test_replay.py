"""The replay engine: the policies really are different paths, measured fairly. SIMULATED.

A small prefill-bound workload from the examples' generator (16 shapes with 1,024-token
prefixes, Zipf popularity, lognormal prompts, 4 output tokens) on 2 simulated GPUs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from fabricctl.engines.costs import SimCosts
from fabricctl.errors import UsageError
from fabricctl.replay.policies import Fabric
from fabricctl.replay.report import PolicyResult, switches
from fabricctl.replay.run import (
    ABLATIONS,
    POLICIES,
    costs_for,
    limits_for,
    make_policy,
    pressure_of,
    replay,
)
from fabricctl.replay.sim import Simulation
from fabricctl.replay.workload import ReplayItem, distinct_prefix_tokens, generated

ROOT = Path(__file__).resolve().parent.parent
SHAPES = 16


@cache
def workload(rate: float = 0.0) -> list[ReplayItem]:
    return generated(items=800, shapes=SHAPES, seed=3, prefix_tokens=1024, median_tokens=48,
                     max_tokens=4, rate=rate)


def costs(pressure: float) -> SimCosts:
    return costs_for(workload(), pressure=pressure, max_num_seqs=32)


@cache
def results(pressure: float) -> dict[str, PolicyResult]:
    items = workload()
    return replay(items, list(POLICIES + ABLATIONS), 2, costs(pressure))


def simulate(name: str, pressure: float = 1.0) -> Simulation:
    items = workload()
    c = costs(pressure)
    lim = limits_for(items, c)
    sim = Simulation(items, make_policy(name, lim), 2, c, lim.max_input_len)
    sim.run()
    return sim


# -- the policies are different paths ------------------------------------------------------------


def test_round_robin_switches_shapes_on_an_interleaved_workload() -> None:
    r = results(1.0)["round-robin"]
    assert r.switches_per_gpu > 10 * SHAPES  # the interleaved arrivals reach each GPU as they are
    assert r.midstream_switches > 100
    assert r.thrash_events is None  # no shapes, no lifecycle
    sim = simulate("round-robin")
    # offline (every arrival at t = 0): mid-stream = shape runs - distinct shapes, per GPU
    per_gpu, midstream = switches(sim)
    distinct = [len({h.r.shape for h in handed if not h.prewarm}) for handed in sim.handed]
    assert midstream == sum(n + 1 - d for n, d in zip(per_gpu, distinct, strict=True))


@pytest.mark.parametrize("pressure", [0.1, 1.0, 3.0])
def test_fabric_makes_no_midstream_switch(pressure: float) -> None:
    res = results(pressure)
    for name in ("fabric", "fabric-per-model", "fabric-no-lanes", "fabric-no-prewarm"):
        r = res[name]
        assert r.midstream_switches == 0, name
        assert r.switches_per_gpu <= SHAPES, name  # each GPU runs a shape once
        assert r.kv_hit_rate >= 0.99 * r.kv_hit_achievable, name
    assert res["fabric"].padding_waste <= 0.03


def test_consumer_scope_splits_the_shapes_between_gpus() -> None:
    """The design fix: per consumer, each small shape runs (and is prefilled) on one GPU."""
    res = results(1.0)
    fabric, per_model = res["fabric"], res["fabric-per-model"]
    assert fabric.switches_per_gpu < 0.6 * per_model.switches_per_gpu
    assert fabric.prewarms < per_model.prewarms
    assert fabric.tokens_per_s > per_model.tokens_per_s
    sim = simulate("fabric")
    shapes = [{h.r.shape for h in handed if not h.prewarm} for handed in sim.handed]
    assert len(shapes[0] & shapes[1]) <= 2  # a shape shared only by a join
    assert len(shapes[0] | shapes[1]) == SHAPES


def test_pow2_buckets_pad_more_than_lanes_on_lognormal_lengths() -> None:
    res = results(1.0)
    assert res["pow2-buckets"].padding_waste > 0.25  # a power of two wastes ~a quarter or more
    assert res["fabric"].padding_waste < 0.03
    assert res["fabric-no-lanes"].padding_waste > 2 * res["fabric"].padding_waste
    assert res["round-robin"].padding_waste == 0.0  # routers pad nothing


# -- what fabric exists for ---------------------------------------------------------------------


def test_fabric_never_loses_and_wins_under_pressure() -> None:
    for pressure in (0.1, 1.0, 3.0):
        res = results(pressure)
        best = max(res[n].tokens_per_s for n in ("round-robin", "prefix-affinity",
                                                   "pow2-buckets"))
        assert res["fabric"].tokens_per_s >= 0.98 * best, pressure
    high = results(3.0)
    assert high["fabric"].tokens_per_s >= 2.5 * high["round-robin"].tokens_per_s
    assert high["fabric"].tokens_per_s >= 2.5 * high["prefix-affinity"].tokens_per_s
    assert high["round-robin"].prefix_refills > 100  # its cache thrashes
    assert high["fabric"].kv_hit_rate > high["round-robin"].kv_hit_rate + 0.1


# -- fairness -------------------------------------------------------------------------------------


def test_every_policy_runs_the_same_requests() -> None:
    res = results(1.0)
    tokens = set()
    for name, r in res.items():
        assert r.items == len(workload()), name
        assert r.preemptions >= 0 and r.graph_builds == 0, name  # vLLM captured graphs at start
        tokens.add(round(r.tokens_per_s * r.makespan_s, -3))  # the same tokens in every run
    assert len(tokens) <= 2


def test_prewarms_are_real_requests_excluded_from_the_hit_rate() -> None:
    sim = simulate("fabric")
    assert sim.prewarms > 0
    ran = sum(g.counters.requests for g in sim.gpus)
    assert ran == len(workload()) + sim.prewarms  # they ran on the GPUs and cost their time
    assert len(sim.finished) == len(workload())  # but are not workload requests
    prewarm_hits = sum(h.req.cached_tokens for hs in sim.handed for h in hs if h.prewarm)
    gpu_hits = sum(g.counters.prefix_cache_hits for g in sim.gpus)
    workload_hits = sum(q.cached_tokens for _, _, q in sim.finished)
    assert gpu_hits == workload_hits + prewarm_hits
    off = simulate("fabric-no-prewarm")
    assert off.prewarms == 0


def test_brokers_keep_their_engine_fed() -> None:
    """A consumer pulls while fewer requests wait than a step admits: the GPU never starves,
    and the engine sees its batches well before it runs dry."""
    sim = simulate("fabric")
    c = costs(1.0)
    policy = sim.policy
    assert isinstance(policy, Fabric)
    assert policy.out == 4
    per_step = -(-c.max_num_seqs // 4)
    handed_at = [h.t for h in sim.handed[0] if not h.prewarm]
    assert handed_at.count(0.0) >= per_step  # at t = 0 it took a step's worth at once


def test_unbounded_cache_hits_what_is_achievable() -> None:
    res = results(0.1)
    for name, r in res.items():
        assert r.kv_hit_rate >= 0.99 * r.kv_hit_achievable, name
    assert res["round-robin"].prefix_refills == 0


def test_pressure_sizes_the_kv_pool() -> None:
    items = workload()
    distinct = distinct_prefix_tokens(items)
    assert 0 < distinct < SHAPES * 1024  # shapes share their system prompts' blocks
    for p in (0.5, 2.0, 3.0):
        c = costs_for(items, pressure=p, max_num_seqs=32)
        assert pressure_of(items, c) == pytest.approx(p, rel=0.02)
    c = costs_for(items, kv_tokens=50_000)
    assert c.kv_tokens >= 50_000
    assert costs_for(items).num_blocks == SimCosts().num_blocks
    with pytest.raises(UsageError, match="pressure must be > 0"):
        costs_for(items, pressure=0)


def test_replay_is_deterministic() -> None:
    items = workload()
    c = costs(2.0)
    one = replay(items, ["fabric", "prefix-affinity"], 2, c)
    two = replay(items, ["fabric", "prefix-affinity"], 2, c)
    assert one == two


def test_streaming_arrivals() -> None:
    items = workload(rate=200.0)
    assert items[-1].arrival > 2.0
    res = replay(items, ["fabric", "round-robin"], 2, costs(1.0))
    for r in res.values():
        assert r.items == len(items)
        assert r.makespan_s >= items[-1].arrival - items[0].arrival
    assert res["fabric"].midstream_switches <= 2  # items arriving during a drain stage anew


def test_unknown_policy() -> None:
    with pytest.raises(UsageError, match="unknown policy"):
        make_policy("fastest", limits_for(workload(), costs(1.0)))


def test_limits_fit_the_longest_prompt_below_the_kv_pool() -> None:
    items = workload()
    lim = limits_for(items, costs(1.0))
    assert lim.max_input_len >= max(r.tokens for r in items)
    tiny = dataclasses.replace(costs(1.0), num_blocks=65)
    assert limits_for(items, tiny).max_input_len == tiny.kv_tokens - 1


# -- the bench ------------------------------------------------------------------------------------


def load_bench() -> Callable[[list[str]], int]:
    spec = importlib.util.spec_from_file_location("policy_bench", ROOT / "bench/policy_bench.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["policy_bench"] = mod
    spec.loader.exec_module(mod)
    return mod.main  # type: ignore[no-any-return]


def test_policy_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    main = load_bench()
    assert main(["--quick", "--json", "--pressures", "2", "--no-ablations",
                 "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["pressure"] for r in out["regimes"]] == [2.0]
    for regime in out["regimes"]:
        assert set(regime["policies"]) == set(POLICIES)
        for fig in regime["policies"].values():
            assert {"tokens_per_s", "kv_hit_rate", "kv_hit_achievable", "midstream_switches",
                    "padding_waste"} <= set(fig)
        assert isinstance(regime["targets_missed"], list)
    assert out["setup"]["cost_model"]["prefill_token_s"] == SimCosts().prefill_token_s
    assert out["simulated"] is True
