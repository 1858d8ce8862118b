"""A replay workload: items with arrival times, their block hashes and prefix sizes.

Contract: `load(items, block_size, rate, seed)` turns parsed items into `ReplayItem`s sorted
by arrival: all at t = 0 when `rate` is 0 (an offline batch job), else Poisson arrivals at
`rate` items per simulated second from `seed`. Block hashes come from the payload exactly as
the simulated engine derives them, so every policy sees the same requests. `generated(...)`
builds one from the examples' generator; `distinct_prefix_tokens` is what a workload keeps
alive in a prefix cache.
Jobs (`replay.jobs` has the form): `with_jobs(parsed, specs, block_size, rate, seed)` loads
items each tagged with its job's name (None: no job) and the jobs file's terms: every item
gets its job's number (`Item.job`) and arrives at its job's `arrival`, all at once when `rate`
is 0, else Poisson at `rate` items per second from there, per job; it returns the items and
the jobs by number (empty for a single-job workload, loaded exactly as `load` does).
`job_trace(name)` generates the multi-job traces the replay and `bench/jobs_bench.py` study
(`TRACES`): "small-behind-big" (a big job of four shapes at t = 0, then three one-shape jobs
arriving while it runs) and "deadlines" (three jobs at t = 0 whose windows an order by
tokens alone misses and earliest-deadline-first meets); `windows_trace(ks, t)` is issue 41's form:
equal jobs at t = 0 (two shapes of their own each), windows k x `t` for each k of `ks`
(`t`: one job's time alone, as the caller measured it); `trace_workload(trace)` loads one
through the same reader, job field and jobs-file parser as `fabricctl replay --jobs`; an
unknown trace name is a `UsageError`, a job's bad terms a `WorkloadError` (`replay.jobs`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from fabricctl.core.types import Item
from fabricctl.engines.blocks import decode_item_payload, item_blocks, prefix_tokens
from fabricctl.errors import UsageError
from fabricctl.formats.reader import Parsed, parse_lines
from fabricctl.formats.workload import generate
from fabricctl.replay.jobs import JobSpec, line_job, number_jobs, read_jobs


@dataclass(slots=True)
class ReplayItem:
    """Why: one request as every policy sees it, hashed once."""

    item: Item
    arrival: float
    hashes: list[int]
    tokens: int
    prefix: int  # tokens of its shape's cacheable components

    @property
    def shape(self) -> tuple[str, int]:
        return (self.item.model, self.item.signature)


def load(items: Iterable[Item], block_size: int, rate: float = 0.0, seed: int = 0,
         jobs: Sequence[JobSpec] | None = None) -> list[ReplayItem]:
    """`jobs`: each item's job (numbered), which sets its job number and arrival clock."""
    rng = random.Random(seed)
    clock: dict[int, float] = {}
    out: list[ReplayItem] = []
    for i, item in enumerate(items):
        spec = jobs[i] if jobs is not None else None
        key = spec.number if spec is not None else 0
        t = clock.get(key, spec.arrival if spec is not None else 0.0)
        if rate > 0:
            t += rng.expovariate(rate)
        clock[key] = t
        if spec is not None:
            item.job = spec.number
        chain = item_blocks(item, block_size)
        payload = decode_item_payload(item)
        out.append(ReplayItem(item, t, chain.hashes, chain.tokens,
                              prefix_tokens(payload) if payload else 0))
    return out


def with_jobs(parsed: Sequence[tuple[Item, str | None]], specs: dict[str, JobSpec],
              block_size: int, rate: float = 0.0, seed: int = 0
              ) -> tuple[list[ReplayItem], dict[int, JobSpec]]:
    """Items tagged with their job's name, loaded with their jobs (module docstring)."""
    items = [it for it, _ in parsed]
    if not specs and all(name is None for _, name in parsed):
        return load(items, block_size, rate, seed), {}
    names = [name or "" for _, name in parsed]
    jobs = number_jobs(names, specs)
    loaded = load(items, block_size, rate, seed, [jobs[n] for n in names])
    return loaded, {j.number: j for j in jobs.values()}


def parse_items(lines: Iterable[bytes]) -> list[Item]:
    """Items from JSONL lines exactly as `fabricctl submit` reads them (bad lines dropped)."""
    return [p.item for p in parse_lines(lines) if isinstance(p, Parsed)]


