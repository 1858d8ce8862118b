"""Windows rehearsed in the replay (issue 41): fabric, EDF, fair share alone, the oracle. SIMULATED.

Each scenario is `fabricctl.replay.workload.windows_trace`: equal jobs at t = 0 (`--items`
each over two shapes of their own; 2,048-token prefixes, median 64-token prompts, 8 output
tokens), job k's window k-th factor x T, where T is one job replayed alone through fabric on
the same 2 simulated GPUs (cache pressure 1, `fabricctl replay`'s engine and costs). Every
policy replays the same trace: fabric (windows, fair share, the bound; its forecast starts
from the cost model's pace), edf (a queue per job, earliest deadline first, blind to
shapes), fabric-fair (fabric told no windows: fair share alone), the oracle (an omniscient
shape scheduler, earliest deadline first within priority) and fabric-tokens. Reported per
policy: the deadlines met, the jobs that missed, the makespan and its ratio to the oracle's.
- three: windows 1.4T, 2.4T, 3.4T;
- five: 1.2T, 2.2T, 3.2T, 4.2T, 5.2T;
- out-of-reach: 0.5T, 1.4T, 2.4T, 3.4T (the first cannot be met even served first).

    .venv/bin/python bench/windows_replay_bench.py            # a table per scenario
    .venv/bin/python bench/windows_replay_bench.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricctl.replay.run import (
    EDF,
    FABRIC_FAIR,
    FABRIC_TOKENS,
    ORACLE,
    costs_for,
    job_alone,
    limits_for,
    replay,
)
from fabricctl.replay.workload import trace_workload, windows_trace

GPUS = 2
MAX_NUM_SEQS = 64
POLICIES = ("fabric", EDF, FABRIC_FAIR, ORACLE, FABRIC_TOKENS)
SCENARIOS = {"three": (1.4, 2.4, 3.4), "five": (1.2, 2.2, 3.2, 4.2, 5.2),
             "out-of-reach": (0.5, 1.4, 2.4, 3.4)}


def scenario(ks: tuple[float, ...], items: int) -> dict[str, Any]:
    """T measured, then the trace with its windows through every policy."""
    probe, specs = trace_workload(windows_trace(ks, 1.0, items))
    costs = costs_for(probe, pressure=1.0, max_num_seqs=MAX_NUM_SEQS)
    limits = limits_for(probe, costs)
    t = job_alone(probe, specs[1], "fabric", GPUS, costs, limits)
    work, jobs = trace_workload(windows_trace(ks, t, items))
    res = replay(work, list(POLICIES), GPUS, costs, limits, jobs=jobs, standalone=False)
    oracle = res[ORACLE].makespan_s
    return {"T": round(t, 3), "windows": list(ks), "policies": {
        name: {"deadlines_met": r.deadlines_met, "deadlines": r.deadlines,
               "missed": r.deadlines_missed, "makespan_s": round(r.makespan_s, 3),
               "makespan_vs_oracle": round(r.makespan_s / oracle, 3),
               "completion_s": [round(j.completion_s, 3) for j in (r.jobs or [])]}
        for name, r in res.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=300, help="items per job")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = {name: scenario(ks, args.items) for name, ks in SCENARIOS.items()}
    if args.json:
        print(json.dumps(out))
        return 0
    for name, sc in out.items():
        print(f"{name}: windows {', '.join(f'{k}T' for k in sc['windows'])}, "
              f"T = {sc['T']:.3f} s (simulated)")
        print(f"  {'policy':14} {'met':>5} {'makespan s':>11} {'vs oracle':>10}  missed")
        for pol, f in sc["policies"].items():
            print(f"  {pol:14} {f['deadlines_met']:>2}/{f['deadlines']:<2} "
                  f"{f['makespan_s']:>11.3f} {f['makespan_vs_oracle']:>10.3f}  "
                  f"{', '.join(f['missed'] or []) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
