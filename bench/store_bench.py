"""Durable store throughput: ingest, pull + complete, recovery time and memory per queued item.

Runs the real `DurableBroker` on a temporary data dir with LMDB's durable defaults (sync and
metasync on, no writemap). A synthetic workload of `--shapes` shapes of one model (Zipf
popularity, lognormal input lengths with median ~500 tokens) with `--payload`-byte payloads
(600 by default) is generated outside the clock. Phases:

1. ingest `--items` items in chunks of `--chunk` (one `steps.write` cycle = one group commit);
2. pull every batch with `--consumers` consumers and settle them in one `steps.write` cycle,
   `--group` batches per commit (as the server's writer does);
3. build a store of `--recovery-items` queued items (1,000,000 by default), then reopen it in
   a fresh subprocess that reports the recovery time and the RSS it grew by (psutil, plus
   RssAnon from /proc for the heap alone).

Only time spent inside the broker calls is counted (wall clock, and CPU per item, which is
the figure to trust on a shared, noisy box); phases 1-2 run `--rounds` times in fresh data
dirs and report the median round (and the best). Item ids are sequential ("q0", "q1", ...),
as batch files number them; random ids would add one scattered page per item to the id
index. Targets on a 2-core box: ingest >= 100k items/s, complete >= 50k items/s, recovery
<= 10 s per million, <= 200 B RSS per queued item.

The floor, so the figure reads the same on any machine: each round also writes raw py-lmdb
on the same payloads into a fresh environment beside it, opened with the store's own flags
(`fabricctl.store.env`: sync and metasync on, no writemap, readahead, lock off), one write
transaction per `--chunk` rows (as one ingest cycle is one commit), `putmulti` appending
8-byte sequential keys, payload as value; each raw commit runs right after the ingest of the
same chunk, so both see the disk as it is at that moment. `lmdb_floor_items_per_s` is its
median round, `ingest_vs_lmdb_floor` the median of the rounds' ratios ingest / floor (target
>= 0.6x) and `ingest_vs_lmdb_floor_cpu` the same ratio by CPU time per item.

A second floor, committed beside it, says how much of the gap is Python's: the minimal
floor (`MinimalFloor`) is the least a durable ingest does in Python per item (ids looked
up, a row per item encoded, an id row per item, both tables written in one durable commit;
no shapes, lanes, segments or counts). `minimal_floor_vs_lmdb_floor` is its rate over the
raw floor's (about 0.6x on a 2-core box) and `ingest_vs_minimal_floor` the store's over it
(about 0.47x: the part the store's own logic adds).

    .venv/bin/python bench/store_bench.py                           # a table
    .venv/bin/python bench/store_bench.py --json                    # exactly one JSON object
    .venv/bin/python bench/store_bench.py --recovery-items 100000   # a quicker run
    .venv/bin/python bench/store_bench.py --profile throughput      # cProfile phases 1-2
    .venv/bin/python bench/store_bench.py --hash --json --recovery-items 0  # same results?

`--hash` is the same-results check of a change to the store's hot paths: `batches_sha256`
digests every `Work` handed out (msgpack: the batch and its items, payloads included) and
what each completion cycle returned; `sha256.ingested.<table>` and `sha256.end.<table>` every
key and value of each LMDB table after the ingest phase and at the end, in key order. Two trees
that store and dispatch alike print the same digests (the hashing is inside the timed loop
for the batches, outside it for the tables).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import json
import math
import pstats
import random
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lmdb
import msgspec

from fabricctl.core.signature import signature
from fabricctl.core.types import Contract, Item, ItemResult
from fabricctl.store.durable import DurableBroker, StoreConfig

CONTRACTS = (
    Contract("m", 256, 65536, 8192),
    Contract("m", 128, 32768, 8192),
    Contract("m", 256, 65536, 8192),
    Contract("m", 64, 16384, 4096),
)
TARGETS = {
    "ingest_items_per_s": (100_000, ">="),
    "complete_items_per_s": (50_000, ">="),
    "recovery_s_per_million": (10.0, "<="),
    "rss_bytes_per_queued_item": (200.0, "<="),
    "ingest_vs_lmdb_floor": (0.6, ">="),
}
GiB = 1 << 30


def chunks(seed: int, items: int, chunk: int, shapes: int, payload: int,
           prefix: str = "q") -> Iterator[list[Item]]:
    """The workload, `chunk` items at a time (generated lazily, outside the clock)."""
    rng = random.Random(seed)
    sigs = [signature([f"system prompt {k}", f"few-shot block {k}"]) for k in range(shapes)]
    weights = [1.0 / (k + 1) for k in range(shapes)]
    mu = math.log(500)
    body = rng.randbytes(payload)
    sent = 0
    while sent < items:
        n = min(chunk, items - sent)
        picks = rng.choices(sigs, weights=weights, k=n)
        out = []
        for k, sig in enumerate(picks):
            tokens = max(1, int(rng.lognormvariate(mu, 0.6)))
            ident = f"{prefix}{sent + k}"
            out.append(Item(ident, "m", sig, tokens, 128, ident.encode() + body[len(ident):]))
        sent += n
        yield out


def store_cfg() -> StoreConfig:
    return StoreConfig(map_size=1 * GiB)


def phase_ingest(store: DurableBroker, args: argparse.Namespace, now: float,
                 *floors: LmdbFloor | MinimalFloor) -> tuple[int, float, float]:
    """Ingest the workload; returns (items, wall seconds and CPU seconds inside the ingest cycles).
    Each chunk is also committed into each of `floors` right after its ingest (not
    counted)."""
    spent = cpu = 0.0
    n = 0
    for chunk in chunks(args.seed, args.items, args.chunk, args.shapes, args.payload):
        c0, t0 = time.process_time(), time.perf_counter()
        rejects = store.steps.write(now, items=chunk).rejects
        spent += time.perf_counter() - t0
        cpu += time.process_time() - c0
        assert not rejects, rejects[:3]
        n += len(chunk)
        for floor in floors:
            floor.commit(chunk)
    return n, spent, cpu


def phase_complete(store: DurableBroker, args: argparse.Namespace, now: float,
                   digest: hashlib._Hash | None = None) -> tuple[int, float, float, int, int]:
    """Drain everything; returns (items, wall and CPU seconds in pull + completion commits,
    batches, commits). With `digest`, every `Work` and every commit's answer go into it."""
    encode = msgspec.msgpack.Encoder().encode
    names = [f"gpu{k}" for k in range(args.consumers)]
    for name, contract in zip(names, CONTRACTS, strict=False):
        store.register(name, contract, now)
    spent = cpu = 0.0
    items = batches = commits = 0
    pull, write = store.pull, store.steps.write
    next_tick = now + 1.0
    while True:
        group = []
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(args.group):
            for name in names:
                w = pull(name, now)
                if w is not None:
                    group.append(w)
                    if digest is not None:
                        digest.update(encode(w))
        spent += time.perf_counter() - t0
        cpu += time.process_time() - c0
        if not group:
            break
        # what the engines return (outside the clock: the server decodes these off the wire)
        done = [(w.id, [ItemResult(it.id, text="ok", tokens_out=16) for it in w.items], 0)
                for w in group]
        c0, t0 = time.process_time(), time.perf_counter()
        stored = write(now, done=done).settled
        spent += time.perf_counter() - t0
        cpu += time.process_time() - c0
        if digest is not None:
            digest.update(encode(stored))
        items += sum(stored)
        batches += len(group)
        commits += 1
        now += 0.01
        if now >= next_tick:  # the server's 1 s maintenance tick, on the fake clock
            store.tick(now)
            next_tick += 1.0
    return items, spent, cpu, batches, commits


