"""Memory-mode broker throughput: ingest -> pull -> complete on one core.

A synthetic workload of `--shapes` shapes (default 20) of one model, with Zipf shape popularity
and lognormal input lengths (median ~500 tokens, sigma 0.6). Producers send chunks of items
while fewer than `--backlog` are queued; `--consumers` consumers (2-4, contracts of up to
256 items / 65536 tokens) each pull and complete `--rounds` batches per step of a fake clock
that advances 10 ms a step, with the 1 s maintenance tick. Only time inside the broker counts;
the items are generated before the clock starts (`--stream` generates them between steps
instead, which keeps memory flat but lets generation evict the broker's data from the caches).
The target is >= 300,000 items/s.

The floor, so the figure reads the same on any machine: after each run, a plain FIFO that does
no shaping (`collections.deque`) takes the same items through the same loop (chunks while
fewer than `--backlog` are queued, `--rounds` pulls per consumer a step), each pull popping a
batch of the core's own mean batch size from that run and each complete booking it out of a
dict of batches in flight (items and tokens counted, as the ledger does).
`fifo_floor_items_per_s` is its rate, `core_vs_fifo_floor` the core's items/s as a ratio of
it (target >= 0.5x; with `--repeat`, the ratio of the fastest run); `core_vs_fifo_floor_cpu`
is the same ratio per CPU second (steadier on a busy host).

A second floor says how much of the gap is Python's and how much the core's logic: the
shaped floor (`shaped_floor`) does, in the same loop, only what any shaped broker written in
Python must do per item (group a chunk by signature, one `Entry` per item, its lane by
bisection, an append; pops of a batch off one lane, its longest `max_tokens` and the
signature guard; the complete's counts), with no choice among shapes and no accounting.
`shaped_floor_vs_fifo_floor` is its rate over the FIFO's (about 0.1x on a 2-core box: a
shaped core in Python cannot reach 0.2x of the FIFO whatever its logic costs) and
`core_vs_shaped_floor` the core's over it (about 0.33x: the part of the cost the core's
own logic adds).

    .venv/bin/python bench/core_bench.py                 # a plain table
    .venv/bin/python bench/core_bench.py --json          # exactly one JSON object
    .venv/bin/python bench/core_bench.py --repeat 3      # the best of three runs
    .venv/bin/python bench/core_bench.py --profile       # cProfile hot spots on stderr
    .venv/bin/python bench/core_bench.py --hash --json   # + sha256 of every batch handed out

`--hash` is the same-results check of a change to the core's hot paths: `batches_sha256`
digests every batch as it is handed out (msgpack of the `Batch`: id, consumer, shape, lane,
pad, entries with their items, in order) and the ledger and lane counters at the end; two
trees that dispatch alike print the same digest (the hashing is inside the timed loop).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import math
import pstats
import random
import sys
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat, starmap
from pathlib import Path

import msgspec

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.signature import signature
from fabricctl.core.types import Batch, Contract, Entry, Item

TARGET = 300_000  # items/s
TARGET_VS_FIFO = 0.5  # the core's items/s / the plain FIFO's on the same workload
CONTRACTS = (
    Contract("m", 256, 65536, 8192),
    Contract("m", 128, 32768, 8192),
    Contract("m", 256, 65536, 8192),
    Contract("m", 64, 16384, 4096),
)


@dataclass
class Params:
    """One run's workload."""

    items: int = 1_000_000
    consumers: int = 3
    shapes: int = 20
    chunk: int = 4096
    backlog: int = 100_000
    rounds: int = 4
    seed: int = 1
    stream: bool = False
    hash: bool = False  # digest every batch handed out (`batches_sha256`)


