"""The whole path against a server that answers at once: what fabricctl costs per item.

Contract. One instant OpenAI-compatible server (`bench/path_server.py`: uvicorn, a child
process, vLLM-shaped bodies, keep-alive 5 s as vLLM's) answers every request. For each kind
(`gen`: one-token `/v1/completions` requests; `emb`: `/v1/embeddings` of one short input,
a `--dims`-float vector back), each contract size (`max_batch_size` in `--sizes`) and each
number of consumers (`--consumers`, each its own engine against the same server, as GPUs
behind one address would be), the same N items (OpenAI batch lines; N at least `--items`
and `--windows` windows of every consumer) go through, in turn (`--repeat` rounds, the
fastest of each phase counts; `--phases` picks some):
  plain:  a plain async httpx client, one request per item, as many in flight as the
          consumers' windows together (`WINDOW_BATCHES` x max_batch_size each), its one
          pool sized to them (a request resent on a connection error, as the engine does);
  floor:  the same requests over httpx clients of `POOL_SHARD` connections each (the
          engine's own layout): the best this process does with httpx against this server;
  engine: `OpenAIEngine.run` on prebuilt `Work` batches of max_batch_size items (parsed by
          the producer's reader), each engine keeping `WINDOW_BATCHES` batches in hand as
          its consumer does (/metrics scraped after each batch, as on vLLM);
  run:    `fabricctl.cli.run.run_job` on the batch file, engine "openai", one endpoint per
          consumer: what `fabricctl run --engine openai` does (producer, durable broker,
          consumers, engines, result rows written), timed from the job's open to its last
          result (`serve_s`: start-up left out).
Every request must be answered 200 (every row of the run too). Figures per phase: items/s
(and the run's per GPU: over the consumers), this process's CPU microseconds per item and
the server's. Ratios (the issue's targets): run over plain and over floor, and each size's
run over size 64's (same kind and consumers), by wall rate and by CPU per item (`cpu_`: the
inverse ratio of CPU us per item, which a shared box's load moves less). Where the time
goes, per item, serially (the client side is one process on one core): HTTP (1/floor), the
engine beyond it (1/engine - 1/floor) and producer + broker + consumer (1/run - 1/engine),
in microseconds.

    .venv/bin/python bench/path_bench.py              # a table (sizes 16 64 256 1024)
    .venv/bin/python bench/path_bench.py --quick      # sizes 16 64 256, fewer items
    .venv/bin/python bench/path_bench.py --json       # exactly one JSON object
    .venv/bin/python bench/path_bench.py --sizes 64 1024 --items 12288 --phases engine run
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from path_server import KEEP_ALIVE_S, MODEL, Server

from fabricctl.cli.run import run_job
from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings
from fabricctl.core.types import Item, Work
from fabricctl.engines.base import WINDOW_BATCHES
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.engines.pool import POOL_SHARD
from fabricctl.formats.reader import Parsed, parse_lines

KINDS = {"gen": "/v1/completions", "emb": "/v1/embeddings"}
MAX_LEN = 64  # tokens: every input here is short
PHASES = ("plain", "floor", "engine", "run")
RETRIES = 3  # the plain client's tries of a request on a connection error (as the engine's)


@dataclass
class Case:
    """Why: one row of the table: a kind, a contract size and a fleet size."""

    kind: str
    size: int
    consumers: int
    items: int

    @property
    def window(self) -> int:
        return WINDOW_BATCHES * self.size

    @property
    def in_flight(self) -> int:
        return self.consumers * self.window


def lines(kind: str, n: int) -> list[bytes]:
    """N OpenAI batch lines of one kind, each input distinct."""
    out = []
    for i in range(n):
        body: dict[str, Any] = ({"model": MODEL, "prompt": f"Is review {i} positive? Answer:",
                                 "max_tokens": 1} if kind == "gen"
                                else {"model": MODEL, "input": f"query number {i} of the bench"})
        out.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": KINDS[kind],
                               "body": body}).encode())
    return out


def items_of(raw: list[bytes]) -> list[Item]:
    parsed = [p for p in parse_lines(raw) if isinstance(p, Parsed)]
    assert len(parsed) == len(raw), "a bench line did not parse"
    return [p.item for p in parsed]


async def plain(url: str, case: Case, raw: list[bytes], shard: int = 0) -> float:
    """Seconds for a plain httpx client to send every line's body, `in_flight` at once: one
    client whose pool holds them all, or (`shard`) clients of `shard` connections, each
    request taking a free one's."""
    paths_bodies = [(json.loads(r)["url"], json.loads(r)["body"]) for r in raw]
    todo = iter(paths_bodies)
    bad: list[int] = []
    retries = 0
    n = case.in_flight
    sizes = [min(shard, n - k) for k in range(0, n, shard)] if shard else [n]
    clients = [httpx.AsyncClient(base_url=url, timeout=120.0, verify=False,
                                 limits=httpx.Limits(max_connections=k,
                                                     max_keepalive_connections=k))
               for k in sizes]
    free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for client, k in zip(clients, sizes, strict=True):
        for _ in range(k):
            free.put_nowait(client)

    async def worker() -> None:
        nonlocal retries
        for path, body in todo:
            client = free.get_nowait() if shard else clients[0]
            for attempt in range(RETRIES):
                try:
                    resp = await client.post(path, json=body)
                    break
                except httpx.TransportError:  # a kept connection the server just closed
                    if attempt + 1 == RETRIES:
                        raise
                    retries += 1
            if shard:
                free.put_nowait(client)
            if resp.status_code != 200:
                bad.append(resp.status_code)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(n)))
        took = time.perf_counter() - t0
    finally:
        for client in clients:
            await client.aclose()
    if bad:
        raise SystemExit(f"plain client: {len(bad)} answers not 200, first {bad[0]}")
    if retries:
        print(f"plain client: {retries} requests resent", file=sys.stderr)
    return took