def floor_env(data_dir: Path) -> lmdb.Environment:
    """A fresh env for a floor, opened with the store's flags (two tables at most)."""
    data_dir.mkdir(parents=True)
    return lmdb.open(str(data_dir), map_size=store_cfg().map_size, max_dbs=2, subdir=True,
                     sync=True, metasync=True, writemap=False, readahead=True, lock=False)


class LmdbFloor:
    """Why: the raw py-lmdb append rate on the same payloads is the figure ingest is read
    against; committed chunk by chunk beside ingest, both see the same disk at the same time.

    One durable write transaction per chunk, `putmulti` appending 8-byte sequential keys
    (payload as value) into a fresh env opened with the store's flags."""

    def __init__(self, data_dir: Path) -> None:
        self.env = floor_env(data_dir)
        self.db = self.env.open_db(b"data")
        self.pack = struct.Struct(">Q").pack
        self.rows = 0
        self.seconds = self.cpu = 0.0

    def commit(self, chunk: list[Item]) -> None:
        """One chunk's payloads in one transaction; only the transaction is timed."""
        pack, n = self.pack, self.rows
        rows = [(pack(n + k), it.payload) for k, it in enumerate(chunk)]
        c0, t0 = time.process_time(), time.perf_counter()
        with self.env.begin(write=True) as txn:
            added = txn.cursor(db=self.db).putmulti(rows, overwrite=False, append=True)[1]
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        assert added == len(rows), (added, len(rows))
        self.rows += len(rows)

    def close(self) -> None:
        self.env.close()


