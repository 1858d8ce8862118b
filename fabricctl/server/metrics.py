"""Prometheus metrics of the broker, read from its live state at scrape time.

Contract: `Metrics(view).registry` holds a collector that turns the core's counters (read
through the store's `CoreView`), ledger, shape states, lanes and consumers into
`fabricctl_*` families on every scrape (no bookkeeping on the hot path); with `live_jobs`
(number -> id of the jobs not ended) and `clock`, also each live job's place in the fleet
(`core.forecast`): `fabricctl_job_queue_age_seconds`, `fabricctl_job_holders`,
`fabricctl_job_share` and `fabricctl_job_queued_items`, labelled `job_id`, one label set per
live job (a job that ended is in no later scrape, so the label cardinality is the live
jobs), and `fabricctl_jobs_at_risk`, the jobs predicted to finish after their deadline; with
`mixes` (id -> items per endpoint of the jobs not ended), `fabricctl_job_items{job_id,
endpoint}`: each live job's accepted items per endpoint (`core.mix`: completions, chat,
embeddings, score, rerank, responses, transcriptions, unknown; only those with items, so at
most eight label sets per live job); per consumer, each name its server answers
(`fabricctl_consumer_names{consumer, model, name}`: 1 for the one it pulls from now) and its
moves between them (`fabricctl_consumer_name_switches`); plus a pull-latency histogram and
per-consumer batch/token counters that the server feeds. `serve(host, port)` answers `GET
/metrics` on the event loop itself, so a scrape never reads broker state from another
thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from fabricctl import __version__
from fabricctl.core.mix import ENDPOINT_ORDER
from fabricctl.core.signature import signature_hex
from fabricctl.core.stats import BATCH_BUCKETS
from fabricctl.core.types import Work

if TYPE_CHECKING:
    from fabricctl.store.view import CoreView


class BrokerCollector(Collector):
    """Why: scrape-time reads keep the dispatch path free of metric updates."""

    def __init__(self, view: CoreView, live_jobs: Callable[[], dict[int, str]] | None = None,
                 clock: Callable[[], float] = time.time,
                 mixes: Callable[[], dict[str, dict[str, int]]] | None = None) -> None:
        self.view = view
        self.live_jobs = live_jobs
        self.clock = clock
        self.mixes = mixes

    def collect(self) -> Iterator[Metric]:
        yield from self.core_families()
        if self.live_jobs is not None:
            yield from self.job_families(self.live_jobs())
        if self.mixes is not None:
            yield self.mix_family(self.mixes())

    @staticmethod
    def mix_family(mixes: dict[str, dict[str, int]]) -> Metric:
        """Each live job's accepted items per endpoint (those with items)."""
        fam = GaugeMetricFamily("fabricctl_job_items", "per live job: items accepted, by the "
                                "endpoint their requests go to", labels=["job_id", "endpoint"])
        for job_id, counts in sorted(mixes.items()):
            for endpoint in ENDPOINT_ORDER:
                if counts.get(endpoint):
                    fam.add_metric([job_id, endpoint], float(counts[endpoint]))
        return fam

    def job_families(self, live: dict[int, str]) -> Iterator[Metric]:
        """Each live job's queue age, holders, share and queued items, and the count of jobs
        predicted to miss their deadline. Label sets: the live jobs (and items with no job,
        `job_id` "none", while they wait), so an ended job leaves the exposition."""
        views = {v.job: v for v in self.view.job_views(self.clock())}
        families = [
            (GaugeMetricFamily("fabricctl_job_queue_age_seconds", "per live job: how long its "
                               "oldest queued item has waited", labels=["job_id"]),
             "oldest_wait_s"),
            (GaugeMetricFamily("fabricctl_job_holders", "per live job: consumers whose current "
                               "shape holds its items", labels=["job_id"]), "holders"),
            (GaugeMetricFamily("fabricctl_job_share", "per live job: its holders' share of the "
                               "consumers", labels=["job_id"]), "share"),
            (GaugeMetricFamily("fabricctl_job_queued_items", "per live job: items queued",
                               labels=["job_id"]), "queued_items"),
        ]
        numbers = sorted(set(live) | ({0} & set(views)))
        for n in numbers:
            v = views.get(n)
            for fam, field in families:
                fam.add_metric([live.get(n, "none")], float(getattr(v, field)) if v else 0.0)
        for fam, _ in families:
            yield fam
        yield GaugeMetricFamily("fabricctl_jobs_at_risk", "live jobs predicted to finish after "
                                "their deadline at the measured rate",
                                value=sum(v.at_risk for n, v in views.items() if n in live))

    def core_families(self) -> Iterator[Metric]:
        core = self.view
        lg = core.ledger
        for what, unit in (("items", ""), ("tokens", "")):
            for stage in ("received", "routed", "queued", "inflight", "completed"):
                name = f"fabricctl_{what}_{stage}"
                value = getattr(lg, f"{what}_{stage}")
                if stage in ("received", "routed", "completed"):
                    yield CounterMetricFamily(name, f"{what} {stage}{unit}", value=value)
                else:
                    yield GaugeMetricFamily(name, f"{what} {stage}", value=value)
        di, dt = lg.difference()
        g = GaugeMetricFamily("fabricctl_ledger_difference", "received - routed - queued; "
                              "must be 0", labels=["unit"])
        g.add_metric(["items"], di)
        g.add_metric(["tokens"], dt)
        yield g
        shapes = core.shapes()
        states = GaugeMetricFamily("fabricctl_shapes", "live shapes by state", labels=["state"])
        counts: dict[str, int] = {}
        for s in shapes:
            counts[s.state.value] = counts.get(s.state.value, 0) + 1
        for st in ("staged", "warming", "active", "draining"):
            states.add_metric([st], counts.get(st, 0))
        yield states
        yield CounterMetricFamily("fabricctl_shapes_finished", "shapes finished",
                                  value=core.batches_hist.total)
        sw = CounterMetricFamily("fabricctl_shape_switches", "shape activations replacing "
                                 "another", labels=["model"])
        for ms in core.models.values():
            sw.add_metric([ms.name], ms.switches)
        yield sw
        lc = core.lane_counters
        yield GaugeMetricFamily("fabricctl_lanes_in_use", "lanes in use",
                                value=sum(len(s.lanes) for s in shapes))
        yield CounterMetricFamily("fabricctl_lane_reuses", "items into existing lanes",
                                  value=lc.reuses)
        yield CounterMetricFamily("fabricctl_new_lanes", "lanes opened", value=lc.new_lanes)
        yield CounterMetricFamily("fabricctl_lane_releases", "lane ids returned",
                                  value=lc.releases)
        yield GaugeMetricFamily("fabricctl_starving_lanes", "lanes whose oldest item waited "
                                "past the starvation limit", value=core.starving_lanes)
        waste = GaugeMetricFamily("fabricctl_waste_fraction", "padding fraction per shape",
                                  labels=["model", "shape", "label"])
        for s in shapes:
            waste.add_metric([s.model, signature_hex(s.signature), s.label], s.waste())
        yield waste
        audit = GaugeMetricFamily("fabricctl_cache_audit", "per shape: engines' real KV hit "
                                  "rate, the achievable one, and 1 when flagged",
                                  labels=["model", "shape", "label", "figure"])
        for s in shapes:
            real, achievable, flagged = s.audit()
            key = [s.model, signature_hex(s.signature), s.label]
            audit.add_metric([*key, "hit_rate"], real)
            audit.add_metric([*key, "achievable"], achievable)
            audit.add_metric([*key, "flagged"], float(flagged))
        yield audit
        hist = core.batches_hist
        yield CounterMetricFamily("fabricctl_thrash_events", "shapes that thrashed: under "
                                  "the thrash line, their prefix staged again",
                                  value=hist.thrashed)
        buckets, acc = [], 0
        for le, c in zip(BATCH_BUCKETS, hist.counts, strict=False):
            acc += c
            buckets.append((str(le - 1), acc))
        acc += hist.counts[-1]
        buckets.append(("+Inf", acc))
        h = HistogramMetricFamily("fabricctl_batches_per_shape", "batches a shape ran before "
                                  "it finished")
        h.add_metric([], buckets, sum_value=float(sum(hist.samples)))
        yield h
        yield GaugeMetricFamily("fabricctl_consumers_alive", "registered consumers",
                                value=len(core.consumers))
        serving = GaugeMetricFamily("fabricctl_consumer_names", "per consumer and name its "
                                    "server answers (its model first): 1 for the name it "
                                    "pulls from now, else 0", labels=["consumer", "model",
                                                                      "name"])
        moves = CounterMetricFamily("fabricctl_consumer_name_switches", "a consumer's moves "
                                    "from one name to another (each a shape switch)",
                                    labels=["consumer", "model"])
        for con in core.consumers.values():
            model = con.contract.model
            for name in con.contract.served():
                serving.add_metric([con.name, model, name], float(name == con.serving))
            moves.add_metric([con.name, model], con.name_switches)
        yield serving
        yield moves


