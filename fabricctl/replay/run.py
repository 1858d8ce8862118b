"""Run one workload through several policies on identical simulated GPUs.

Contract: `make_policy(name, ...)` builds a policy by name (fabric, round-robin,
prefix-affinity, pow2-buckets, and fabric's ablations fabric-no-lanes, fabric-no-prewarm,
fabric-no-lifecycle); `replay(items, names, gpus, costs, ...)` returns one `PolicyResult`
per name, each from a fresh set of GPUs with the same costs and the same arrivals.
"""

from __future__ import annotations

import dataclasses

from fabricctl.core.config import CoreConfig
from fabricctl.engines.costs import SimCosts
from fabricctl.replay.policies import Fabric, Policy, Pow2Buckets, PrefixAffinity, RoundRobin
from fabricctl.replay.report import PolicyResult
from fabricctl.replay.sim import Simulation
from fabricctl.replay.workload import ReplayItem

BASELINES = ("round-robin", "prefix-affinity", "pow2-buckets")
ABLATIONS = ("fabric-no-lanes", "fabric-no-prewarm", "fabric-no-lifecycle")
POLICIES = ("fabric", *BASELINES)


@dataclasses.dataclass(frozen=True)
class BatchLimits:
    """The contract each simulated GPU's consumer registers (batch policies only)."""

    max_batch_size: int = 256
    max_batch_tokens: int = 16384
    max_input_len: int = 8192


def make_policy(name: str, limits: BatchLimits, core: CoreConfig | None = None) -> Policy:
    core = core or CoreConfig()
    lim = (limits.max_batch_size, limits.max_batch_tokens, limits.max_input_len)
    if name == "round-robin":
        return RoundRobin()
    if name == "prefix-affinity":
        return PrefixAffinity()
    if name == "pow2-buckets":
        return Pow2Buckets(limits.max_batch_size, limits.max_batch_tokens)
    if name == "fabric":
        return Fabric(core, *lim)
    if name == "fabric-no-lanes":
        return Fabric(dataclasses.replace(core, lanes_max=1), *lim, name=name)
    if name == "fabric-no-prewarm":
        return Fabric(core, *lim, prewarm=False, name=name)
    if name == "fabric-no-lifecycle":
        return Fabric(dataclasses.replace(core, lifecycle=False), *lim, name=name)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES + ABLATIONS)}")


def replay(items: list[ReplayItem], names: list[str], gpus: int, costs: SimCosts,
           limits: BatchLimits | None = None, core: CoreConfig | None = None,
           ) -> dict[str, PolicyResult]:
    limits = limits or BatchLimits()
    out: dict[str, PolicyResult] = {}
    for name in names:
        policy = make_policy(name, limits, core)
        out[name] = Simulation(items, policy, gpus, costs, limits.max_input_len).run()
    return out