@dataclass
class Result:
    """What one run measured."""

    items: int
    seconds: float  # wall time inside the broker
    cpu_seconds: float  # this process's CPU time inside the broker (steadier on a busy host)
    wall_seconds: float  # the whole run, item generation included
    batches: int
    lane_reuses: int
    new_lanes: int
    shapes_finished: int
    thrash_events: int
    switches: int
    waste: float
    ledger_difference: tuple[int, int]
    fifo_items_per_s: float = 0.0  # the plain FIFO floor on the same workload (`fifo_floor`)
    fifo_items_per_cpu_s: float = 0.0  # the same, per CPU second
    shaped_items_per_s: float = 0.0  # the least Python a shaped broker does (`shaped_floor`)
    shaped_items_per_cpu_s: float = 0.0  # the same, per CPU second
    batches_sha256: str = ""  # with --hash: every batch handed out, then the counters

    def as_dict(self) -> dict[str, object]:
        s = self.seconds or 1e-9
        return {
            "items": self.items,
            "seconds": round(self.seconds, 4),
            "items_per_s": round(self.items / s),
            "fifo_floor_items_per_s": round(self.fifo_items_per_s),
            "core_vs_fifo_floor": round(self.items / s / (self.fifo_items_per_s or 1e-9), 3),
            "fifo_floor_items_per_cpu_s": round(self.fifo_items_per_cpu_s),
            "core_vs_fifo_floor_cpu": round(self.items / (self.cpu_seconds or 1e-9)
                                            / (self.fifo_items_per_cpu_s or 1e-9), 3),
            "shaped_floor_items_per_s": round(self.shaped_items_per_s),
            "shaped_floor_vs_fifo_floor": round(self.shaped_items_per_s
                                                / (self.fifo_items_per_s or 1e-9), 3),
            "core_vs_shaped_floor": round(self.items / s / (self.shaped_items_per_s or 1e-9), 3),
            "core_vs_shaped_floor_cpu": round(self.items / (self.cpu_seconds or 1e-9)
                                              / (self.shaped_items_per_cpu_s or 1e-9), 3),
            "cpu_seconds": round(self.cpu_seconds, 4),
            "wall_seconds": round(self.wall_seconds, 4),
            "items_per_cpu_s": round(self.items / (self.cpu_seconds or 1e-9)),
            "lane_reuses_per_s": round(self.lane_reuses / s),
            "new_lanes_per_s": round(self.new_lanes / s, 2),
            "lane_reuses": self.lane_reuses,
            "new_lanes": self.new_lanes,
            "batches": self.batches,
            "items_per_batch": round(self.items / max(self.batches, 1), 1),
            "waste": round(self.waste, 4),
            "shapes_finished": self.shapes_finished,
            "thrash_events": self.thrash_events,
            "switches": self.switches,
            "ledger_difference": list(self.ledger_difference),
        } | ({"batches_sha256": self.batches_sha256} if self.batches_sha256 else {})


def chunks(p: Params) -> Iterator[list[Item]]:
    """The workload: Zipf-popular shapes (s = 1), lognormal lengths (median 500, sigma 0.6)."""
    rng = random.Random(p.seed)
    sigs = [signature([f"system prompt {k}", f"few-shot block {k}"]) for k in range(p.shapes)]
    weights = [1.0 / (k + 1) for k in range(p.shapes)]
    mu = math.log(500)
    for start in range(0, p.items, p.chunk):
        n = min(p.chunk, p.items - start)
        keys = rng.choices(sigs, weights=weights, k=n)
        yield [Item(f"q{start + k}", "m", sig, max(1, int(rng.lognormvariate(mu, 0.6))), 128)
               for k, sig in enumerate(keys)]


def fifo_floor(p: Params, batch_size: int) -> tuple[float, float]:
    """(items/s, items per CPU second) of a plain FIFO with no shaping on the same workload
    and loop: a deque, pulls of `batch_size` items, completes booked out of a dict (items and
    tokens counted)."""
    source = chunks(p) if p.stream else iter(list(chunks(p)))
    queue: deque[Item] = deque()
    inflight: dict[int, list[Item]] = {}
    popleft, clock, cpu = queue.popleft, time.perf_counter, time.process_time
    names = range(p.consumers)
    next_id = completed = tokens = 0
    spent = spent_cpu = 0.0
    fresh: list[Item] | None = []
    while fresh is not None or queue:
        if fresh is not None and len(queue) < p.backlog:
            fresh = next(source, None)
        t0, c0 = clock(), cpu()
        if fresh:
            queue.extend(fresh)
            fresh = []
        for _ in range(p.rounds):
            for _ in names:
                if not queue:
                    break
                batch = [popleft() for _ in range(min(batch_size, len(queue)))]  # pull
                next_id += 1
                inflight[next_id] = batch
                done = inflight.pop(next_id)  # complete
                completed += len(done)
                tokens += sum(it.input_tokens for it in done)
        spent += clock() - t0
        spent_cpu += cpu() - c0
    assert completed == p.items and not inflight, (completed, p.items)
    return completed / (spent or 1e-9), completed / (spent_cpu or 1e-9)


