"""The figures a replay reports per policy. Every figure is SIMULATED.

Contract (`summarise(sim)` after `Simulation.run`), each figure defined in ARCHITECTURE.md,
"What a replay reports":
- tokens/s = (prompt + generated tokens of the workload's requests) / makespan (first
  arrival to last finish); pre-warms cost GPU time but add no tokens;
- KV hit rate = cached / prompt tokens of the workload's requests, and the achievable rate
  an unbounded cache would have given them on the same GPUs in the same order (the gap is
  eviction only); `prefix_refills` counts requests that recomputed blocks their GPU had;
- shape switches per GPU (runs - 1) and mid-stream switches (the GPU came back to a shape it
  left while holding its items, plus the policy's own count);
- padding waste and thrash events: the policy's own (`Policy.figures`; None where a policy
  has no shapes); CUDA-graph rebuilds; latency p50 and p99 (arrival to finish).
Jobs (multi-job workloads; `run.replay` fills these in, None otherwise): per job
(`JobResult`) its completion (last finish - its arrival), its standalone time (replayed
alone at t = 0 with the same policy and GPUs), the slowdown and whether it met its window;
per policy the deadlines met and missed and the worst slowdown; `makespan_s` the fleet's.
"""

from __future__ import annotations

import msgspec

from fabricctl.replay.fleet import SimRecord
from fabricctl.replay.jobs import JobSpec


class JobResult(msgspec.Struct):
    """One job's figures under one policy (all simulated)."""

    job: str
    items: int
    arrival_s: float
    priority: int
    window_s: float | None
    completion_s: float  # its last item's finish - its arrival
    standalone_s: float | None  # the same, replayed alone on the same GPUs and policy
    slowdown: float | None  # completion / standalone
    deadline_met: bool | None  # completion <= window (None: no window)


class PolicyResult(msgspec.Struct):
    """One policy's row (all simulated)."""

    policy: str
    items: int
    tokens_per_s: float
    makespan_s: float
    kv_hit_rate: float
    kv_hit_achievable: float
    prefix_refills: int
    switches_per_gpu: float
    midstream_switches: int
    padding_waste: float
    graph_builds: int
    preemptions: int
    prewarms: int
    thrash_events: int | None
    p50_latency_s: float
    p99_latency_s: float
    token_counter: str = "estimate"  # how the workload's lines were counted (choose_counter)
    # a multi-job workload only (None otherwise): see the module docstring
    jobs: list[JobResult] | None = None
    deadlines: int | None = None  # jobs with a window
    deadlines_met: int | None = None
    deadlines_missed: list[str] | None = None  # the jobs that missed theirs
    worst_slowdown: float | None = None

