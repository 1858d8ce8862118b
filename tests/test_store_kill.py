"""kill -9 torture of the durable store: nothing acknowledged is lost, nothing is doubled.

A child process (tests/store_worker.py) runs a DurableBroker workload: it ingests chunks,
pulls batches and settles them, logging each chunk it submits and each chunk `ingest`
acknowledged (fsync'd, after the call returned). The parent kills it with SIGKILL at least
20 times: at the store's injectable fault points (FABRICCTL_FAULTS, a new seed each run) and
after a random delay of its own (fault injection; everything else waits on process exit).
Each restart recovers; its report must show a balanced ledger. A final run without faults
drains everything; then every acknowledged item has exactly one result, carrying the answer
for its own payload, and no result exists for an id that was never submitted.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import store_worker as worker

from fabricctl.store.durable import DurableBroker

WORKER = str(Path(__file__).with_name("store_worker.py"))
FAULTS = ("dispatch_step1:0.02,dispatch_step2:0.02,dispatch_step3:0.02,complete_results:0.02,"
          "segment_delete:0.05,ingest_before_commit:0.01,ingest_after_commit:0.01,"
          "complete_after_commit:0.02")
ITEMS = 4000
KILLS = 24
MAX_RUNS = 60


def run_worker(
    data: Path, logs: Path, out: Path, faults: bool, seed: int
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICCTL_FAULT")}
    if faults:
        env["FABRICCTL_FAULTS"] = FAULTS
        env["FABRICCTL_FAULT_SEED"] = str(seed)
    with open(out, "wb") as f:
        return subprocess.Popen([sys.executable, WORKER, str(data), str(logs), "--items",
                                 str(ITEMS)], stdout=f, stderr=subprocess.STDOUT, env=env)


def last_step(out: Path) -> str:
    """Where the run was when it died: its last step marker, or "start" before any."""
    steps = [ln for ln in out.read_text().splitlines() if ln.startswith("@")]
    return steps[-1][1:] if steps else "start"


def reports(out: Path) -> list[dict[str, object]]:
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("{")]
    return [json.loads(ln)["recovery"] for ln in lines]


def test_kill9_loses_and_doubles_nothing(tmp_path: Path) -> None:
    data, logs = tmp_path / "data", tmp_path / "logs"
    rng = random.Random(20240229)
    fault_kills = parent_kills = finished = runs = 0
    recovered: list[dict[str, object]] = []
    where: collections.Counter[str] = collections.Counter()
    t0 = time.monotonic()
    while fault_kills + parent_kills < KILLS and runs < MAX_RUNS:
        out = tmp_path / f"run{runs}.out"
        proc = run_worker(data, logs, out, faults=True, seed=1000 + runs)
        # when the parent's own SIGKILL lands (fault injection): often early (start-up,
        # recovery, first steps), otherwise whenever the fault points have not struck yet
        delay = rng.uniform(0.05, 0.45) if runs % 2 else rng.uniform(0.2, 1.2)
        try:
            rc = proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
            if rc == -signal.SIGKILL:
                parent_kills += 1
        else:
            if rc == -signal.SIGKILL:
                fault_kills += 1
        runs += 1
        text = out.read_text()
        assert rc in (0, -signal.SIGKILL), f"run {runs - 1} exited {rc}:\n{text[-3000:]}"
        assert "INVARIANT" not in text, text[-3000:]
        finished += rc == 0
        if rc == -signal.SIGKILL:
            where[last_step(out)] += 1
        recovered.extend(reports(out))
    assert fault_kills + parent_kills >= KILLS, (fault_kills, parent_kills, runs)
    assert fault_kills >= 1
    assert parent_kills >= 1
    assert len(where) >= 2  # kills landed in different steps (the tally is printed below)

    out = tmp_path / "final.out"
    proc = run_worker(data, logs, out, faults=False, seed=0)
    rc = proc.wait(timeout=120)
    assert rc == 0, out.read_text()[-3000:]
    recovered.extend(reports(out))
    # every start that got as far as recovering found a balanced ledger (on a loaded machine
    # many kills land before the child has even imported, so only a floor is asserted)
    assert len(recovered) >= 3
    for rep in recovered:
        assert rep["ledger_ok"] is True, rep
        assert rep["ledger_difference"] == [0, 0], rep

    tried = worker.read_log(logs / "tried.log")
    acked = worker.read_log(logs / "acked.log")
    nchunks = -(-ITEMS // worker.CHUNK)
    assert acked == set(range(nchunks))  # the final run acknowledged the rest
    assert acked <= tried
    acked_items = {it.id: it for c in acked for it in worker.chunk(c, ITEMS)}
    submitted = {it.id for c in tried for it in worker.chunk(c, ITEMS)}

    store = DurableBroker(data, time.time(), store=worker.STORE)
    try:
        assert store.recovery.ledger_ok is True
        assert store.recovery.items == 0  # drained
        results = store.results_since(0, limit=10 * ITEMS)
        seqs = [s for s, _ in results]
        assert seqs == sorted(set(seqs))
        counts = collections.Counter(rec.id for _, rec in results)
        doubled = {k: n for k, n in counts.items() if n > 1}
        assert doubled == {}
        lost = set(acked_items) - set(counts)
        assert lost == set()
        unexpected = set(counts) - submitted
        assert unexpected == set()
        for _, rec in results:
            it = acked_items[rec.id]
            assert rec.text == worker.expected_text(it)
            assert rec.prompt_tokens == it.input_tokens
            assert rec.signature == it.signature
        assert store.result("k0") is not None
        lg = store.meta.ledger
        assert lg.items_received == ITEMS
        assert lg.items_completed == ITEMS
        assert len(store.segs) == 0
        with store.env.read() as txn:
            stats = {name: txn.stat(db)["entries"] for name, db in store.env.dbs.items()}
        assert stats["ids"] == ITEMS
        assert stats["results"] == ITEMS
        assert [s for s, _ in store.results_since(0, ITEMS + 1)] == list(range(1, ITEMS + 1))
        assert (stats["data"], stats["seg"]) == (0, 0)
    finally:
        store.close()
    assert time.monotonic() - t0 < 120
    print(f"{runs} runs: {fault_kills} fault kills, {parent_kills} parent kills, "
          f"{finished} finished, {len(recovered)} recoveries; kills by step: {dict(where)}")
