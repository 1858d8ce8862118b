"""What many shapes cost `fabricctl run`: 20,000 items over 20 to ~12,500 shapes. SIMULATED.

Each workload is 20,000 native items (`{"id", "model", "prefix", "prompt", "max_tokens"}`),
sized alike: a prefix of a ~200-token system prompt (one per four shapes, so shapes share
their leading blocks as template families do) and a ~300-token few-shot block of the shape's
own, then a 50-400-token prompt and 16 output tokens. The workloads differ only in how the
items fall into shapes:
- a:    20 shapes of 1,000 items;
- b:    5,000 shapes of 4 items;
- c:    12,500 shapes: 11,000 of one item, 1,500 of six (mostly one item each);
- d:    the same items as (a) with no prefix at all (signature 0: one shape, FIFO-like);
- e:    the items of (c) with each prefix written into its prompt instead of declared: the
        same tokens in one shape (signature 0), so arrival order: the FIFO floor of (c).
Every workload runs through the whole `fabricctl run` command (a subprocess: the simulated
engine, the default configuration, a temporary data dir, results to /dev/null, `--json`), and
the table gives its wall seconds (the command's, start-up included), the run's own `serve_s`,
items/s, and the ratio of its wall time to (a)'s and to (d)'s, with the KV hit rate of the
run against its achievable one.

    .venv/bin/python bench/shapes_bench.py                 # the table (a few minutes)
    .venv/bin/python bench/shapes_bench.py --json          # exactly one JSON object
    .venv/bin/python bench/shapes_bench.py --only a c      # some workloads
    .venv/bin/python bench/shapes_bench.py --write c -o c.jsonl   # just write a workload

A workload's file can be profiled as `python -m cProfile -o p.out -m fabricctl run FILE
--engine sim -o /dev/null` (the broker and the simulated engines run in that one process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

ITEMS = 20_000
WORKLOADS = {  # name -> (what, shape sizes: a list of (shapes, items each), prefixed)
    "a": ("20 shapes", [(20, 1_000)], True),
    "b": ("5,000 shapes", [(5_000, 4)], True),
    "c": ("12,500 shapes, mostly 1 item", [(11_000, 1), (1_500, 6)], True),
    "d": ("no prefix (signature 0)", [(20, 1_000)], False),
    "e": ("(c) undeclared: arrival order", [(11_000, 1), (1_500, 6)], True),
}
FOLDED = {"e"}  # the prefix is part of the prompt text, not declared


class _Text:
    """Why: cheap deterministic filler of exactly 4 bytes a token (the token estimate)."""

    def __init__(self, rng: random.Random) -> None:
        words = ["".join(rng.choices("etaoinshrdlucmfw", k=rng.randint(2, 8)))
                 for _ in range(2_000)]
        self.corpus = " ".join(rng.choice(words) for _ in range(60_000))
        self.rng = rng

    def fill(self, head: str, tokens: int) -> str:
        n = tokens * 4
        off = self.rng.randrange(len(self.corpus) - n)
        return (head + self.corpus[off:off + n])[:n]


def workload(name: str, seed: int = 0) -> Iterator[dict[str, Any]]:
    """The items of workload `name`, in a shuffled order, the same for the same seed."""
    _, sizes, prefixed = WORKLOADS[name]
    same = "c" if name in FOLDED else name  # a folded workload draws its twin's items
    rng = random.Random(f"{same}:{seed}")
    text = _Text(random.Random(f"text:{seed}"))
    counts = [each for shapes, each in sizes for _ in range(shapes)]
    assert sum(counts) == ITEMS, (name, sum(counts))
    systems = [text.fill(f"You are assistant #{i}. Follow the policy below.\n", 200)
               for i in range(max(1, len(counts) // 4))]
    order = [k for k, each in enumerate(counts) for _ in range(each)]
    rng.shuffle(order)
    fewshot: dict[int, str] = {}
    for i, k in enumerate(order):
        prefix: list[str] = []
        if prefixed:
            if k not in fewshot:
                fewshot[k] = text.fill(f"\nWorked examples of shape {k}:\n", 300)
            prefix = [systems[k % len(systems)], fewshot[k]]
        prompt = text.fill(f"\n[q{i}] ", rng.randint(50, 400))
        if name in FOLDED:
            prefix, prompt = [], "".join(prefix) + prompt
        yield {"id": f"q{i:05d}", "model": "fabric-demo", "prefix": prefix,
               "prompt": prompt, "max_tokens": 16}


def write_workload(name: str, path: Path, seed: int = 0) -> Path:
    enc = msgspec.json.Encoder()
    with path.open("wb") as f:
        for row in workload(name, seed):
            f.write(enc.encode(row) + b"\n")
    return path


def run_one(path: Path, timeout: float) -> dict[str, Any]:
    """`fabricctl run` on `path` in a subprocess: its wall seconds and its --json summary."""
    with tempfile.TemporaryDirectory(prefix="shapes-bench-") as tmp:
        env = {**os.environ, "FABRICCTL_DATA_DIR": tmp}
        env.pop("FABRICCTL_CONFIG", None)
        cmd = [sys.executable, "-m", "fabricctl", "run", str(path), "--engine", "sim",
               "--output", os.devnull, "--json"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                           timeout=timeout, check=False)
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"fabricctl run failed ({p.returncode}): {p.stderr[-2000:]}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--only", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS),
                    help="the workloads to run (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--write", choices=sorted(WORKLOADS), help="only write this workload")
    ap.add_argument("-o", "--output", type=Path, help="with --write: the file (default stdout)")
    args = ap.parse_args(argv)
    if args.write:
        write_workload(args.write, args.output or Path("/dev/stdout"), args.seed)
        return 0
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="shapes-bench-w-") as wdir:
        for name in args.only:
            path = write_workload(name, Path(wdir) / f"{name}.jsonl", args.seed)
            r = run_one(path, args.timeout)
            s = r["summary"]
            rows[name] = {
                "workload": WORKLOADS[name][0], "shapes": s["shapes"], "items": s["items"],
                "wall_s": r["wall_s"], "serve_s": s["serve_s"],
                "items_per_s": round(s["items"] / s["serve_s"], 1) if s["serve_s"] else None,
                "kv_hit_rate": s["kv_hit_rate"], "kv_hit_achievable": s["kv_hit_achievable"],
                "shape_switches": s["shape_switches"],
            }
            if not args.json:
                print(f"{name}: {r['wall_s']:.1f} s", file=sys.stderr)
    for row in rows.values():
        for base in ("a", "d", "e"):
            ref = rows.get(base)
            row[f"vs_{base}"] = round(row["wall_s"] / ref["wall_s"], 2) if ref else None
    if args.json:
        print(json.dumps({"items": ITEMS, "engine": "sim", "workloads": rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fabricctl run, {ITEMS:,} items, simulated engine, default config")
    for col in ("", "workload", "shapes", "wall s", "serve s", "items/s", "x (a)", "x (d)",
                "x (e)", "KV hit / achievable", "switches"):
        t.add_column(col, justify="left" if col in ("", "workload") else "right")
    for name, row in rows.items():
        t.add_row(name, row["workload"], f"{row['shapes']:,}", f"{row['wall_s']:.1f}",
                  f"{row['serve_s']:.1f}", f"{row['items_per_s']:,.0f}",
                  "-" if row["vs_a"] is None else f"{row['vs_a']:.2f}",
                  "-" if row["vs_d"] is None else f"{row['vs_d']:.2f}",
                  "-" if row["vs_e"] is None else f"{row['vs_e']:.2f}",
                  f"{row['kv_hit_rate']:.1%} / {row['kv_hit_achievable']:.1%}",
                  f"{row['shape_switches']:,}")
    Console(width=None if sys.stdout.isatty() else 150).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
