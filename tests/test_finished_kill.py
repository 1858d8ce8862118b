"""A finished shape's record survives SIGKILL of a broker that went idle right after it
finished: the job tick commits the pending records (`FlushOp`) without waiting for more
work to come and carry them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import lmdb
from cli_helpers import Broker

from fabricctl.store.keys import DB_NAMES

DEADLINE_S = 30.0


def native(ident: str, prefix: str) -> dict:
    return {"id": ident, "model": "fabric-demo", "prefix": [prefix, "FEW"],
            "prompt": f"question {ident}", "max_tokens": 8, "label": f"label-{prefix}"}


def finished_labels(b: Broker) -> set[str]:
    out = b.run("shapes", "list", "--all", "--json")
    assert out.returncode == 0, out.stderr
    return {s["label"] for s in json.loads(out.stdout)["shapes"] if s["state"] == "finished"}


def stored_records(data: Path) -> int:
    """Records in the `shapes` table on disk (what a restart will find), read as another
    process may: read-only, lock-free (LMDB readers see the last committed transaction)."""
    env = lmdb.open(str(data / "fabric.lmdb"), readonly=True, lock=False,
                    max_dbs=len(DB_NAMES) + 1)
    try:
        with env.begin() as txn:
            return int(txn.stat(env.open_db(b"shapes", txn=txn))["entries"])
    finally:
        env.close()


def test_an_idle_broker_killed_keeps_the_records_of_finished_shapes(tmp_path: Path) -> None:
    b = Broker(tmp_path / "broker", tmp_path)
    try:
        for prefix in ("KA", "KB", "KC", "KD"):  # successors finish the earlier ones
            items = b"".join(json.dumps(native(f"{prefix}-{i}", prefix)).encode() + b"\n"
                             for i in range(30))
            out = b.run("submit", "-", "--wait", input=items)
            assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + DEADLINE_S
        while not (seen := finished_labels(b)):
            assert time.monotonic() < deadline, "no shape finished"
            time.sleep(0.1)
        # nothing more comes: only the job tick can commit the records now
        while stored_records(tmp_path / "broker") < len(seen):
            assert time.monotonic() < deadline, f"{seen} finished, not stored"
            time.sleep(0.1)
        b.proc.kill()  # SIGKILL, idle
        b.proc.wait(timeout=30)
        b.log.close()
    finally:
        if b.proc.poll() is None:
            b.proc.kill()
    again = Broker(tmp_path / "broker", tmp_path)
    try:
        assert seen <= finished_labels(again)
    finally:
        assert again.stop() == 0
