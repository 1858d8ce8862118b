"""Run one workload through several policies on identical simulated GPUs.

Contract: `make_policy(name, ...)` builds a policy by name (fabric, round-robin,
prefix-affinity, pow2-buckets, the `oracle` every other is measured against, and fabric's
ablations fabric-per-model, fabric-no-lanes,
fabric-no-prewarm, fabric-no-lifecycle); `replay(items, names, gpus, costs, ...)` returns one
`PolicyResult` per name, each from a fresh set of GPUs with the same costs and the same
arrivals. `costs_for` sizes the simulated KV pool from a cache pressure: pressure = the
workload's distinct prefix tokens / the KV tokens left to cache them after `max_num_seqs`
in-flight requests took their own (non-prefix) tokens, so kv = distinct / pressure + that
reserve. `limits_for` gives the consumers' contract for a workload and KV pool.
"""

from __future__ import annotations

import dataclasses

from fabricctl.core.config import CoreConfig, prewarm_enabled
from fabricctl.engines.costs import SimCosts
from fabricctl.replay.oracle import Oracle
from fabricctl.replay.policies import Fabric, Policy, Pow2Buckets, PrefixAffinity, RoundRobin
from fabricctl.replay.report import PolicyResult
from fabricctl.replay.sim import Simulation
from fabricctl.replay.workload import ReplayItem, distinct_prefix_tokens

BASELINES = ("round-robin", "prefix-affinity", "pow2-buckets")
ABLATIONS = ("fabric-per-model", "fabric-no-lanes", "fabric-no-prewarm", "fabric-no-lifecycle")
ORACLE = "oracle"  # the reference: an omniscient shape scheduler (replay/oracle.py)
POLICIES = ("fabric", *BASELINES, ORACLE)
FABRIC_CORE = CoreConfig()  # the broker as the replay runs it: the same defaults as up/run


@dataclasses.dataclass(frozen=True)
class BatchLimits:
    """The contract each simulated GPU's consumer registers (batch policies only)."""

    max_batch_size: int = 256
    max_batch_tokens: int = 16384
    max_input_len: int = 8192


def make_policy(name: str, limits: BatchLimits, core: CoreConfig | None = None,
                items: list[ReplayItem] | None = None) -> Policy:
    core = core or FABRIC_CORE
    if name == ORACLE:
        return Oracle(items or [])
    lim = (limits.max_batch_size, limits.max_batch_tokens, limits.max_input_len)
    if name == "round-robin":
        return RoundRobin()
    if name == "prefix-affinity":
        return PrefixAffinity()
    if name == "pow2-buckets":
        return Pow2Buckets(limits.max_batch_size, limits.max_batch_tokens)
    if name == "fabric":
        return Fabric(core, *lim, prewarm=prewarm_enabled(core.prewarm, simulated=True))
    if name == "fabric-per-model":
        return Fabric(dataclasses.replace(core, shape_scope="model"), *lim, name=name)
    if name == "fabric-no-lanes":
        return Fabric(dataclasses.replace(core, lanes_max=1), *lim, name=name)
    if name == "fabric-no-prewarm":
        return Fabric(core, *lim, prewarm=False, name=name)
    if name == "fabric-no-lifecycle":
        return Fabric(dataclasses.replace(core, lifecycle=False), *lim, name=name)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES + ABLATIONS)}")


def inflight_reserve(items: list[ReplayItem], max_num_seqs: int) -> int:
    """KV tokens `max_num_seqs` average requests hold beyond their shared prefix."""
    if not items:
        return 0
    own = sum(r.tokens - r.prefix + r.item.max_tokens for r in items) / len(items)
    return int(max_num_seqs * own)


def costs_for(items: list[ReplayItem], *, kv_tokens: int | None = None,
              pressure: float | None = None, max_num_seqs: int = 64,
              base: SimCosts | None = None) -> SimCosts:
    """The simulated GPU for a replay: `kv_tokens` of KV, or the pool giving `pressure`,
    else `base`'s pool; `max_num_seqs` running requests at most."""
    base = base or SimCosts()
    bs = base.block_size
    if kv_tokens is None and pressure is not None:
        if pressure <= 0:
            raise ValueError("pressure must be > 0")
        kv_tokens = int(distinct_prefix_tokens(items, bs) / pressure
                        + inflight_reserve(items, max_num_seqs))
    if kv_tokens is None:
        return dataclasses.replace(base, max_num_seqs=max_num_seqs)
    if kv_tokens < 2 * bs:
        raise ValueError(f"kv_tokens must be at least {2 * bs}")
    return dataclasses.replace(base, num_blocks=-(-kv_tokens // bs) + 1, max_num_seqs=max_num_seqs)


def pressure_of(items: list[ReplayItem], costs: SimCosts) -> float:
    """The cache pressure a workload puts on one GPU of `costs` (see the module docstring)."""
    room = costs.kv_tokens - inflight_reserve(items, costs.max_num_seqs)
    distinct = distinct_prefix_tokens(items, costs.block_size)
    return distinct / room if room > 0 else float("inf")


def limits_for(items: list[ReplayItem], costs: SimCosts,
               base: BatchLimits | None = None) -> BatchLimits:
    """The contract for a workload: `base`, with a max input long enough for its longest
    prompt but below the KV pool (a longer one is refused as length_exceeded)."""
    base = base or BatchLimits()
    longest = max((r.tokens for r in items), default=0)
    return dataclasses.replace(
        base, max_input_len=max(1, min(max(base.max_input_len, longest), costs.kv_tokens - 1)))


def replay(items: list[ReplayItem], names: list[str], gpus: int, costs: SimCosts,
           limits: BatchLimits | None = None, core: CoreConfig | None = None,
           ) -> dict[str, PolicyResult]:
    limits = limits or limits_for(items, costs)
    out: dict[str, PolicyResult] = {}
    for name in names:
        policy = make_policy(name, limits, core, items)
        out[name] = Simulation(items, policy, gpus, costs, limits.max_input_len).run()
    return out
