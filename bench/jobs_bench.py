"""Fabric with jobs against fabric by tokens alone, the baselines and the oracle. SIMULATED.

Each trace of `fabricctl.replay.workload.job_trace` (2,048-token prefixes, median 64-token
prompts, 8 output tokens, the examples' generator, each job its own shapes) replays through
fabric (the broker's defaults: fair share between jobs, the wait bound, deadlines, sealed
jobs), fabric-tokens (`CoreConfig(fair_share=False, wait_bound_s=1e9)`, no job terms: the
order by tokens alone), round-robin, prefix-affinity, pow2-buckets (which ignore jobs) and
the oracle (earliest deadline first within priority) on 2 simulated GPUs at cache pressure
1 (`fabricctl replay`'s engine and costs). Each job's completion time (its last finish -
its arrival) is set against its standalone time (the job replayed alone, same policy, same
GPUs); slowdown = completion / standalone.
- small-behind-big: a big job (4 shapes x 1,000 items) at t = 0, and three one-shape jobs of
  150 items arriving at t = 2, 4 and 6 s;
- deadlines: at t = 0, bulk (2 shapes, 3,000 items, window 30 s), report (1 shape, 800
  items, window 8 s) and alert (1 shape, 300 items, window 3 s).
Targets (a warning: a miss is reported with the row): fabric's makespan within 5% of
fabric-tokens'; on small-behind-big, the worst small-job slowdown under fabric <= 2x; on
deadlines, all three met by fabric and at least one missed by fabric-tokens.

    .venv/bin/python bench/jobs_bench.py                  # tables (about a minute)
    .venv/bin/python bench/jobs_bench.py --json           # exactly one JSON object
    .venv/bin/python bench/jobs_bench.py --write DIR      # also write each trace's workload
        # and jobs files, for `fabricctl replay DIR/deadlines.jsonl --jobs DIR/deadlines.jobs.jsonl`
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from rich.console import Console
from rich.table import Table

from fabricctl.replay.run import FABRIC_TOKENS, JOB_POLICIES, costs_for, limits_for, replay
from fabricctl.replay.workload import TRACES, job_trace, trace_workload

GPUS = 2
MAX_NUM_SEQS = 64
PRESSURE = 1.0
TARGETS = {"makespan_vs_tokens": 1.05, "small_slowdown": 2.0}


def run_trace(name: str, scale: float, policies: tuple[str, ...]) -> dict[str, Any]:
    """One trace through every policy, with each job's standalone runs."""
    items, jobs = trace_workload(job_trace(name, scale))
    costs = costs_for(items, pressure=PRESSURE, max_num_seqs=MAX_NUM_SEQS)
    t0 = time.perf_counter()
    results = replay(items, list(policies), GPUS, costs, limits_for(items, costs), jobs=jobs)
    return {
        "trace": name, "items": len(items), "kv_tokens": costs.kv_tokens,
        "jobs": [{"job": j.label, "arrival_s": j.arrival, "window_s": j.window_s,
                  "priority": j.priority} for j in jobs.values()],
        "seconds": round(time.perf_counter() - t0, 2),
        "policies": {n: msgspec.to_builtins(r) for n, r in results.items()},
    }


def small_slowdown(pol: dict[str, Any]) -> float | None:
    """The worst slowdown of the small jobs (every job but the first, the big one)."""
    slow = [j["slowdown"] for j in (pol.get("jobs") or [])[1:] if j["slowdown"] is not None]
    return max(slow) if slow else None


