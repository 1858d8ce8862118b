"""The child process of tests/test_store_kill.py: a DurableBroker workload run until killed.

    python tests/store_worker.py DATA_DIR LOG_DIR --items N

It opens the store (recovery), prints the recovery report as one JSON line on stdout, then
ingests the deterministic workload chunk by chunk, pulls batches with two consumers and
settles them: most with `complete_many` (several batches per commit), some failed first
(a lost consumer) and then completed late, which must be refused (-1). It exits 0 once
every chunk is acknowledged and nothing is queued or in flight.

Logs in LOG_DIR, each line appended and fsync'd:
- `tried.log`: "c" before chunk c is submitted (its ids may be stored from then on);
- `acked.log`: "c" after `ingest` returned for chunk c with no reject, or with every item
  rejected as a duplicate (the chunk was committed in an earlier life, unacknowledged).
Any other outcome is an invariant violation: the worker exits 3 with a message on stderr.
Fault points (fabricctl.store.faults) kill it with SIGKILL when FABRICCTL_FAULTS says so. Before
each step it prints "@ingest", "@pull", "@complete" or "@late" (flushed), so the parent can
tell where a kill landed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import msgspec
import xxhash

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store_helpers import SyncStore

from fabricctl.core.config import CoreConfig
from fabricctl.core.types import Contract, Item, ItemResult, Work
from fabricctl.store.durable import StoreConfig

MODEL = "m"
CHUNK = 40
SIGNATURES = (0x5A11, 0x5B22, 0x5C33)
CONTRACTS = {"gpu0": Contract(MODEL, 16, 4096, 4096), "gpu1": Contract(MODEL, 24, 6144, 4096)}
STORE = StoreConfig(map_size=8 << 20, segment_entries=32)


def item(n: int) -> Item:
    """Item n of the workload: the same on every run."""
    tokens = 40 + (n * 7919) % 360
    payload = f"payload-{n}:".encode() * (1 + n % 5)
    return Item(f"k{n}", MODEL, SIGNATURES[n % 3], tokens, 8 + n % 16, payload)


def chunk(c: int, total: int) -> list[Item]:
    return [item(n) for n in range(c * CHUNK, min((c + 1) * CHUNK, total))]


def expected_text(it: Item) -> str:
    """What the fake engine answers: ties the result to the payload it was given."""
    return f"done:{it.id}:{xxhash.xxh3_64_hexdigest(it.payload)}"


def append_synced(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_log(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {int(x) for x in path.read_text().split()}


def violation(msg: str) -> None:
    print(f"INVARIANT: {msg}", file=sys.stderr, flush=True)
    sys.exit(3)


def step(name: str) -> None:
    print(f"@{name}", flush=True)


def answer(w: Work) -> list[ItemResult]:
    return [ItemResult(it.id, text=expected_text(it), tokens_out=3) for it in w.items]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("logs", type=Path)
    ap.add_argument("--items", type=int, required=True)
    args = ap.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    tried, acked = args.logs / "tried.log", args.logs / "acked.log"
    nchunks = -(-args.items // CHUNK)
    done_chunks = read_log(acked)
    store = SyncStore(args.data, time.time(), CoreConfig(), STORE)
    print(json.dumps({"recovery": msgspec.to_builtins(store.recovery)}), flush=True)
    for name, contract in CONTRACTS.items():
        store.register(name, contract, time.time())
    rng = random.Random(os.getpid())
    c = max(done_chunks, default=-1) + 1
    held: list[Work] = []
    late: list[Work] = []
    lg = store.view.ledger
    while True:
        now = time.time()
        if c < nchunks:
            items = chunk(c, args.items)
            append_synced(tried, str(c))
            step("ingest")
            rejects = store.ingest(items, now)
            dups = [r for r in rejects if r.reason.startswith("duplicate id")]
            if rejects and (len(dups) != len(rejects) or len(rejects) != len(items)):
                violation(f"chunk {c}: {len(rejects)} rejects of {len(items)}: {rejects[:3]}")
            append_synced(acked, str(c))
            c += 1
        step("pull")
        for name in CONTRACTS:
            w = store.pull(name, now)
            if w is not None:
                held.append(w)
        # settle what we hold: some now in one group commit, some later, a few failed
        group: list[Work] = []
        keep: list[Work] = []
        for w in held:
            roll = rng.random()
            if roll < 0.08:
                store.fail(w.id, now)  # the consumer was lost; a late answer must be refused
                late.append(w)
            elif roll < 0.3:
                keep.append(w)
            else:
                group.append(w)
        held = keep
        if group:
            step("complete")
            stored = store.complete_many([(w.id, answer(w), 0) for w in group], now)
            for w, n in zip(group, stored, strict=True):
                if n != len(w.items):
                    violation(f"batch {w.id}: stored {n} results for {len(w.items)} items")
        if late:
            step("late")
        for w in late:
            if store.complete(w.id, answer(w), now) != -1:
                violation(f"late completion of failed batch {w.id} was accepted")
        late.clear()
        step("tick")
        store.tick(now)
        if c >= nchunks and not held and lg.items_queued == 0 and lg.items_inflight == 0:
            break
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
