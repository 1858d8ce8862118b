"""Run one workload through several policies on identical simulated GPUs.

Contract: `make_policy(name, ...)` builds a policy by name (fabric, round-robin,
prefix-affinity, pow2-buckets, the `oracle` every other is measured against, and fabric's
ablations fabric-per-model, fabric-no-lanes,
fabric-no-prewarm, fabric-no-lifecycle); `replay(items, names, gpus, costs, ...)` returns one
`PolicyResult` per name, each from a fresh set of GPUs with the same costs and the same
arrivals. `costs_for` sizes the simulated KV pool from a cache pressure: pressure = the
workload's distinct prefix tokens / the KV tokens left to cache them after `max_num_seqs`
in-flight requests took their own (non-prefix) tokens, so kv = distinct / pressure + that
reserve. `limits_for` gives the consumers' contract for a workload and KV pool. An unknown
policy name, a pressure that is not > 0 or a KV pool under two blocks is a `UsageError`.
Jobs: `replay(..., jobs=...)` (the jobs by number, from `workload.with_jobs`) gives fabric and
the oracle the jobs' terms, and fills in each result's per-job figures (`report.JobResult`),
each job's standalone time from a replay of that job alone (arriving at t = 0) with the same
policy on the same GPUs (`standalone=False` skips those runs). "fabric-tokens" is fabric
ordering shapes by tokens alone, as before jobs: no fair share, no wait bound
(`TOKENS_ONLY`), and no job terms; `JOB_POLICIES` is what a multi-job replay runs by default.
"""

from __future__ import annotations

import dataclasses

from fabricctl.core.config import CoreConfig, prewarm_enabled
from fabricctl.core.defaults import MAX_BATCH_SIZE, MAX_BATCH_TOKENS, MAX_INPUT_LEN
from fabricctl.engines.costs import SimCosts
from fabricctl.errors import UsageError
from fabricctl.replay.jobs import JobSpec
from fabricctl.replay.oracle import Oracle
from fabricctl.replay.policies import (
    Edf,
    Fabric,
    Policy,
    Pow2Buckets,
    PrefixAffinity,
    RoundRobin,
)
from fabricctl.replay.report import PolicyResult, job_finishes, job_results, with_jobs
from fabricctl.replay.sim import Simulation
from fabricctl.replay.workload import ReplayItem, distinct_prefix_tokens

BASELINES = ("round-robin", "prefix-affinity", "pow2-buckets")
ABLATIONS = ("fabric-per-model", "fabric-no-lanes", "fabric-no-prewarm", "fabric-no-lifecycle")
ORACLE = "oracle"  # the reference: an omniscient shape scheduler (replay/oracle.py)
POLICIES = ("fabric", *BASELINES, ORACLE)
FABRIC_TOKENS = "fabric-tokens"  # fabric by tokens alone, blind to jobs: the comparison
FABRIC_FAIR = "fabric-fair"  # fabric told priorities, not windows: fair share alone
EDF = "edf"  # a queue per job, earliest deadline first, blind to shapes
COMPARISONS = (FABRIC_TOKENS, FABRIC_FAIR, EDF)
JOB_POLICIES = ("fabric", FABRIC_TOKENS, FABRIC_FAIR, EDF, *BASELINES, ORACLE)
KNOWN = (*POLICIES, *COMPARISONS, *ABLATIONS)
FABRIC_CORE = CoreConfig()  # the broker as the replay runs it: the same defaults as up/run
TOKENS_ONLY = {"fair_share": False, "wait_bound_s": 1e9}  # the old policy, approximately


@dataclasses.dataclass(frozen=True)
class BatchLimits:
    """The contract each simulated GPU's consumer registers (batch policies only)."""

    max_batch_size: int = MAX_BATCH_SIZE
    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_input_len: int = MAX_INPUT_LEN


def make_policy(name: str, limits: BatchLimits, core: CoreConfig | None = None,
                items: list[ReplayItem] | None = None,
                jobs: dict[int, JobSpec] | None = None) -> Policy:
    core = core or FABRIC_CORE
    if name == ORACLE:
        return Oracle(items or [], jobs)
    lim = (limits.max_batch_size, limits.max_batch_tokens, limits.max_input_len)
    if name == EDF:
        return Edf(jobs)
    if name == "round-robin":
        return RoundRobin()
    if name == "prefix-affinity":
        return PrefixAffinity()
    if name == "pow2-buckets":
        return Pow2Buckets(limits.max_batch_size, limits.max_batch_tokens)
    prewarm = prewarm_enabled(core.prewarm, simulated=True)
    if name == "fabric":
        return Fabric(core, *lim, prewarm=prewarm, jobs=jobs)
    if name == FABRIC_FAIR:
        return Fabric(core, *lim, prewarm=prewarm, name=name, jobs={
            n: dataclasses.replace(spec, window_s=None) for n, spec in (jobs or {}).items()})
    if name == FABRIC_TOKENS:
        return Fabric(dataclasses.replace(core, **TOKENS_ONLY), *lim,  # type: ignore[arg-type]
                      prewarm=prewarm, name=name, job_terms=False)
    if name == "fabric-per-model":
        return Fabric(dataclasses.replace(core, shape_scope="model"), *lim, name=name)
    if name == "fabric-no-lanes":
        return Fabric(dataclasses.replace(core, lanes_max=1), *lim, name=name)
    if name == "fabric-no-prewarm":
        return Fabric(core, *lim, prewarm=False, name=name)
    if name == "fabric-no-lifecycle":
        return Fabric(dataclasses.replace(core, lifecycle=False), *lim, name=name)
    raise UsageError(f"unknown policy {name!r}; known: {', '.join(KNOWN)}")


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
            raise UsageError("pressure must be > 0")
        kv_tokens = int(distinct_prefix_tokens(items, bs) / pressure
                        + inflight_reserve(items, max_num_seqs))
    if kv_tokens is None:
        return dataclasses.replace(base, max_num_seqs=max_num_seqs)
    if kv_tokens < 2 * bs:
        raise UsageError(f"kv_tokens must be at least {2 * bs}")
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
           jobs: dict[int, JobSpec] | None = None, standalone: bool = True,
           ) -> dict[str, PolicyResult]:
    limits = limits or limits_for(items, costs)
    out: dict[str, PolicyResult] = {}
    for name in names:
        policy = make_policy(name, limits, core, items, jobs)
        sim = Simulation(items, policy, gpus, costs, limits.max_input_len)
        res = sim.run()
        if jobs:
            alone = ({n: job_alone(items, spec, name, gpus, costs, limits, core)
                      for n, spec in jobs.items()} if standalone else {})
            res = with_jobs(res, job_results(job_finishes(sim), jobs, alone))
        out[name] = res
    return out


def job_alone(items: list[ReplayItem], spec: JobSpec, name: str, gpus: int, costs: SimCosts,
              limits: BatchLimits, core: CoreConfig | None = None) -> float:
    """Seconds from arrival to its last finish of job `spec` replayed alone (arriving at
    t = 0) through policy `name` on `gpus` GPUs of `costs`."""
    mine = [dataclasses.replace(r, arrival=r.arrival - spec.arrival) for r in items
            if r.item.job == spec.number]
    if not mine:
        return 0.0
    solo = spec.alone()
    policy = make_policy(name, limits, core, mine, {spec.number: solo})
    sim = Simulation(mine, policy, gpus, costs, limits.max_input_len)
    sim.run()
    return job_finishes(sim)[spec.number][1]
