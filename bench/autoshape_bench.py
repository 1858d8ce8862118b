"""Shapes found against shapes declared: the hit rate `[producer] shapes = "auto"` reaches.
SIMULATED.

One workload of known shapes (`formats.workload.generate()`: `--shapes` shapes, each a
system prompt, a few-shot block and a tool schema drawn from shared pools, so shapes share
their leading blocks as template families do; Zipf `--zipf` popularity; lognormal per-line
questions) is written twice as OpenAI `/v1/completions` batch lines: once with each
shape's prefix declared (`body.prefix`), once as plain prompts (the prefix written into
`body.prompt`, no fabricctl field). Each runs through `fabricctl run`'s own job
(`cli.run.run_job`: the embedded broker, `--gpus` simulated GPUs whose KV cache holds about
`--kv-prefixes` prefixes beside `--batch` in-flight requests' own blocks), as:
- declared: the declared file (its shapes as declared);
- auto:     the plain file with `shapes = "auto"` (the finder: stable cuts, the default);
- longest:  the plain file with the finder's plain "longest prefix seen before" (each line
            its own longest shared run: no stable cut, no promotion) for comparison;
- arrival:  the declared file with every signature 0 (the engine sees the same shared text,
            the broker no shape: arrival order, in length lanes), the floor.
Every `--repeats`-th line asks its shape's previous question again (as eval sets do), and
with `--openers N` questions open with one of N templates. The table gives each run's
shapes, KV hit rate (the simulated engines' own counters) and its achievable bound (not
meaningful for arrival: the bound reads one shape's prefix, and arrival has one shape of
many prefixes), shape switches, and auto's hit rate against declared and arrival;
then the finder alone: lines given a prefix, and its cost per line (parse with the finder
minus parse without, the estimate's token counts, `--repeat` runs, the best).

    .venv/bin/python bench/autoshape_bench.py                # the table (about a minute)
    .venv/bin/python bench/autoshape_bench.py --json         # exactly one JSON object
    .venv/bin/python bench/autoshape_bench.py --items 2000 --shapes 12 --kv-prefixes 3

Measured 2026-12-02 (defaults: 4,000 items, 12 shapes, Zipf 1.1, 2 GPUs, KV for ~2
prefixes, batch 8, every 10th question repeated): declared 88.0%, auto 87.5% (21 shapes),
longest 79.5% (399 shapes: each repeated question its own), arrival 73.3%; the finder
~30 us a line of ~46 blocks on top of ~7 us parsing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fabricctl.cli.run as batchjob  # noqa: E402
import fabricctl.formats.reader as reader  # noqa: E402
import fabricctl.supervisor.fleet as fleet  # noqa: E402
from fabricctl.config import AppConfig, load_config  # noqa: E402
from fabricctl.engines.costs import DEFAULT_COSTS  # noqa: E402
from fabricctl.engines.sim import SimEngine  # noqa: E402
from fabricctl.formats.autoshape import ShapeFinder  # noqa: E402
from fabricctl.formats.reader import Parsed, parse_lines  # noqa: E402
from fabricctl.formats.workload import generate, make_shapes  # noqa: E402

enc = msgspec.json.Encoder()


class Longest(ShapeFinder):
    """Why: the rule without stable cuts, to measure what the stable cuts buy."""

    def find(self, keys: Any) -> int:
        self.lines += 1
        before = self.register(_chain(keys[: self.max_blocks]))
        m = 0
        while m < len(before) and before[m] > 0:
            m += 1
        self.found += m > 0
        return m


class Promote(ShapeFinder):
    """Why: the default rule with another `promote`, to measure the choice."""

    promote_to = 0

    def __init__(self, block_tokens: int = 16) -> None:
        super().__init__(block_tokens, promote=Promote.promote_to)


def _chain(keys: Any) -> list[int]:
    from fabricctl.formats.autoshape import chain

    return chain(keys)


OPENERS = [f"Opener {k}: read the passage below carefully, then answer in one short "
           "sentence, citing the line you used." for k in range(26)]


def lines(args: argparse.Namespace, declared: bool) -> Iterator[bytes]:
    last: dict[str, str] = {}  # each shape's last question, for the repeated ones
    for i, d in enumerate(generate(args.items, args.shapes, args.seed, zipf_s=args.zipf,
                      median_tokens=args.median_tokens, max_tokens=8,
                      prefix_tokens=args.prefix_tokens)):
        if args.openers:  # a templated question: its opening shared by some lines of a shape
            d["prompt"] = OPENERS[(i * 7919) % args.openers] + d["prompt"]
        if args.repeats and i % args.repeats == 0 and d["label"] in last:
            d["prompt"] = last[d["label"]]  # a question asked again, as eval sets have
        last[d["label"]] = d["prompt"]
        body: dict[str, Any] = {"model": "fabric-demo", "max_tokens": 8}
        if declared:
            body.update(prefix=d["prefix"], prompt=d["prompt"])
        else:
            body["prompt"] = "".join(d["prefix"]) + d["prompt"]
        yield enc.encode({"custom_id": d["id"], "method": "POST", "url": "/v1/completions",
                          "body": body}) + b"\n"


def kv_blocks(args: argparse.Namespace) -> int:
    """1 null block + `batch` in-flight requests' own blocks + `kv_prefixes` mean prefixes."""
    specs = make_shapes(args.shapes, args.seed, prefix_tokens=args.prefix_tokens)
    bs = DEFAULT_COSTS.block_size
    prefix = sum(s.tokens for s in specs) / len(specs) / bs
    own = math.ceil(2 * args.median_tokens / bs) + 1
    return 1 + args.batch * own + math.ceil(args.kv_prefixes * prefix)