class MinimalFloor:
    """Why: between the raw append and the store lies Python's own per-item cost; this
    floor is the least a durable ingest does in Python, so the rest of the gap is the
    store's logic.

    Per chunk, all timed: every id looked up in an id table (`getmulti`: none is there), a
    row per item encoded (msgspec, the fields a stored entry holds) under an 8-byte
    sequential key, an id row per item (sorted), one durable write transaction with both
    `putmulti`s. No shapes, lanes, segments, jobs or counts."""

    def __init__(self, data_dir: Path) -> None:
        self.env = floor_env(data_dir)
        self.data, self.ids = self.env.open_db(b"data"), self.env.open_db(b"ids")
        self.pack = struct.Struct(">Q").pack
        self.encode = msgspec.msgpack.Encoder().encode
        self.rows = 0
        self.seconds = self.cpu = 0.0

    def commit(self, chunk: list[Item]) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        n = self.rows
        ids = [it.id.encode() for it in chunk]
        keys = list(map(self.pack, range(n, n + len(chunk))))
        rows = list(zip(keys, map(self.encode, [
            (it.input_tokens, it.max_tokens, 0.0, 0, it.input_tokens, it.id, it.payload,
             it.source, it.line) for it in chunk]), strict=True))
        with self.env.begin(write=True) as txn:
            found = txn.cursor(db=self.ids).getmulti(ids)
            txn.cursor(db=self.data).putmulti(rows, overwrite=False, append=True)
            added = txn.cursor(db=self.ids).putmulti(sorted(zip(ids, keys, strict=True)),
                                                     overwrite=False)[1]
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        assert not found and added == len(rows), (len(found), added, len(rows))
        self.rows += len(rows)

    def close(self) -> None:
        self.env.close()


def table_hashes(store: DurableBroker, prefix: str) -> dict[str, str]:
    """sha256 of every key and value of each of the store's LMDB tables, in key order."""
    out = {}
    env = store.state.env
    with env.read() as txn:
        for name, db in env.dbs.items():
            digest = hashlib.sha256()
            for k, v in txn.cursor(db=db):
                digest.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
            out[f"sha256.{prefix}.{name}"] = digest.hexdigest()
    return out