LANE_TARGETS = [64 * k for k in range(1, 48)]  # the shaped floor's fixed length lanes


def shaped_floor(p: Params, batch_size: int) -> tuple[float, float]:
    """(items/s, items per CPU second) of the least per-item Python any shaped broker does,
    on the same workload and loop as `fifo_floor`: a chunk grouped by signature, one `Entry`
    per item, its lane by bisection over fixed targets and an append; a pull pops
    `batch_size` entries off the lane it served last while that one has work (else the first
    non-empty lane of the first shape with work) and
    takes their largest `max_tokens` and their signatures (the guard); a complete counts
    items and tokens. No choice, no accounting beyond that: what is left of the core's cost
    once its logic is gone, but not Python's."""
    source = chunks(p) if p.stream else iter(list(chunks(p)))
    shapes: dict[int, list[deque[Entry]]] = {}
    inflight: dict[int, list[Entry]] = {}
    clock, cpu = time.perf_counter, time.process_time
    names = range(p.consumers)
    last = len(LANE_TARGETS) - 1
    next_id = next_key = completed = tokens = queued = out_tokens = 0
    spent = spent_cpu = 0.0
    fresh: list[Item] | None = []
    lane: deque[Entry] | None = None
    while fresh is not None or queued:
        if fresh is not None and queued < p.backlog:
            fresh = next(source, None)
        t0, c0 = clock(), cpu()
        if fresh:
            by_sig: dict[int, list[Item]] = {}
            for it in fresh:
                by_sig.setdefault(it.signature, []).append(it)
            for sig, its in by_sig.items():
                lanes = shapes.get(sig)
                if lanes is None:
                    lanes = shapes[sig] = [deque() for _ in LANE_TARGETS]
                ns = [it.input_tokens for it in its]
                entries = list(map(Entry, range(next_key, next_key + len(its)), ns,
                                   [it.max_tokens for it in its], repeat(0.0), its))
                next_key += len(its)
                for e, n in zip(entries, ns, strict=True):
                    lanes[min(bisect_left(LANE_TARGETS, n), last)].append(e)
            queued += len(fresh)
            fresh = []
        for _ in range(p.rounds):
            for _ in names:
                if not lane:  # the lane it serves ran dry: the next with work (rarely)
                    lane = next((q for lanes in shapes.values() for q in lanes if q), None)
                    if lane is None:
                        break
                batch = list(starmap(lane.popleft, repeat((), min(batch_size, len(lane)))))
                longest = max([e.max_tokens for e in batch])
                if len({e.item.signature for e in batch if e.item is not None}) != 1:
                    raise AssertionError("a batch of two shapes")  # the guard
                next_id += 1
                inflight[next_id] = batch
                out_tokens += longest
                done = inflight.pop(next_id)  # complete
                completed += len(done)
                queued -= len(done)
                tokens += sum([e.tokens for e in done])
        spent += clock() - t0
        spent_cpu += cpu() - c0
    assert completed == p.items and not inflight, (completed, p.items)
    return completed / (spent or 1e-9), completed / (spent_cpu or 1e-9)


def run(p: Params) -> Result:
    result = run_core(p)
    size = max(1, round(result.items / max(result.batches, 1)))
    result.fifo_items_per_s, result.fifo_items_per_cpu_s = fifo_floor(p, size)
    result.shaped_items_per_s, result.shaped_items_per_cpu_s = shaped_floor(p, size)
    return result


