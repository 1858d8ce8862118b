"""A queued item costs the broker a few dozen bytes of RAM, not an object: `bench/backlog_bench.py`
at a small N, through the CLI and a real broker process (`up --gpus none`), as the bound's test.

The bound: 120 bytes of anonymous RSS per queued item at 200,000 items. A lane's queue of
boxed `Entry` objects in a deque cost 161 here; its columns (`core.entry_queue`) 88-93 (the
lanes' newest entries, kept as objects, weigh more at a small N: 57 at 2,000,000). A kill -9
and restart keeps every item queued (the bench checks it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOUND = 120  # bytes of anonymous RSS per queued item


def test_a_queued_item_costs_the_broker_less_than_the_bound() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "backlog_bench.py"), "--items",
                           "200000", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    fig = json.loads(done.stdout)
    assert fig["items"] == 200_000
    assert fig["submit_items_per_s"] > 0 and fig["restart_s"] > 0
    assert 0 < fig["rss_bytes_per_queued_item"] < BOUND, fig
