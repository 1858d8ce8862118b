"""Deterministic synthetic snapshots: fixtures for screenshots and load for the benchmark.

Contract: `make_snapshot(shapes, lanes, seed=..., t=...)` builds a plausible `Snapshot`
(one model per 25 shapes, each with a current shape (active, or draining on odd models),
a warming one and staged ones, `lanes` lanes each, events including thrash events,
engines with prefix-cache stats, NVML available or not) from a seeded RNG only: the same
arguments give the same snapshot, and a shape's signature depends only on its index.
`newcomer=True` makes it look like the README's example workload on the simulator: labels
as long as `support-0/fewshot-2/tools-1`, each consumer pulling from one shape with the next
one warming for it, long force-drain and guard reasons, and a live job with its place in
the fleet (its predicted finish `NEWCOMER_FINISH_IN` s after `t`).
`SyntheticSource` streams such snapshots through msgpack (as the wire does, so decoding
costs what it costs with a broker), one every `interval`, cycling through a few
pre-encoded variants, with lane lists only for the shapes subscribed (or all).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from fabricctl.core.events import Event, EventKind
from fabricctl.core.forecast import JobView
from fabricctl.core.jobs import JobRecord, new_job, seal
from fabricctl.core.ledger import Ledger
from fabricctl.core.snapshot import (
    BatchesHistogramView,
    ConsumerView,
    Counters,
    LaneView,
    ModelView,
    ShapeView,
    Snapshot,
)
from fabricctl.core.stats import BATCH_BUCKETS


def _lanes(rng: random.Random, n: int, starve_s: float) -> list[LaneView]:
    out = []
    for k in range(n):
        items = rng.choice((0, 1, 2, 3, 5, 8, 13, 40))
        age = round(rng.random() * 45, 3) if items else 0.0
        out.append(LaneView(k, 64 + 8 * k, items, items * (60 + 8 * k),
                            round(rng.random() * 0.12, 4), age, age > starve_s,
                            items < 4 and rng.random() < 0.2, rng.choice((0, 0, 0, 8))))
    return out


def _shape(rng: random.Random, k: int, lanes: int, with_lanes: bool) -> ShapeView:
    j, current = k % 25, ("active", "draining")[k // 25 % 2]
    state = current if j == 0 else ("warming" if j == 1 else "staged")
    lane_list = _lanes(rng, lanes, 30.0)
    tokens = sum(la.tokens for la in lane_list) or rng.randrange(1000, 90_000)
    return ShapeView(
        f"model-{k // 25}", random.Random(k).getrandbits(64), f"shape-{k:03d}", state,
        (k % 25) + 1 if state != "staged" else 0, tokens, sum(la.items for la in lane_list),
        0, 0, lanes, rng.randrange(0, 400) if state != "staged" else 0,
        round(rng.random() * 0.08, 4), round(rng.random() * 600, 3),
        round(0.01 + 0.09 * lanes / 2048, 4), sum(la.starving for la in lane_list),
        {"p50": 512.0, "p90": 1800.0}, [], lane_list if with_lanes else None)


def _extra(rng: random.Random, t: float, consumers: list[str], nvml: bool) -> dict[str, Any]:
    gpus: dict[str, Any] = {"available": False, "reason": "NVML unavailable: "
                            "NVML Shared Library Not Found", "gpus": [], "lost": []}
    if nvml:
        gpus = {"available": True, "driver_version": "570.86", "lost": [], "gpus": [
            {"uuid": f"GPU-{g}", "index": g, "name": "NVIDIA H200", "utilization_gpu": 87 - g,
             "memory_used": (90 + g) * 2**30, "memory_total": 141 * 2**30,
             "temperature_c": 61 + g, "power_w": 512.0 + g} for g in range(len(consumers))]}
    engines = {
        name: {"gpu": g, "engine": "vllm" if nvml else "sim", "simulated": not nvml,
               "last_seen": t - 0.4 - g * 0.1,
               "stats": {"prefix_cache_queries": 100_000, "prefix_cache_hits": 99_100 - g * 500,
                         "prompt_tokens": int(t * 9000) + rng.randrange(0, 9000) + g,
                         "generation_tokens": int(t * 1000)}}
        for g, name in enumerate(consumers)}
    return {"gpus": gpus, "engines": engines, "store": {"used_bytes": 1 << 30}}


def _events(rng: random.Random, t: float, shapes: list[ShapeView], n: int) -> list[Event]:
    out = []
    for k in range(n):
        s = shapes[k % len(shapes)] if shapes else None
        model, sig, label = (s.model, s.signature, s.label) if s else ("m", 0, "")
        when = round(t - (n - k) * 1.5, 3)
        if k % 9 == 4:
            out.append(Event(k + 1, when, EventKind.THRASH, model, sig, label, value=12,
                             critical=True, reason="finished after 12 batches (< 100)"))
        elif k % 9 == 7:
            out.append(Event(k + 1, when, EventKind.PREWARM, model, sig, label, value=3,
                             reason="4 lanes"))
        else:
            out.append(Event(k + 1, when, EventKind.TRANSITION, model, sig, label,
                             src="staged", dst="active", reason="threshold", value=2))
    return out


NEWCOMER_LABELS = ("support-0/fewshot-2/tools-1", "legal-1/fewshot-0/tools-2",
                   "support-1/fewshot-1/tools-0", "legal-0/fewshot-2/tools-1")
NEWCOMER_FINISH_IN = 21.0
NEWCOMER_JOB = "batch_2c08525"


def _newcomer_events(t: float, shapes: list[ShapeView]) -> list[Event]:
    """Events whose reasons are longer than any terminal line: force-drains of many lanes,
    a guard, a thrash, transitions."""
    out: list[Event] = []
    for k, s in enumerate(shapes * 2):
        when = round(t - 20 + k * 0.8, 3)
        if k % 4 == 0:
            out.append(Event(k + 1, when, EventKind.FORCE_DRAIN, s.model, s.signature, s.label,
                             value=3, count=17, reason=f"force-drained 17 lanes, {412 + k} items"
                             " after the shape's oldest lane waited past its starvation bound"))
        elif k % 4 == 1:
            out.append(Event(k + 1, when, EventKind.GUARD, s.model, s.signature, s.label,
                             critical=True, reason="prefix-cache hit rate 12.5% of 81.0% "
                             "achievable over the last 40 batches: the engine evicts the "
                             "shape's prefix between batches"))
        elif k % 4 == 2:
            out.append(Event(k + 1, when, EventKind.THRASH, s.model, s.signature, s.label,
                             value=7, critical=True, reason="finished after 7 batches (< 100)"))
        else:
            out.append(Event(k + 1, when, EventKind.TRANSITION, s.model, s.signature, s.label,
                             src="staged", dst="active", reason="threshold", value=2))
    return out


def _newcomer_job(t: float) -> tuple[list[JobRecord], list[JobView]]:
    """A live job of the example workload (with its place: predicted to finish
    `NEWCOMER_FINISH_IN` s after `t`) and an earlier, completed one."""
    live = new_job(2, NEWCOMER_JOB, "submit", t - 2.6, name="-")
    live.total, live.completed = 20_000, 10_853
    live.endpoints = {"completions": 20_000}
    seal(live, 20_000, t - 2.0)
    done = new_job(1, "batch_1d91224", "submit", t - 60, name="-")
    done.total, done.completed = 20_000, 20_000
    done.endpoints = {"completions": 20_000}
    seal(done, 20_000, t - 55)
    seal(done, 20_000, t - 40)  # finalizing -> completed
    place = JobView(2, 0, None, 9_147, 9_700_000, 2.6, 2, 1.0, t + NEWCOMER_FINISH_IN)
    return [live, done], [place]


def make_snapshot(shapes: int = 8, lanes: int = 16, *, seed: int = 7, t: float = 1000.0,
                  lane_shapes: int | None = None, nvml: bool = False, events: int = 20,
                  consumers: int = 2, fleet: bool = False, newcomer: bool = False) -> Snapshot:
    """A deterministic snapshot; only the first `lane_shapes` shapes carry lanes (all: None).
    `fleet`: three GPUs, two servers: one over GPUs 0 and 1 answering a base model and two
    LoRA adapters (pulling from one of them now), one embedder on GPU 2. `newcomer`: see the
    module's contract."""
    rng = random.Random(seed)
    views = [_shape(rng, k, lanes, lane_shapes is None or k < lane_shapes)
             for k in range(shapes)]
    if newcomer:
        views = [msgspec.structs.replace(v, model="fabric-demo",
                                         label=NEWCOMER_LABELS[k % len(NEWCOMER_LABELS)])
                 for k, v in enumerate(views)]
    states = {s: 0 for s in ("staged", "warming", "active", "draining", "finished")}
    for v in views:
        states[v.state] += 1
    states["finished"] = 40
    names = [f"gpu{g}-consumer" for g in range(consumers)]
    models = sorted({v.model for v in views})
    model_views = []
    for m in models:
        cur = next((v for v in views if v.model == m and v.state in ("active", "draining")),
                   None)
        warm = next((v for v in views if v.model == m and v.state == "warming"), None)
        model_views.append(ModelView(m, 16384, cur.signature if cur else None,
                                     cur.state if cur else None,
                                     warm.signature if warm else None, 7, 6, 1))
    queued = sum(v.tokens for v in views)
    ledger = Ledger(5000, queued + 900_000, 1200, queued, 3800, 900_000, 64, 12_000, 3736,
                    888_000)
    counts = [0, 2, 3, 4, 1, 2, 3, 5, 9, 6, 3, 1, 1, 0]
    samples = [rng.choice((7, 30, 64, 150, 420, 1300)) for _ in range(40)]
    consumer_views = [ConsumerView(n, models[0] if models else "m", 16, 16384, 8192, 3, 120,
                                   1900, 400_000, t - 300) for n in names]
    extra = _extra(rng, t, names, nvml)
    if fleet:
        consumer_views = [
            ConsumerView("tp-server", "tiny", 16, 16384, 8192, 3, 120, 1900, 400_000, t - 300,
                         names=["ad-a", "ad-b"], serving="ad-a", name_switches=4),
            ConsumerView("embedder", "embed", 64, 16384, 8192, 1, 90, 5000, 300_000, t - 300)]
        extra = _extra(rng, t, ["tp-server", "gpu1-idle", "embedder"], nvml)
        engines = extra["engines"]
        del engines["gpu1-idle"]
        engines["tp-server"]["gpus"] = [0, 1]
    jobs: list[JobRecord] = []
    places: list[JobView] = []
    event_list = _events(rng, t, views, events)
    if newcomer:
        consumer_views = [msgspec.structs.replace(c, current=views[2 * g].signature,
                                                  next=views[2 * g + 1].signature)
                          for g, c in enumerate(consumer_views)]
        event_list = _newcomer_events(t, views)
        jobs, places = _newcomer_job(t)
    return Snapshot(
        t, views, model_views, consumer_views,
        ledger, (0, 0), states,
        Counters(sum(v.lanes_in_use for v in views), 10, 20, 5, 5, 0, 3, 4000, 40, 15,
                 {"transition": 90, "thrash": 15}),
        BatchesHistogramView(list(BATCH_BUCKETS), counts, samples, 100, thrashed=15),
        event_list, simulated=not nvml, extra=extra, jobs=jobs, job_views=places)