def run_core(p: Params) -> Result:
    wall0 = time.perf_counter()
    source = chunks(p) if p.stream else iter(list(chunks(p)))
    broker = Broker(CoreConfig())
    names = [f"gpu{k}" for k in range(p.consumers)]
    for name, contract in zip(names, CONTRACTS, strict=False):
        broker.register(name, contract, 0.0)
    ledger = broker.ledger
    pull, complete, ingest, tick = broker.pull, broker.complete, broker.ingest, broker.tick
    digest = hashlib.sha256() if p.hash else None
    encode = msgspec.msgpack.Encoder().encode
    clock, cpu = time.perf_counter, time.process_time
    now, next_tick, spent, spent_cpu = 0.0, 1.0, 0.0, 0.0
    fresh: list[Item] | None = []
    while fresh is not None or ledger.items_queued or ledger.items_inflight:
        if fresh is not None and ledger.items_queued < p.backlog:  # producers with backpressure
            fresh = next(source, None)
        t0, c0 = clock(), cpu()
        if fresh:
            ingest(fresh, now)
            fresh = []
        for _ in range(p.rounds):
            for name in names:
                batch: Batch | None = pull(name, now)
                if batch is not None:
                    if digest is not None:
                        digest.update(encode(batch))
                    complete(batch.id, now)
        now += 0.01
        if now >= next_tick:
            tick(now)
            next_tick += 1.0
        spent += clock() - t0
        spent_cpu += cpu() - c0
    lc = broker.lane_counters
    if digest is not None:
        digest.update(encode([ledger, lc.reuses, lc.new_lanes, lc.releases, lc.force_fits]))
    return Result(
        items=ledger.items_completed, seconds=spent, cpu_seconds=spent_cpu,
        wall_seconds=time.perf_counter() - wall0, batches=broker.batches_total,
        lane_reuses=lc.reuses, new_lanes=lc.new_lanes,
        shapes_finished=broker.batches_hist.total, thrash_events=broker.batches_hist.thrashed,
        switches=sum(ms.switches for ms in broker.models.values()),
        waste=broker.waste(), ledger_difference=ledger.difference(),
        batches_sha256=digest.hexdigest() if digest is not None else "",
    )


def table(result: dict[str, object]) -> str:
    rows = [(k, f"{v:,}" if isinstance(v, int) else str(v)) for k, v in result.items()]
    rate = result["items_per_s"]
    verdict = "met" if isinstance(rate, int) and rate >= TARGET else "not met"
    rows.append(("target", f"{TARGET:,} items/s: {verdict}"))
    ratio = result["core_vs_fifo_floor"]
    verdict = "met" if isinstance(ratio, float) and ratio >= TARGET_VS_FIFO else "not met"
    rows.append(("target vs FIFO floor", f">= {TARGET_VS_FIFO}x: {verdict}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v:>26}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = Params()
    ap.add_argument("--items", type=int, default=d.items)
    ap.add_argument("--consumers", type=int, default=d.consumers, choices=(2, 3, 4))
    ap.add_argument("--shapes", type=int, default=d.shapes)
    ap.add_argument("--chunk", type=int, default=d.chunk, help="items a producer sends at once")
    ap.add_argument("--backlog", type=int, default=d.backlog,
                    help="producers wait while this many items are queued")
    ap.add_argument("--rounds", type=int, default=d.rounds,
                    help="batches each consumer pulls per 10 ms step")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--stream", action="store_true", help="generate items between steps")
    ap.add_argument("--repeat", type=int, default=1, help="report the fastest of N runs")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--profile", action="store_true", help="cProfile the run (stderr)")
    ap.add_argument("--hash", action="store_true",
                    help="sha256 of every batch handed out (the same-results check)")
    args = ap.parse_args(argv)
    p = Params(args.items, args.consumers, args.shapes, args.chunk, args.backlog, args.rounds,
               args.seed, args.stream, args.hash)
    if args.profile:
        prof = cProfile.Profile()
        result = prof.runcall(run_core, p)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    else:
        result = min((run(p) for _ in range(max(1, args.repeat))), key=lambda r: r.seconds)
    out = result.as_dict()
    print(json.dumps(out) if args.json else table(out))
    return 0 if result.ledger_difference == (0, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