def run_throughput(args: argparse.Namespace, data_dir: Path) -> dict[str, object]:
    """One round in a fresh data dir."""
    store = DurableBroker(data_dir, 0.0, store=store_cfg())
    raw = LmdbFloor(data_dir.parent / f"{data_dir.name}-floor")
    least = MinimalFloor(data_dir.parent / f"{data_dir.name}-minimal")
    digest = hashlib.sha256() if args.hash else None
    tables: dict[str, str] = {}
    try:
        n_in, t_in, c_in = phase_ingest(store, args, 0.0, raw, least)
        raw.close()
        least.close()
        if digest is not None:
            tables |= table_hashes(store, "ingested")
        n_out, t_out, c_out, batches, commits = phase_complete(store, args, 1.0, digest)
        if digest is not None:
            tables |= table_hashes(store, "end")
        lg = store.view.ledger
        floor = raw.rows / (raw.seconds or 1e-9)
        return {
            "items": n_in,
            "payload_bytes": args.payload,
            "chunk": args.chunk,
            "segments": store.meta.next_seg - 1,
            "ingest_seconds": round(t_in, 4),
            "ingest_items_per_s": round(n_in / t_in),
            "ingest_cpu_us_per_item": round(c_in * 1e6 / n_in, 2),
            "lmdb_floor_items_per_s": round(floor),
            "ingest_vs_lmdb_floor": round(n_in / t_in / floor, 3),
            "lmdb_floor_cpu_us_per_item": round(raw.cpu * 1e6 / max(raw.rows, 1), 2),
            "ingest_vs_lmdb_floor_cpu": round(raw.cpu / max(c_in, 1e-9), 3),
            "minimal_floor_items_per_s": round(least.rows / (least.seconds or 1e-9)),
            "minimal_floor_vs_lmdb_floor": round(raw.seconds / (least.seconds or 1e-9), 3),
            "ingest_vs_minimal_floor": round(least.seconds / (t_in or 1e-9), 3),
            "completed": n_out,
            "complete_seconds": round(t_out, 4),
            "complete_items_per_s": round(n_out / t_out) if t_out else 0,
            "complete_cpu_us_per_item": round(c_out * 1e6 / max(n_out, 1), 2),
            "batches": batches,
            "batches_per_commit": round(batches / max(commits, 1), 1),
            "items_per_commit": round(n_out / max(commits, 1)),
            "ledger_difference": list(lg.difference()),
            "segments_left": len(store.segs),
        } | ({"batches_sha256": digest.hexdigest(), **tables} if digest is not None else {})
    finally:
        raw.close()
        least.close()
        store.close()


def run_rounds(args: argparse.Namespace, parent: Path) -> dict[str, object]:
    """`--rounds` rounds; the rates are the median round's, with the best one beside them."""
    rounds = [run_throughput(args, parent / f"t{k}") for k in range(args.rounds)]
    out = dict(rounds[0])
    for key in ("ingest_items_per_s", "complete_items_per_s", "lmdb_floor_items_per_s",
                "minimal_floor_items_per_s"):
        vals = sorted(int(r[key]) for r in rounds)  # type: ignore[call-overload]
        out[key] = vals[len(vals) // 2]
        out[key.replace("_per_s", "_per_s_best")] = vals[-1]
    for key in ("ingest_vs_lmdb_floor", "ingest_vs_lmdb_floor_cpu",
                "minimal_floor_vs_lmdb_floor", "ingest_vs_minimal_floor"):
        ratios = sorted(float(r[key]) for r in rounds)  # type: ignore[arg-type]
        out[key] = ratios[len(ratios) // 2]
        out[f"{key}_rounds"] = ratios
    out["lmdb_floor_cpu_us_per_item"] = min(
        float(r["lmdb_floor_cpu_us_per_item"]) for r in rounds)  # type: ignore[arg-type]
    for key in ("ingest_cpu_us_per_item", "complete_cpu_us_per_item"):
        out[key] = min(float(r[key]) for r in rounds)  # type: ignore[arg-type]
    for key in ("ingest_seconds", "complete_seconds"):
        out.pop(key)
    out["rounds"] = args.rounds
    out["ledger_difference"] = [sum(int(r["ledger_difference"][i]) for r in rounds)  # type: ignore[index]
                                for i in (0, 1)]
    return out


def build_backlog(args: argparse.Namespace, data_dir: Path) -> None:
    store = DurableBroker(data_dir, 0.0, store=StoreConfig(map_size=4 * GiB))
    try:
        for chunk in chunks(args.seed + 1, args.recovery_items, 1024, args.shapes, args.payload,
                            prefix="r"):
            store.steps.write(0.0, items=chunk)
    finally:
        store.close()


def _rss() -> tuple[int, int]:
    """(RSS, RssAnon) of this process in bytes."""
    import psutil

    anon = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    return psutil.Process().memory_info().rss, anon


def recover_child(data_dir: str) -> None:
    """In a fresh process: open the store, report recovery time and RSS growth as JSON."""
    gc.collect()
    rss0, anon0 = _rss()
    t0 = time.perf_counter()
    store = DurableBroker(Path(data_dir), 2.0, store=StoreConfig(map_size=4 * GiB))
    seconds = time.perf_counter() - t0
    gc.collect()
    rss1, anon1 = _rss()
    rep = store.recovery
    print(json.dumps({"items": rep.items, "seconds": seconds, "rss_delta": rss1 - rss0,
                      "anon_delta": anon1 - anon0, "ledger_ok": rep.ledger_ok}))
    store.close()


def run_recovery(args: argparse.Namespace, data_dir: Path) -> dict[str, object]:
    t0 = time.perf_counter()
    build_backlog(args, data_dir)
    build_s = time.perf_counter() - t0
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--recover-child",
                           str(data_dir)],
                          capture_output=True, text=True, check=True)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    n = int(child["items"])
    assert n == args.recovery_items, (n, args.recovery_items)
    return {
        "recovery_items": n,
        "recovery_build_s": round(build_s, 2),
        "recovery_seconds": round(child["seconds"], 3),
        "recovery_s_per_million": round(child["seconds"] * 1e6 / n, 3),
        "rss_bytes_per_queued_item": round(child["rss_delta"] / n, 1),
        "anon_rss_bytes_per_queued_item": round(child["anon_delta"] / n, 1),
        "recovery_ledger_ok": child["ledger_ok"],
    }