JOB_FIELDS = ("jobs", "deadlines", "deadlines_met", "deadlines_missed", "worst_slowdown")


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def achievable_hits(sim: SimRecord) -> tuple[dict[int, int], int]:
    """Per workload request (by id of its SimRequest): the tokens an unbounded cache would
    have hit on its GPU in hand-over order; and how many requests fell short of that."""
    bs = sim.costs.block_size
    out: dict[int, int] = {}
    refills = 0
    for handed in sim.handed:
        seen: set[int] = set()
        for r, req, prewarm, _ in handed:
            prefix = r.hashes[: r.prefix // bs]
            if not prewarm:
                n = 0
                for h in r.hashes[: (req.prompt_len - 1) // bs]:
                    if h not in seen:
                        break
                    n += 1
                out[id(req)] = n * bs
                if req.cached_tokens < n * bs:
                    refills += 1
            seen.update(prefix)
    return out, refills


def switches(sim: SimRecord) -> tuple[list[int], int]:
    """Shape switches per GPU, and mid-stream switches over every GPU."""
    per_gpu: list[int] = []
    midstream = 0
    for handed in sim.handed:
        order = []
        for seq, h in enumerate(handed):
            if h.prewarm:
                continue
            t = h.req.first_token_time
            if t is None:
                t = h.req.finish_time if h.req.finish_time is not None else h.t
            order.append((t, seq, h))
        order.sort(key=lambda x: (x[0], x[1]))
        left: dict[tuple[str, int], float] = {}  # shape -> when this GPU started another
        runs = 0
        prev: tuple[str, int] | None = None
        returning: tuple[str, int] | None = None  # a run that returns to a left shape
        for t, _, h in order:
            shape = h.r.shape
            if shape != prev:
                if prev is not None:
                    left[prev] = t
                runs += 1
                returning = shape if shape in left else None
                prev = shape
            if returning is not None and h.t < left[returning]:
                midstream += 1  # it left this shape while it held this item already
                returning = None
        per_gpu.append(max(0, runs - 1))
    return per_gpu, midstream


def summarise(sim: SimRecord) -> PolicyResult:
    prompt = gen = hits = achievable = 0
    lat: list[float] = []
    start = min((r.arrival for _, r, _ in sim.finished), default=0.0)
    end = max((q.finish_time or 0.0 for _, _, q in sim.finished), default=0.0)
    reachable, refills = achievable_hits(sim)
    for _, r, q in sim.finished:
        prompt += q.prompt_len
        gen += q.out
        hits += q.cached_tokens
        achievable += reachable.get(id(q), 0)
        lat.append((q.finish_time or 0.0) - r.arrival)
    per_gpu, midstream = switches(sim)
    makespan = max(end - start, 1e-9)
    fig = sim.policy.figures()
    thrash = fig.get("thrash_events")
    return PolicyResult(
        policy=sim.policy.name, items=len(sim.finished),
        tokens_per_s=round((prompt + gen) / makespan, 1), makespan_s=round(makespan, 3),
        kv_hit_rate=round(hits / prompt, 4) if prompt else 0.0,
        kv_hit_achievable=round(achievable / prompt, 4) if prompt else 0.0,
        prefix_refills=refills,
        switches_per_gpu=round(sum(per_gpu) / max(1, len(per_gpu)), 2),
        midstream_switches=midstream + int(fig.get("midstream_switches") or 0),
        padding_waste=round(fig.get("padding_waste") or 0.0, 4),
        graph_builds=sum(g.counters.graph_builds for g in sim.gpus),
        preemptions=sum(g.counters.preemptions for g in sim.gpus),
        prewarms=sim.prewarms,
        thrash_events=None if thrash is None else int(thrash),
        p50_latency_s=round(_pct(lat, 50), 3), p99_latency_s=round(_pct(lat, 99), 3),
    )


def job_finishes(sim: SimRecord) -> dict[int, tuple[int, float]]:
    """Per job number: (its items that finished, the last one's finish time)."""
    out: dict[int, tuple[int, float]] = {}
    for _, r, q in sim.finished:
        n, end = out.get(r.item.job, (0, 0.0))
        out[r.item.job] = (n + 1, max(end, q.finish_time or 0.0))
    return out


def job_results(finishes: dict[int, tuple[int, float]], jobs: dict[int, JobSpec],
                alone: dict[int, float]) -> list[JobResult]:
    """Each job's figures from its finishes (`job_finishes`) and standalone times."""
    out = []
    for number, spec in sorted(jobs.items()):
        n, end = finishes.get(number, (0, spec.arrival))
        done = round(end - spec.arrival, 3)
        solo = alone.get(number)
        solo = None if solo is None else round(solo, 3)  # the figures shown agree
        out.append(JobResult(
            job=spec.label, items=n, arrival_s=spec.arrival, priority=spec.priority,
            window_s=spec.window_s, completion_s=done,
            standalone_s=solo,
            slowdown=round(done / solo, 3) if solo else None,
            deadline_met=None if spec.window_s is None else done <= spec.window_s))
    return out


def with_jobs(result: PolicyResult, jobs: list[JobResult]) -> PolicyResult:
    """`result` with its per-job figures and their summary."""
    windows = [j for j in jobs if j.deadline_met is not None]
    slow = [j.slowdown for j in jobs if j.slowdown is not None]
    return msgspec.structs.replace(
        result, jobs=jobs, deadlines=len(windows),
        deadlines_met=sum(1 for j in windows if j.deadline_met),
        deadlines_missed=[j.job for j in windows if not j.deadline_met],
        worst_slowdown=max(slow) if slow else None)