def run(args: argparse.Namespace, path: Path, shapes: str, finder: type[ShapeFinder] | None,
        no_signature: bool, data: Path) -> dict[str, Any]:
    costs = dataclasses.replace(DEFAULT_COSTS, num_blocks=kv_blocks(args))

    def engines(cfg: AppConfig) -> list[Any]:
        c = cfg.consumer
        return [SimEngine(name=f"sim{i}", max_batch_size=c.max_batch_size,
                          max_batch_tokens=c.max_batch_tokens,
                          max_input_len=min(c.max_input_len, costs.kv_tokens - 1),
                          costs=costs, time_scale=cfg.sim.time_scale)
                for i in range(cfg.sim.gpus)]

    saved = (fleet.build_sim_engines, reader.signature, batchjob.Producer.__init__)
    fleet.build_sim_engines = engines  # type: ignore[assignment]
    if no_signature:
        reader.signature = lambda components: 0  # type: ignore[assignment]
    if finder is not None:
        import fabricctl.producer.session as session

        real_finder_for = session.finder_for
        session.finder_for = lambda s, b=16: finder(b)  # type: ignore[assignment,misc]
    try:
        cfg = load_config(cwd=data, env={}, overrides={"producer": {"shapes": shapes}})
        cfg = dataclasses.replace(
            cfg, data_dir=data, engine="sim", sim=dataclasses.replace(cfg.sim, gpus=args.gpus,
                                                                      time_scale=0.0),
            consumer=dataclasses.replace(cfg.consumer, max_batch_size=args.batch))
        t0 = time.perf_counter()
        summary = asyncio.run(batchjob.run_job(cfg, path, io.BytesIO(), errors=lambda m: None))
        wall = time.perf_counter() - t0
    finally:
        fleet.build_sim_engines, reader.signature = saved[0], saved[1]  # type: ignore[assignment]
        if finder is not None:
            session.finder_for = real_finder_for  # type: ignore[assignment]
    s = msgspec.structs.asdict(summary)
    return {"shapes": s["shapes"], "kv_hit_rate": s["kv_hit_rate"],
            "kv_hit_achievable": s["kv_hit_achievable"], "shape_switches": s["shape_switches"],
            "items": s["items"], "wall_s": round(wall, 2)}


