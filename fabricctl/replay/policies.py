"""The schedulers a replay compares: fabric, and what users would run instead.

Contract: a `Policy` gets every arrival (`arrive`), may give a GPU work (`feed`, called after
each of its steps and whenever it is idle), hears about finished requests (`finished`) and
ticks. Baselines, as their real counterparts run:
- round-robin: each request to the next GPU in turn at arrival (vLLM behind a load balancer);
- prefix-affinity: each request to the GPU that last served its signature, unless its load
  exceeds 1.25 x the least loaded + 32 requests (cache-aware routers' bounded-load fallback);
- pow2-buckets: power-of-two length buckets, blind to shapes: the fullest bucket's next
  batch, padded to the bucket;
- edf: a queue per job; a GPU that wants work gets the next request of the most urgent job
  (priority, then earliest deadline), blind to shapes.
fabric is the real `fabricctl.core.Broker` in memory mode with `up`'s and `run`'s defaults,
each GPU a consumer pulling lane batches, a pre-warm request (the prefix, max_tokens 1) to
the GPU a shape warms for. The brokers' consumers keep their engine's queue filled as
`SimFleet.wants` says (about what one step admits: max_num_seqs / output tokens), so every
step mixes new prefills with decodes; routers hand over at arrival.
Jobs (`replay.jobs`): fabric tells the broker a job's terms at its first arrival
(`Broker.set_job_terms`: priority, deadline = arrival + window) and seals it after its
last; until a batch completed it forecasts at the cost model's pace (`calibrate.cost_pace`).
`job_terms=False` keeps the terms back (fabric-tokens); fabric-fair gets priorities but no
windows; edf orders by the terms; the other baselines ignore jobs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Contract
from fabricctl.replay.calibrate import cost_pace
from fabricctl.replay.fleet import SimFleet
from fabricctl.replay.jobs import JobSpec
from fabricctl.replay.workload import ReplayItem

PACE_SAMPLE = 256  # items of a model's first arrivals the cost model's pace is taken on


class Policy(Protocol):
    """Why: one seam, so the loop treats every scheduler alike."""

    name: str

    def attach(self, sim: SimFleet) -> None: ...
    def arrive(self, r: ReplayItem, now: float) -> None: ...
    def feed(self, g: int, now: float) -> None: ...
    def finished(self, g: int, r: ReplayItem, tag: object, now: float) -> None: ...
    def tick(self, now: float) -> None: ...
    def figures(self) -> dict[str, float | None]: ...


class _Base:
    name = "base"

    def attach(self, sim: SimFleet) -> None:
        self.sim = sim

    def feed(self, g: int, now: float) -> None:
        return None

    def finished(self, g: int, r: ReplayItem, tag: object, now: float) -> None:
        return None

    def tick(self, now: float) -> None:
        return None

    def figures(self) -> dict[str, float | None]:
        return {"padding_waste": 0.0, "thrash_events": None}


class RoundRobin(_Base):
    """Why: what a plain load balancer in front of vLLM servers does."""

    name = "round-robin"

    def __init__(self) -> None:
        self.i = 0

    def arrive(self, r: ReplayItem, now: float) -> None:
        g = self.i % len(self.sim.gpus)
        self.i += 1
        self.sim.submit(g, r, now)


class PrefixAffinity(_Base):
    """Why: what cache-aware routers do: stick a prefix to a GPU, spill when it is overloaded."""

    name = "prefix-affinity"

    def __init__(self, rel: float = 1.25, slack: int = 32) -> None:
        self.rel, self.slack = rel, slack
        self.last: dict[tuple[str, int], int] = {}

    def arrive(self, r: ReplayItem, now: float) -> None:
        gpus = self.sim.gpus
        loads = [g.queued + len(g.running) for g in gpus]
        least = min(range(len(gpus)), key=loads.__getitem__)
        g = self.last.get(r.shape)
        if g is None or loads[g] > self.rel * loads[least] + self.slack:
            g = least
        self.last[r.shape] = g
        self.sim.submit(g, r, now)


def pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class Pow2Buckets(_Base):
    """Why: the fixed-bucket batching the seed replaced: no shapes, padding to powers of two."""

    name = "pow2-buckets"

    def __init__(self, max_batch_size: int, max_batch_tokens: int) -> None:
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self.buckets: dict[int, deque[ReplayItem]] = {}
        self.padded = self.real = 0
        self.out = 1  # output tokens of the last request handed out

    def arrive(self, r: ReplayItem, now: float) -> None:
        self.buckets.setdefault(pow2(r.tokens), deque()).append(r)

    def feed(self, g: int, now: float) -> None:
        while self.buckets and self.sim.wants(g, self.out):
            self._feed_one(g, now)

    def _feed_one(self, g: int, now: float) -> None:
        size = max(self.buckets, key=lambda b: len(self.buckets[b]))
        q = self.buckets[size]
        n = 0
        while q and n < self.max_batch_size and (n == 0 or (n + 1) * size <= self.max_batch_tokens):
            r = q.popleft()
            self.out = r.item.max_tokens
            self.real += r.tokens
            self.sim.submit(g, r, now)
            n += 1
        self.padded += n * size
        if not q:
            del self.buckets[size]

    def figures(self) -> dict[str, float | None]:
        waste = 1 - self.real / self.padded if self.padded else 0.0
        return {"padding_waste": waste, "thrash_events": None}


class Edf(_Base):
    """Why: the deadline-aware queue a user would put in front of the GPUs, to compare
    fabric's windows with."""

    name = "edf"

    def __init__(self, jobs: Mapping[int, JobSpec] | None = None) -> None:
        self.jobs = dict(jobs or {})
        self.queues: dict[int, deque[ReplayItem]] = {}  # job -> its requests waiting
        self.out = 1  # output tokens of the last request handed out

    def urgency(self, job: int) -> tuple[int, float, float]:
        spec = self.jobs.get(job)
        if spec is None:
            return 0, math.inf, 0.0
        deadline = spec.deadline
        return -spec.priority, math.inf if deadline is None else deadline, spec.arrival

    def arrive(self, r: ReplayItem, now: float) -> None:
        self.queues.setdefault(r.item.job, deque()).append(r)

    def feed(self, g: int, now: float) -> None:
        while self.queues and self.sim.wants(g, self.out):
            job = min(self.queues, key=self.urgency)
            q = self.queues[job]
            r = q.popleft()
            if not q:
                del self.queues[job]
            self.out = r.item.max_tokens
            self.sim.submit(g, r, now)