def generated(block_size: int = 16, rate: float = 0.0, seed: int = 0, **workload: Any
              ) -> list[ReplayItem]:
    """A replay workload from `fabricctl.formats.workload.generate(**workload)` (the examples'
    generator), through the same JSONL reader as a real workload."""
    lines = [msgspec.json.encode(d) for d in generate(**workload)]
    return load(parse_items(lines), block_size, rate, seed)


def distinct_prefix_tokens(items: list[ReplayItem], block_size: int = 16) -> int:
    """The cacheable prefix tokens the workload keeps alive: its distinct full prefix blocks
    (shapes that share leading components, e.g. a system prompt, share those blocks)."""
    blocks: set[int] = set()
    done: set[tuple[str, int]] = set()
    for r in items:
        if r.shape not in done:
            done.add(r.shape)
            blocks.update(r.hashes[: r.prefix // block_size])
    return len(blocks) * block_size


# -- multi-job traces -------------------------------------------------------------------------

TRACES = ("small-behind-big", "deadlines")
TRACE_COMMON = {"prefix_tokens": 2048, "median_tokens": 64, "max_tokens": 8}


@dataclass(slots=True)
class Trace:
    """Why: a multi-job workload as its two files hold it: the lines and the jobs."""

    name: str
    lines: list[dict[str, Any]]  # native workload lines, each with its "job"
    jobs: list[dict[str, Any]]  # the jobs file's objects


def _job_lines(job: str, seed: int, **kw: Any) -> list[dict[str, Any]]:
    """A job's lines from the examples' generator: its own shapes (the seed draws their
    texts), ids prefixed by the job's name."""
    return [{**d, "job": job} for d in generate(seed=seed, id_prefix=f"{job}-",
                                                 **{**TRACE_COMMON, **kw})]


def job_trace(name: str, scale: float = 1.0) -> Trace:
    """One of `TRACES`, its item counts times `scale`."""
    def n(k: int) -> int:
        return max(1, round(k * scale))

    if name == "small-behind-big":
        lines = _job_lines("big", 101, items=n(4000), shapes=4, zipf_s=0.0)
        jobs: list[dict[str, Any]] = [{"job": "big", "arrival": 0.0}]
        for k, at in enumerate((2.0, 4.0, 6.0), 1):
            lines += _job_lines(f"small-{k}", 200 + k, items=n(150), shapes=1)
            jobs.append({"job": f"small-{k}", "arrival": at * scale})
        return Trace(name, lines, jobs)
    if name == "deadlines":
        lines = (_job_lines("bulk", 301, items=n(3000), shapes=2, zipf_s=0.0)
                 + _job_lines("report", 302, items=n(800), shapes=1)
                 + _job_lines("alert", 303, items=n(300), shapes=1))
        jobs = [{"job": "bulk", "window_s": 30.0 * scale},
                {"job": "report", "window_s": 8.0 * scale},
                {"job": "alert", "window_s": 3.0 * scale}]
        return Trace(name, lines, jobs)
    raise UsageError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")


def windows_trace(ks: Sequence[float], t: float, items: int = 300) -> Trace:
    """Equal jobs "w0", "w1", ... of `items` each (two shapes of their own, one seed each)
    at t = 0, job k's window `ks[k]` x `t` seconds."""
    lines: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    for k, factor in enumerate(ks):
        lines += _job_lines(f"w{k}", 400 + k, items=items, shapes=2, zipf_s=0.0)
        jobs.append({"job": f"w{k}", "window_s": round(factor * t, 6)})
    return Trace("windows", lines, jobs)


def trace_workload(trace: Trace, block_size: int = 16, rate: float = 0.0, seed: int = 0
                   ) -> tuple[list[ReplayItem], dict[int, JobSpec]]:
    """A trace loaded as `fabricctl replay WORKLOAD --jobs JOBS` loads its two files."""
    raw = [msgspec.json.encode(d) for d in trace.lines]
    parsed = [(p.item, line_job(raw[p.line_no - 1])) for p in parse_lines(raw)
              if isinstance(p, Parsed)]
    specs = read_jobs(msgspec.json.encode(j) for j in trace.jobs)
    return with_jobs(parsed, specs, block_size, rate, seed)