def finder_cost(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    raw = path.read_bytes().splitlines()
    best_on = best_off = float("inf")
    found = 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for _p in parse_lines(raw):
            pass
        best_off = min(best_off, time.perf_counter() - t0)
        f = ShapeFinder(args.block)
        t0 = time.perf_counter()
        got = [p for p in parse_lines(raw, finder=f) if isinstance(p, Parsed)]
        best_on = min(best_on, time.perf_counter() - t0)
        found = f.found
    sigs = {p.item.signature for p in got}
    n = len(raw)
    return {"lines": n, "lines_shaped": found, "signatures": len(sigs),
            "parse_us_per_line": round(best_off / n * 1e6, 2),
            "finder_us_per_line": round((best_on - best_off) / n * 1e6, 2),
            "table_bytes": 12 * (f._mask + 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=4000)
    ap.add_argument("--shapes", type=int, default=12)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--median-tokens", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="max batch size (in flight)")
    ap.add_argument("--kv-prefixes", type=float, default=2.0)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--openers", type=int, default=0, help="questions open with one of N "
                    "~25-token templates (0: none)")
    ap.add_argument("--repeats", type=int, default=10, help="every N-th line repeats its "
                    "shape's previous question (0: none; default 10)")
    ap.add_argument("--promote", type=int, default=0, help="the finder's promote (0: default)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    Promote.promote_to = args.promote
    with tempfile.TemporaryDirectory(prefix="autoshape-bench-") as tmp:
        d = Path(tmp)
        declared, plain = d / "declared.jsonl", d / "plain.jsonl"
        declared.write_bytes(b"".join(lines(args, True)))
        plain.write_bytes(b"".join(lines(args, False)))
        runs = {
            "declared": run(args, declared, "declared", None, False, d / "a"),
            "auto": run(args, plain, "auto", Promote if args.promote else None, False, d / "b"),
            "longest": run(args, plain, "auto", Longest, False, d / "c"),
            "arrival": run(args, declared, "declared", None, True, d / "e"),
        }
        cost = finder_cost(args, plain)
    hit = {k: v["kv_hit_rate"] for k, v in runs.items()}
    out = {"params": {k: v for k, v in vars(args).items() if k != "json"},
           "kv_blocks": kv_blocks(args), "runs": runs, "finder": cost,
           "auto_vs_declared": round(hit["auto"] / hit["declared"], 4) if hit["declared"] else None,
           "auto_minus_arrival": round(hit["auto"] - hit["arrival"], 4)}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.items} items, {args.shapes} shapes (Zipf {args.zipf}), {args.gpus} simulated "
          f"GPUs, KV {out['kv_blocks']} blocks (~{args.kv_prefixes} prefixes), block "
          f"{args.block} tokens")
    print(f"{'run':<10}{'shapes':>8}{'KV hit':>9}{'achievable':>12}{'switches':>10}{'wall s':>8}")
    for name, r in runs.items():
        print(f"{name:<10}{r['shapes']:>8}{r['kv_hit_rate']:>9.1%}{r['kv_hit_achievable']:>12.1%}"
              f"{r['shape_switches']:>10}{r['wall_s']:>8}")
    print(f"auto / declared hit rate: {out['auto_vs_declared']}; auto - arrival: "
          f"{out['auto_minus_arrival']:+.1%}")
    print(f"finder: {cost['lines_shaped']} of {cost['lines']} lines shaped, "
          f"{cost['signatures']} signatures; {cost['finder_us_per_line']} us/line on top of "
          f"{cost['parse_us_per_line']} us/line parsing; table {cost['table_bytes'] >> 20} MiB")


if __name__ == "__main__":
    main()