class SyntheticSource:
    """Synthetic snapshots through msgpack every `interval`, as the broker would send them."""

    def __init__(self, shapes: int = 100, lanes: int = 2048, variants: int = 4,
                 all_lanes: bool = False, nvml: bool = True) -> None:
        self.address = f"synthetic {shapes} shapes x {lanes} lanes"
        self.shapes, self.lanes, self.variants = shapes, lanes, variants
        self.all_lanes, self.nvml = all_lanes, nvml
        self._cache: dict[tuple[tuple[str, int], ...], list[bytes]] = {}
        self.sent = 0

    def prepare(self, lanes: list[tuple[str, int]]) -> list[bytes]:
        """The encoded variants for this lane subscription, built once (slow: seconds)."""
        key = tuple(sorted(lanes))
        if key not in self._cache:
            out = []
            for v in range(self.variants):
                snap = make_snapshot(self.shapes, self.lanes, seed=v, t=1000.0 + v,
                                     lane_shapes=None if self.all_lanes else 0, nvml=self.nvml,
                                     events=100, consumers=2)
                want = set(key)
                for k, s in enumerate(snap.shapes):
                    if (s.model, s.signature) in want:
                        s.lanes = _lanes(random.Random(v * 1000 + k), self.lanes, 30.0)
                out.append(msgspec.msgpack.encode(snap))
            self._cache[key] = out
        return self._cache[key]

    async def stream(self, interval: float, lanes: list[tuple[str, int]]) -> AsyncIterator[
            Snapshot]:
        decoder = msgspec.msgpack.Decoder(Snapshot)
        blobs = self.prepare(lanes)
        k = 0
        while True:
            snap = decoder.decode(blobs[k % len(blobs)])
            snap.t = 1000.0 + self.sent * interval
            self.sent += 1
            k += 1
            yield snap
            await asyncio.sleep(interval)