def table(out: dict[str, object]) -> str:
    rows = [(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))
            for k, v in out.items()]
    for key, (target, op) in TARGETS.items():
        if key in out:
            v = float(out[key])  # type: ignore[arg-type]
            ok = v >= target if op == ">=" else v <= target
            rows.append((f"target {key}", f"{op} {target:,} ({'meets' if ok else 'below'})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v:>28}" for k, v in rows)


def profiled(fn: Callable[[], dict[str, object]]) -> dict[str, object]:
    prof = cProfile.Profile()
    out = prof.runcall(fn)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--items", type=int, default=200_000, help="items for ingest and complete")
    ap.add_argument("--chunk", type=int, default=1024, help="items per ingest call (one commit)")
    ap.add_argument("--payload", type=int, default=600, help="payload bytes per item")
    ap.add_argument("--shapes", type=int, default=20)
    ap.add_argument("--consumers", type=int, default=3, choices=(1, 2, 3, 4))
    ap.add_argument("--group", type=int, default=4,
                    help="pull rounds per completion commit (batches = rounds x consumers)")
    ap.add_argument("--recovery-items", type=int, default=1_000_000,
                    help="queued items for the recovery measurement (0 skips it)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="throughput rounds (fresh data dirs); the median is reported")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hash", action="store_true",
                    help="sha256 of every batch handed out and of every table (same results)")
    ap.add_argument("--dir", type=Path, default=None, help="parent of the temporary data dirs")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--profile", choices=("throughput", "recovery"), default=None,
                    help="cProfile one phase in this process (to stderr)")
    ap.add_argument("--recover-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.recover_child:
        recover_child(args.recover_child)
        return 0
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="store-bench-", dir=args.dir) as tmp:
        if args.profile == "recovery":
            build_backlog(args, Path(tmp) / "r")
            prof = cProfile.Profile()
            store = prof.runcall(DurableBroker, Path(tmp) / "r", 2.0,
                                 store=StoreConfig(map_size=4 * GiB))
            store.close()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
            return 0
        if args.items:
            fn = lambda: run_rounds(args, Path(tmp))  # noqa: E731
            out.update(profiled(fn) if args.profile == "throughput" else fn())
        if args.recovery_items:
            out.update(run_recovery(args, Path(tmp) / "r"))
    print(json.dumps(out) if args.json else table(out))
    ok = out.get("ledger_difference", [0, 0]) == [0, 0] and out.get("recovery_ledger_ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