async def engine(url: str, case: Case, raw: list[bytes]) -> float:
    """Seconds for `case.consumers` engines to run the items as batches of `size`, each
    keeping WINDOW_BATCHES batches in hand."""
    items = items_of(raw)
    batches = [Work(k, MODEL, 0, 0, 0, case.size, 1, MAX_LEN, items[i:i + case.size])
               for k, i in enumerate(range(0, len(items), case.size))]
    engines = [OpenAIEngine(url, MODEL, max_batch_size=case.size,
                            max_batch_tokens=case.size * MAX_LEN, max_input_len=MAX_LEN,
                            name=f"openai{g}") for g in range(case.consumers)]
    answered = 0

    async def hand(eng: OpenAIEngine, mine: list[Work]) -> None:
        nonlocal answered
        todo = iter(mine)
        async def one() -> None:
            nonlocal answered
            for work in todo:
                results = await eng.run(work)
                answered += sum(r.error is None for r in results)
        await asyncio.gather(*(one() for _ in range(WINDOW_BATCHES)))

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(hand(eng, batches[g::case.consumers])
                               for g, eng in enumerate(engines)))
        took = time.perf_counter() - t0
    finally:
        for eng in engines:
            await eng.close()
    if answered != len(items):
        raise SystemExit(f"engine: {answered} of {len(items)} items answered")
    return took


async def run(url: str, case: Case, raw: list[bytes], work: Path) -> float:
    """Seconds from the job's open to its last result through `run_job`, engine openai."""
    path = work / f"{case.kind}-{case.size}-{case.consumers}.jsonl"
    path.write_bytes(b"\n".join(raw) + b"\n")
    cfg = AppConfig(engine="openai", model=MODEL, data_dir=work / "unused",
                    vllm=VllmSettings(endpoints=[url] * case.consumers),
                    consumer=ConsumerSettings(max_batch_size=case.size,
                                              max_batch_tokens=case.size * MAX_LEN,
                                              max_input_len=MAX_LEN))
    sink = io.BytesIO()
    errors: list[str] = []
    summary = await run_job(cfg, path, sink, errors=errors.append)
    rows = [json.loads(line) for line in sink.getvalue().splitlines()]
    ok = sum(r["response"] is not None and r["response"]["status_code"] == 200 for r in rows)
    if errors or ok != len(raw):
        raise SystemExit(f"run: {ok} of {len(raw)} rows answered 200; {errors[:2]}")
    return float(summary.serve_s)


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the server process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(server: Server, case: Case, work: Path, repeat: int,
                  only: list[str]) -> dict[str, Any]:
    """The phases in `only`, `repeat` times in turn; per phase the fastest run's figures."""
    raw = lines(case.kind, case.items)
    url = server.url
    phases = {"plain": lambda: plain(url, case, raw),
              "floor": lambda: plain(url, case, raw, POOL_SHARD),
              "engine": lambda: engine(url, case, raw), "run": lambda: run(url, case, raw, work)}
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(repeat):
        for name in only:
            cpu0, srv0 = time.process_time(), server_cpu_s(server.proc.pid)
            took = await phases[name]()
            cpu, srv = time.process_time() - cpu0, server_cpu_s(server.proc.pid) - srv0
            if name not in best or took < best[name][0]:
                best[name] = (took, cpu, srv)
    n = case.items
    rate = {k: n / b[0] for k, b in best.items()}
    us = {k: 1e6 / r for k, r in rate.items()}
    cpu = {k: 1e6 * b[1] / n for k, b in best.items()}
    row: dict[str, Any] = {"kind": case.kind, "max_batch_size": case.size,
                           "consumers": case.consumers, "items": n,
                           "in_flight": case.in_flight}
    for k in best:
        row[f"{k}_items_per_s"] = round(rate[k], 1)
        row[f"{k}_cpu_us_per_item"] = round(cpu[k], 1)
        row[f"{k}_server_cpu_us_per_item"] = round(1e6 * best[k][2] / n, 1)
    if "run" in best:
        row["run_items_per_s_per_gpu"] = round(rate["run"] / case.consumers, 1)
    for a, b in (("run", "plain"), ("engine", "plain"), ("run", "floor"), ("engine", "floor")):
        if a in best and b in best:
            row[f"{a}_over_{b}"] = round(rate[a] / rate[b], 3)
            row[f"{a}_cpu_over_{b}"] = round(cpu[b] / cpu[a], 3)  # >1: less CPU per item
    if {"floor", "engine", "run"} <= best.keys():
        row.update(http_us=round(us["floor"], 1),
                   engine_us=round(us["engine"] - us["floor"], 1),
                   path_us=round(us["run"] - us["engine"], 1))
    return row


