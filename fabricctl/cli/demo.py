"""`make demo`: the main job on embedded defaults — a realistic workload through `fabricctl run`.

Not a `fabricctl` command: `python -m fabricctl.cli.demo [--items N --shapes N --dir DIR]`.
Contract: writes a 20-shape workload (Zipf popularity, lognormal lengths) under ./data/demo,
runs it through an embedded broker whose LMDB lives in ./data/demo/broker (the simulated
engine when there is no GPU), writes the results next to it and prints the run summary.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import sys
from pathlib import Path

import msgspec

from fabricctl.cli.run import run_job
from fabricctl.cli.run_summary import print_run_summary
from fabricctl.config import load_config
from fabricctl.formats.workload import generate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=40_000)
    ap.add_argument("--shapes", type=int, default=20)
    ap.add_argument("--dir", type=Path, default=Path("data/demo"))
    args = ap.parse_args(argv)
    workdir: Path = args.dir
    workdir.mkdir(parents=True, exist_ok=True)
    workload = workdir / "workload.jsonl"
    enc = msgspec.json.Encoder()
    with workload.open("wb") as fp:
        for line in generate(args.items, args.shapes, seed=7, median_tokens=400,
                             max_tokens=64):
            fp.write(enc.encode(line) + b"\n")
    broker_dir = workdir / "broker"
    shutil.rmtree(broker_dir, ignore_errors=True)
    cfg = dataclasses.replace(load_config(), data_dir=broker_dir)
    results = workdir / "results.jsonl"
    print(f"demo: {args.items:,} items in {args.shapes} shapes -> {workload}", file=sys.stderr)
    with results.open("wb") as out:
        summary = asyncio.run(run_job(cfg, workload, out, keep_data=True))
    print_run_summary(summary)
    print(f"demo: results in {results}; broker data in {broker_dir}", file=sys.stderr)
    return 0 if summary.ledger_difference == (0, 0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
