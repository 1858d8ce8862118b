"""Embeddings on a real vLLM CPU pooling server: arrival order against `fabricctl run` with
the shapes it finds itself (`[producer] shapes = "auto"`), req/s and KV hits.

Contract. The model, the server and the workload are `bench/vllm_bench.py`'s (a random
~12M-parameter Llama, one vLLM 0.32 CPU server pinned to core 0 with prefix caching,
`--block-size 32`, a KV cache for the requests in flight plus TWO prefixes; `--shapes`
prefixes of 300 tokens of stdlib prose, Zipf popularity, `--items` items each a prefix and a
unique 8-40 token suffix, shuffled), served as an embedding model: `--runner pooling
--convert embed` (last-token pooling, so vLLM's prefix cache serves it). Each item is one
`/v1/embeddings` request whose `input` is its prefix and suffix as one string: an OpenAI
batch file with no fabricctl field, the form a user brings from run-batch or OpenAI.

Phases, on the same server, each after `POST /reset_prefix_cache`, vLLM's `/metrics`
scraped before and after:
  a. arrival:   the bench's httpx client, one `POST /v1/embeddings` per item, 16 in flight,
                in arrival (shuffled) order;
  b. grouped:   the same, the items stably sorted by their (known) prefix;
  c. auto:      the batch file through `fabricctl.cli.run.run_job` (what `fabricctl run`
                does), engine "openai", `[producer] shapes = "auto"` with the server's block
                size: fabricctl finds the prefixes itself;
  d. declared:  phase c with each line's prefix declared (`body.prefix`, the fabricctl
                extension), the shapes auto should find.
  e. auto-single: phase c with `[consumer] group_pooling = false`: one request per item
                (c, d group the items of a batch that differ only in their input into one
                request, `fabricctl.engines.pooled`).
Per phase: wall seconds, items/s, vLLM's hit rate (Δhits / Δqueries of
`vllm:prefix_cache_{hits,queries}_total`) and the achievable one (every full prefix block of
every request a hit but one cold prefill per prefix: F x (requests - shapes) / Δqueries).
Ratios: items/s of c over a and over b, d over a, c over e (wall: `run_job` whole, its start-up
included), and of c and d over a on `serve_s` (the run summary's job open to last result,
start-up left out); c's and d's hit rate minus the achievable.
`--json` prints one JSON object of these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
from vllm_bench import (
    BLOCK,
    IN_FLIGHT,
    MAX_MODEL_LEN,
    SERVED,
    VENV,
    Item,
    Occupancy,
    Phase,
    Tok,
    Workload,
    _kill_leftovers,
    build_model,
    corpus_paragraphs,
    free_port,
    kv_blocks,
    make_workload,
    measured_run,
    reset_prefix_cache,
    scrape,
    scrape_all,
    start_or_raise,
)

from fabricctl.config import AppConfig, ConsumerSettings, ProducerSettings, VllmSettings
from fabricctl.supervisor.launch_spec import vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher

POOLING = ("--runner", "pooling", "--convert", "embed")


async def client_phase(client: httpx.AsyncClient, name: str, wl: Workload,
                       order: list[Item]) -> Phase:
    """One `/v1/embeddings` request per item, IN_FLIGHT at a time, in `order`."""
    phase = Phase(name)
    todo = iter(order)
    bad: list[str] = []

    async def worker() -> None:
        for item in todo:
            body = {"model": SERVED, "input": wl.shapes[item.shape].prefix + item.prompt}
            resp = await client.post("/v1/embeddings", json=body)
            usage = resp.json().get("usage") or {} if resp.status_code == 200 else {}
            if resp.status_code != 200 or usage.get("prompt_tokens") != item.tokens:
                bad.append(f"{item.id}: HTTP {resp.status_code} {resp.text[:200]}")
                continue
            phase.items_done += 1

    before = await scrape(client)
    occupancy = Occupancy([client])
    occupancy.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    phase.wall_s = time.perf_counter() - t0
    phase.extra["occupancy"] = await occupancy.stop()
    phase.deltas = (await scrape(client)).minus(before)
    if bad:
        phase.error = f"{len(bad)} bad responses, first: {bad[0]}"
    return phase


def batch_lines(wl: Workload, declared: bool) -> str:
    """The items as OpenAI batch lines; with `declared`, each prefix as `body.prefix`."""
    out = []
    for i in wl.items:
        prefix = wl.shapes[i.shape].prefix
        body: dict[str, Any] = ({"model": SERVED, "input": i.prompt, "prefix": [prefix]}
                                if declared else {"model": SERVED, "input": prefix + i.prompt})
        out.append(json.dumps({"custom_id": i.id, "method": "POST", "url": "/v1/embeddings",
                               "body": body}) + "\n")
    return "".join(out)


async def fabricctl_phase(client: httpx.AsyncClient, wl: Workload, base_url: str,
                          model_dir: Path, work: Path, name: str, declared: bool,
                          group: bool = True) -> Phase:
    """The batch file through `run_job`, engine "openai", shapes found ("auto"); `group`:
    `[consumer] group_pooling`."""
    phase = Phase(name)
    path = work / f"{name}.jsonl"
    path.write_text(batch_lines(wl, declared))
    cfg = AppConfig(
        data_dir=work / f"fabric-data-{name}", engine="openai", model=SERVED,
        vllm=VllmSettings(endpoints=[base_url]),
        consumer=ConsumerSettings(max_batch_size=IN_FLIGHT,
                                  max_batch_tokens=IN_FLIGHT * wl.max_len,
                                  max_input_len=wl.max_len, window=2 * IN_FLIGHT,
                                  group_pooling=group),
        producer=ProducerSettings(tokenizer=str(model_dir / "tokenizer.json"),
                                  shapes="auto", block_size=BLOCK))
    summary, results = await measured_run(phase, [client], cfg, path)
    rows = [json.loads(line) for line in results.splitlines() if line.strip()]
    phase.items_done = sum(r["response"] is not None and r["response"]["status_code"] == 200
                           for r in rows)
    if summary is not None:
        s = msgspec.structs.asdict(summary)
        phase.extra.update(shapes_found=s.get("shapes"), shape_switches=s.get("shape_switches"),
                           serve_s=s.get("serve_s"))
    if phase.error is None and phase.items_done != len(wl.items):
        phase.error = f"{phase.items_done} of {len(wl.items)} items answered"
    return phase


def figures(p: Phase, wl: Workload) -> dict[str, Any]:
    d = p.deltas
    queries, hits = d.get("queries", 0.0), d.get("hits", 0.0)
    requests = d.get("requests", float(p.items_done))
    achievable = (wl.full_prefix_tokens * (requests - wl.shapes_used) / queries
                  if queries else None)
    serve_s = p.extra.get("serve_s")
    return {"wall_s": round(p.wall_s, 2),
            "items_per_s": round(p.items_done / p.wall_s, 1) if p.wall_s else None,
            "serve_items_per_s": round(p.items_done / serve_s, 1) if serve_s else None,
            "items_done": p.items_done,
            "hit_rate": round(hits / queries, 4) if queries else None,
            "achievable": None if achievable is None else round(achievable, 4),
            "prompt_tokens_computed": int(queries - hits), "error": p.error, **p.extra}


def ratios(ph: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    def r(a: str, b: str, key: str = "items_per_s") -> float | None:
        x, y = ph[a].get(key), ph[b]["items_per_s"]
        return round(x / y, 3) if x and y else None

    def below(name: str) -> float | None:
        p = ph[name]
        if p["hit_rate"] is None or p["achievable"] is None:
            return None
        return round(100 * (p["achievable"] - p["hit_rate"]), 2)

    return {"auto_over_arrival": r("auto", "arrival"), "auto_over_grouped": r("auto", "grouped"),
            "declared_over_arrival": r("declared", "arrival"),
            "auto_over_auto_single": r("auto", "auto-single"),
            "auto_serve_over_arrival": r("auto", "arrival", "serve_items_per_s"),
            "declared_serve_over_arrival": r("declared", "arrival", "serve_items_per_s"),
            "auto_points_below_achievable": below("auto"),
            "declared_points_below_achievable": below("declared")}


async def drive(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    paras = corpus_paragraphs()
    model_dir, built = build_model(work, paras)
    tok = Tok(model_dir / "tokenizer.json")
    wl = make_workload(tok, paras, args.shapes, args.items, args.seed)
    blocks, why = kv_blocks(wl)
    extra_args = ("--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
                  "--max-num-seqs", str(IN_FLIGHT), "--enforce-eager",
                  "--enable-prefix-caching", "--block-size", str(BLOCK),
                  "--num-gpu-blocks-override", str(blocks), *POOLING)
    spec = vllm_cpu_spec(VENV, str(model_dir), SERVED, work / "logs", port_base=free_port(1),
                         extra_args=extra_args, ready_timeout_s=300.0, stop_timeout_s=20.0,
                         env={"VLLM_SERVER_DEV_MODE": "1"})
    launcher = Launcher(spec, [0])
    atexit.register(_kill_leftovers, launcher)
    try:
        await start_or_raise(launcher)
        base_url = launcher.servers[0].base_url
        async with httpx.AsyncClient(base_url=base_url, timeout=300.0) as client:
            cfg = await scrape_all([client])
            if cfg.block_size != BLOCK or cfg.num_blocks != blocks:
                raise RuntimeError(f"server has {cfg.num_blocks} blocks of {cfg.block_size}, "
                                   f"asked for {blocks} of {BLOCK}")
            grouped = sorted(wl.items, key=lambda i: i.shape)
            phases: dict[str, Phase] = {}
            await client_phase(client, "warm-up", wl, wl.items[:IN_FLIGHT])
            for name in ("arrival", "grouped", "auto", "declared", "auto-single"):
                await reset_prefix_cache(client)
                if name in ("arrival", "grouped"):
                    order = list(wl.items) if name == "arrival" else grouped
                    phases[name] = await client_phase(client, name, wl, order)
                else:
                    phases[name] = await fabricctl_phase(client, wl, base_url, model_dir,
                                                         work, name, name == "declared",
                                                         group=name != "auto-single")
    finally:
        await launcher.stop()
        atexit.unregister(_kill_leftovers)
    ph = {name: figures(p, wl) for name, p in phases.items()}
    return {"phases": ph, "ratios": ratios(ph), "items": len(wl.items),
            "shapes": args.shapes, "shapes_used": wl.shapes_used, "kv_blocks": blocks,
            "kv_blocks_why": why, "model_params": built["params"],
            "full_prefix_tokens": wl.full_prefix_tokens}


def table(out: dict[str, Any]) -> str:
    rows = [f"{'phase':<10} {'items/s':>8} {'wall s':>7} {'hit':>7} {'achievable':>10} "
            f"{'computed':>9}  error"]
    for name, p in out["phases"].items():
        hit = "-" if p["hit_rate"] is None else f"{100 * p['hit_rate']:.1f}%"
        ach = "-" if p["achievable"] is None else f"{100 * p['achievable']:.1f}%"
        rows.append(f"{name:<10} {p['items_per_s'] or 0:>8.1f} {p['wall_s']:>7.2f} {hit:>7} "
                    f"{ach:>10} {p['prompt_tokens_computed']:>9}  {p['error'] or ''}")
    rows.append("ratios: " + ", ".join(f"{k} {v}" for k, v in out["ratios"].items()))
    return "\n".join(rows)


def bench_main(args: argparse.Namespace, prefix: str,
               drive_fn: Callable[[argparse.Namespace, Path], Awaitable[dict[str, Any]]],
               table_fn: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """`drive_fn(args, work)` in a work dir removed after; prints its table, or its JSON
    with `--json`; its figures."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        out = asyncio.run(drive_fn(args, work))
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    print(json.dumps(out) if args.json else table_fn(out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=480)
    ap.add_argument("--shapes", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    out = bench_main(ap.parse_args(argv), "pooling-bench-", drive, table)
    return 0 if all(p["error"] is None for p in out["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