class Metrics:
    """Why: one registry per broker, so several brokers in one test process don't collide."""

    def __init__(self, view: CoreView, live_jobs: Callable[[], dict[int, str]] | None = None,
                 clock: Callable[[], float] = time.time,
                 mixes: Callable[[], dict[str, dict[str, int]]] | None = None) -> None:
        self.version = __version__
        self.registry = CollectorRegistry()
        self.registry.register(BrokerCollector(view, live_jobs, clock, mixes))
        self.pull_latency = Histogram(
            "fabricctl_pull_latency_seconds", "time from a pull request to its batch",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=self.registry)
        self.batches = Counter("fabricctl_consumer_batches", "batches completed per consumer",
                               ["consumer"], registry=self.registry)
        self.tokens = Counter("fabricctl_consumer_items", "items completed per consumer",
                              ["consumer"], registry=self.registry)
        self.submitted_items = Counter("fabricctl_submitted_items", "items acknowledged",
                                       registry=self.registry)
        self.latencies: list[float] = []  # recent pull latencies (s), for benches and top

    def pulled(self, seconds: float, work: Work) -> None:
        self.pull_latency.observe(seconds)
        self.latencies.append(seconds)
        if len(self.latencies) > 100_000:
            del self.latencies[:50_000]

    def completed(self, consumer: str, items: int, stored: int) -> None:
        if stored >= 0:
            self.batches.labels(consumer).inc()
            self.tokens.labels(consumer).inc(items)

    def submitted(self, items: int) -> None:
        self.submitted_items.inc(items)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, host: str, port: int) -> asyncio.AbstractServer:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                request = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                ok = request.split(b" ")[1:2] in ([b"/metrics"], [b"/"])
                body = self.render() if ok else b"not found\n"
                status = b"200 OK" if ok else b"404 Not Found"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: "
                             + CONTENT_TYPE_LATEST.encode() + b"\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                await writer.drain()
            except (ConnectionError, IndexError):
                pass
            finally:
                writer.close()

        return await asyncio.start_server(handle, host, port)