def size_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's run and engine rate (and CPU per item, inverted) over size 64's, same kind
    and consumers."""
    base = {(r["kind"], r["consumers"]): r for r in rows if r["max_batch_size"] == 64}
    for r in rows:
        b = base.get((r["kind"], r["consumers"]))
        for phase in ("run", "engine"):
            if f"{phase}_items_per_s" not in r:
                continue
            r[f"{phase}_over_64"] = (round(r[f"{phase}_items_per_s"]
                                           / b[f"{phase}_items_per_s"], 3) if b else None)
            r[f"{phase}_cpu_over_64"] = (round(b[f"{phase}_cpu_us_per_item"]
                                               / r[f"{phase}_cpu_us_per_item"], 3)
                                         if b else None)


COLUMNS = (("kind", "kind", "{}"), ("max_batch_size", "size", "{}"),
           ("consumers", "gpus", "{}"), ("items", "items", "{}"),
           ("plain_items_per_s", "plain/s", "{:.0f}"), ("floor_items_per_s", "floor/s", "{:.0f}"),
           ("engine_items_per_s", "engine/s", "{:.0f}"), ("run_items_per_s", "run/s", "{:.0f}"),
           ("run_items_per_s_per_gpu", "run/s/gpu", "{:.0f}"),
           ("run_over_plain", "run/plain", "{:.2f}"), ("run_over_floor", "run/floor", "{:.2f}"),
           ("run_over_64", "run/64", "{:.2f}"),
           ("run_cpu_over_plain", "cpu run/plain", "{:.2f}"),
           ("run_cpu_over_64", "cpu run/64", "{:.2f}"),
           ("http_us", "http us", "{:.0f}"), ("engine_us", "+eng us", "{:.0f}"),
           ("path_us", "+path us", "{:.0f}"))


def table(rows: list[dict[str, Any]]) -> str:
    head = [h for _, h, _ in COLUMNS]
    body = [["-" if r.get(k) is None else f.format(r[k]) for k, _, f in COLUMNS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths, strict=True))
                     for line in [head, *body])


async def drive(args: argparse.Namespace) -> list[dict[str, Any]]:
    server = Server.start(args.dims, args.keep_alive)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="path-bench-") as tmp:
            for kind in args.kinds:
                for consumers in args.consumers:
                    for size in args.sizes:
                        n = max(args.items, args.windows * consumers * WINDOW_BATCHES * size)
                        case = Case(kind, size, consumers, n)
                        rows.append(await measure(server, case, Path(tmp), args.repeat,
                                                  args.phases))
                        print(table(rows[-1:]).splitlines()[1], file=sys.stderr)  # progress
    finally:
        server.stop()
    size_ratios(rows)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=["gen", "emb"])
    ap.add_argument("--items", type=int, default=4000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    ap.add_argument("--keep-alive", type=int, default=KEEP_ALIVE_S, help="the server's "
                    "keep-alive timeout, seconds from an answer sent (vLLM's: 5)")
    ap.add_argument("--windows", type=int, default=3,
                    help="items: at least this many windows of every consumer")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each phase, in turn; "
                    "the fastest counts (a shared box's load comes and goes)")
    ap.add_argument("--quick", action="store_true",
                    help="sizes 16 64 256, 1,000 items, one window (make bench)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.items, args.windows = [16, 64, 256], 1000, 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the server child goes too
    rows = asyncio.run(drive(args))
    if args.json:
        print(json.dumps({"server": "uvicorn (bench/path_server.py)", "dims": args.dims,
                          "keep_alive_s": args.keep_alive,
                          "window_batches": WINDOW_BATCHES, "rows": rows}))
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