def figures(trace: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one trace and the targets fabric missed."""
    pol = trace["policies"]
    fab, tok = pol.get("fabric"), pol.get(FABRIC_TOKENS)
    out: dict[str, Any] = {"makespan_ratio": None, "targets_missed": []}
    if fab and tok:
        out["makespan_ratio"] = round(fab["makespan_s"] / tok["makespan_s"], 3)
        if out["makespan_ratio"] > TARGETS["makespan_vs_tokens"]:
            out["targets_missed"].append(
                f"makespan {out['makespan_ratio']:.3f}x fabric-tokens (> 1.05x)")
    out["small_slowdown"] = {n: small_slowdown(p) for n, p in pol.items()}
    out["deadlines_met"] = {n: p["deadlines_met"] for n, p in pol.items()}
    out["deadlines_missed"] = {n: p["deadlines_missed"] for n, p in pol.items()}
    if fab and trace["trace"] == "small-behind-big":
        worst = small_slowdown(fab)
        if worst is not None and worst > TARGETS["small_slowdown"]:
            out["targets_missed"].append(f"worst small-job slowdown {worst:.2f}x (> 2x)")
    if fab and tok and trace["trace"] == "deadlines":
        if fab["deadlines_missed"]:
            out["targets_missed"].append(
                "fabric missed " + ", ".join(fab["deadlines_missed"]))
        if not tok["deadlines_missed"]:
            out["targets_missed"].append("fabric-tokens met every deadline")
    return out


def trace_table(trace: dict[str, Any]) -> Table:
    pol = trace["policies"]
    tok = pol.get(FABRIC_TOKENS, {}).get("makespan_s")
    jobs = [j["job"] for j in trace["jobs"]]
    t = Table(title=f"{trace['trace']} ({trace['items']:,} items, {GPUS} GPUs, KV "
                    f"{trace['kv_tokens']:,} tokens/GPU): completion s / standalone s "
                    "(slowdown)")
    for col in ("policy", "makespan s", "vs tokens", *jobs, "deadlines", "missed"):
        t.add_column(col, justify="left" if col in ("policy", "missed") else "right")
    for name, r in pol.items():
        cells = []
        for j in r["jobs"]:
            mark = "" if j["deadline_met"] is None else " ok" if j["deadline_met"] else " MISS"
            cells.append(f"{j['completion_s']:.2f} / {j['standalone_s']:.2f} "
                         f"({j['slowdown']:.2f}x){mark}")
        t.add_row(name, f"{r['makespan_s']:.2f}",
                  f"{r['makespan_s'] / tok:.3f}" if tok else "-", *cells,
                  f"{r['deadlines_met']}/{r['deadlines']}" if r["deadlines"] else "-",
                  ", ".join(r["deadlines_missed"]) or "-")
    return t


def summary_table(traces: list[dict[str, Any]]) -> Table:
    t = Table(title="fabric with jobs vs fabric by tokens alone (simulated)")
    for col in ("trace", "makespan fabric / fabric-tokens", "worst small slowdown fabric",
                "fabric-tokens", "oracle", "deadlines met fabric", "fabric-tokens",
                "oracle", "targets"):
        t.add_column(col, justify="left" if col in ("trace", "targets") else "right")
    for tr in traces:
        f = tr["figures"]
        pol = tr["policies"]

        def slow(n: str, f: dict[str, Any] = f) -> str:
            v = f["small_slowdown"].get(n)
            return "-" if v is None else f"{v:.2f}x"

        def met(n: str, pol: dict[str, Any] = pol) -> str:
            p = pol.get(n)
            return f"{p['deadlines_met']}/{p['deadlines']}" if p and p["deadlines"] else "-"

        t.add_row(tr["trace"], "-" if f["makespan_ratio"] is None else f"{f['makespan_ratio']:.3f}",
                  slow("fabric"), slow(FABRIC_TOKENS), slow("oracle"),
                  met("fabric"), met(FABRIC_TOKENS), met("oracle"),
                  "met" if not f["targets_missed"] else "missed: " + "; ".join(
                      f["targets_missed"]))
    return t


def write_trace(name: str, scale: float, folder: Path) -> None:
    trace = job_trace(name, scale)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.jsonl").open("wb") as f:
        for d in trace.lines:
            f.write(msgspec.json.encode(d) + b"\n")
    with (folder / f"{name}.jobs.jsonl").open("wb") as f:
        for d in trace.jobs:
            f.write(msgspec.json.encode(d) + b"\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--traces", default=",".join(TRACES), help=f"of {', '.join(TRACES)}")
    p.add_argument("--scale", type=float, default=1.0, help="item counts and times x this")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--write", type=Path, default=None, help="write the traces' files here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.traces.split(",") if n.strip()]
    unknown = [n for n in names if n not in TRACES]
    if unknown:
        p.error(f"unknown trace {', '.join(unknown)}; known: {', '.join(TRACES)}")
    if a.write is not None:
        for n in names:
            write_trace(n, a.scale, a.write)
    jobs = [(n, a.scale, JOB_POLICIES) for n in names]
    t0 = time.perf_counter()
    if a.workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=a.workers) as pool:
            traces = list(pool.map(run_trace, *zip(*jobs, strict=True)))
    else:
        traces = [run_trace(*job) for job in jobs]
    wall = round(time.perf_counter() - t0, 1)
    for tr in traces:
        tr["figures"] = figures(tr)
    setup = {"gpus": GPUS, "max_num_seqs": MAX_NUM_SEQS, "pressure": PRESSURE,
             "scale": a.scale, "wall_s": wall}
    if a.json:
        print(json.dumps({"simulated": True, "setup": setup, "targets": TARGETS,
                          "traces": traces}))
    else:
        con = Console(width=max(Console().width, 170))
        for tr in traces:
            con.print(trace_table(tr))
        con.print(summary_table(traces))
        con.print(f"all figures simulated; {len(traces)} traces in {wall} s")
    missed = any(tr["figures"]["targets_missed"] for tr in traces)
    return 1 if a.strict and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
