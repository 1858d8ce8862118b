"""The shape choice at scale: the cost of one pick with 10, 1,000 and 100,000 staged shapes.

A memory-mode broker with `--consumers` consumers and N staged shapes of one item each (a
structureless workload: every shape sealed, so none waits to grow), with the sweep off (on,
the first pick would sweep them all into one shape and no further choice would be made: see
bench/shapes_bench.py for what it does to a whole run). Each pull activates a new shape, so
every pull is one choice; the bench times `--picks` pull+complete cycles (a fake
clock, 1 ms a cycle) and reports microseconds per pick. Beside it, in the same run, the floor
of the choice this replaced: one pass over every staged shape checking its eligibility and
tokens (what `Lifecycle.pick_staged` did at every activation), timed per pass.

    .venv/bin/python bench/choice_bench.py [--sizes 10 1000 100000] [--picks 2000] [--json]

Target: flat, i.e. `pick_us` at 100,000 shapes within ~2x of at 10 (the scan grows ~10,000x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.shape import ShapeState
from fabricctl.core.terms import JobTerms
from fabricctl.core.types import Contract, Item


def setup(n: int, consumers: int) -> Broker:
    b = Broker(CoreConfig(sweep=False))
    for k in range(consumers):
        b.register(f"c{k}", Contract("m", 256, 16384, 4096), 0.0)
    b.ingest([Item(f"i{s}", "m", s + 1, 100, 16, job=1) for s in range(n)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    return b


def time_picks(b: Broker, picks: int) -> float:
    """Seconds per pull+complete cycle, each one activating a shape."""
    names = list(b.consumers)
    t = 0.0
    done = 0
    t0 = time.perf_counter()
    while done < picks:
        t += 0.001
        for c in names:
            batch = b.pull(c, t)
            if batch is not None:
                b.complete(batch.id, t)
                done += 1
    return (time.perf_counter() - t0) / done


def time_scan(b: Broker, passes: int = 5) -> float:
    """Seconds of one pass over every staged shape (the replaced choice's cost)."""
    ms = b.models["m"]
    threshold = 2.0 * ms.budget
    t0 = time.perf_counter()
    for _ in range(passes):
        best = None
        for shape in ms.open.values():
            if shape.state is not ShapeState.STAGED or shape.items == 0:
                continue
            ok = shape.tokens >= threshold or (shape.staged_since is not None
                                               and 0.0 - shape.staged_since >= 2.0)
            if ok and (best is None or shape.tokens > best.tokens):
                best = shape
    return (time.perf_counter() - t0) / passes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 100_000])
    ap.add_argument("--picks", type=int, default=2000)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for n in a.sizes:
        b = setup(n, a.consumers)
        scan = time_scan(b)
        pick = time_picks(b, min(a.picks, n))
        rows.append({"staged_shapes": n, "pick_us": round(pick * 1e6, 2),
                     "scan_floor_us": round(scan * 1e6, 2)})
    base = rows[0]["pick_us"]
    for r in rows:
        r["pick_vs_smallest"] = round(r["pick_us"] / base, 2)
    if a.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'staged shapes':>14} {'pick us':>9} {'vs smallest':>12} {'old scan us':>12}")
    for r in rows:
        print(f"{r['staged_shapes']:>14} {r['pick_us']:>9} {r['pick_vs_smallest']:>12} "
              f"{r['scan_floor_us']:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