class Fabric(_Base):
    """Why: the broker under test (its real core, memory mode), one consumer per GPU."""

    def __init__(self, cfg: CoreConfig, max_batch_size: int, max_batch_tokens: int,
                 max_input_len: int, prewarm: bool = True, name: str = "fabric",
                 jobs: Mapping[int, JobSpec] | None = None, job_terms: bool = True) -> None:
        self.name = name
        self.jobs = dict(jobs or {}) if job_terms else {}
        self.last_of_job: dict[int, str] = {}  # job -> the id of its last item to arrive
        self.announced: set[int] = set()
        self.broker = Broker(cfg)
        self.limits = (max_batch_size, max_batch_tokens, max_input_len)
        self.prewarm_on = prewarm
        self.by_id: dict[str, ReplayItem] = {}
        self.outstanding: dict[int, int] = {}
        self.models: list[str] = []
        self.out = 1  # the output-token limit of the last batch handed out

    def attach(self, sim: SimFleet) -> None:
        super().attach(sim)
        self.models = sorted({r.item.model for r in sim.items})
        if self.jobs:
            for r in sorted(sim.items, key=lambda r: r.arrival):
                self.last_of_job[r.item.job] = r.item.id
        self.gpu_of: dict[str, int] = {}
        for g in range(len(sim.gpus)):
            for m in self.models:
                self.gpu_of[f"gpu{g}:{m}"] = g
                self.broker.register(f"gpu{g}:{m}", Contract(m, *self.limits), 0.0)
        if self.jobs and sim.gpus:  # the cost model's pace: the forecast's prior
            costs = sim.gpus[0].costs
            for m in self.models:
                first = sorted((r for r in sim.items if r.item.model == m),
                               key=lambda r: r.arrival)[:PACE_SAMPLE]
                pace = cost_pace(costs, [(r.hashes, r.tokens, r.item.max_tokens)
                                         for r in first], costs.max_num_seqs)
                if pace is not None:
                    self.broker.restore_paces({m: pace})

    def arrive(self, r: ReplayItem, now: float) -> None:
        self.by_id[r.item.id] = r
        spec = self.jobs.get(r.item.job)
        if spec is not None and spec.number not in self.announced:
            self.announced.add(spec.number)
            self.broker.set_job_terms(spec.number, spec.terms())
        self.broker.ingest([r.item], now)
        if spec is not None and self.last_of_job.get(spec.number) == r.item.id:
            self.broker.set_job_terms(spec.number, spec.terms(sealed=True))

    def feed(self, g: int, now: float) -> None:
        while self.sim.wants(g, self.out) and self._pull(g, now):
            pass

    def _pull(self, g: int, now: float) -> bool:
        for m in self.models:
            batch = self.broker.pull(f"gpu{g}:{m}", now)
            self._signals(now)
            if batch is None:
                continue
            self.outstanding[batch.id] = len(batch.entries)
            self.out = batch.max_tokens
            for e in batch.entries:
                assert e.item is not None
                self.sim.submit(g, self.by_id[e.item.id], now, max_tokens=batch.max_tokens,
                                tag=batch.id)
            return True
        return False

    def _signals(self, now: float) -> None:
        for sig in self.broker.take_signals():
            if not self.prewarm_on:
                continue
            shape = self.broker.models[sig.model].open.get(sig.signature)
            sample = next((lane.queue[0].item for lane in shape.lanes.lanes.values()
                           if lane.queue), None) if shape else None
            if sample is None:
                continue
            r = self.by_id[sample.id]
            for name in self.broker.prewarm_targets(sig):
                self.sim.prewarm(self.gpu_of[name], r, now)

    def finished(self, g: int, r: ReplayItem, tag: object, now: float) -> None:
        batch_id = int(tag)  # type: ignore[call-overload]
        self.outstanding[batch_id] -= 1
        if self.outstanding[batch_id] == 0:
            del self.outstanding[batch_id]
            self.broker.complete(batch_id, now)
            self._signals(now)

    def tick(self, now: float) -> None:
        self.broker.tick(now)
        self._signals(now)

    def figures(self) -> dict[str, float | None]:
        return {"padding_waste": self.broker.waste(),
                "midstream_switches": float(sum(
                    ms.midstream_switches for ms in self.broker.models.values())),
                "thrash_events": float(self.broker.batches_hist.thrashed)}
