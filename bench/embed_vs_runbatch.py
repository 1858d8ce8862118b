"""Embeddings through `fabricctl run` against `vllm run-batch`: one file, one set of CPU server
flags, items/s net of start-up, with pooling items grouped into one request and without.

Contract. The model is the real-vLLM suite's tiny Llama (`tests/real/make_tiny_model.py`),
served as an embedding model with the suite's flags (`tests/real/conftest.py`: SERVER_ARGS
plus `--runner pooling --convert embed`), its engine bound to core 0
(`VLLM_CPU_OMP_THREADS_BIND=0`) on both sides. The file: `--items` `/v1/embeddings` lines of
8-40 random words (a quarter asking for base64 vectors), no fabricctl field: the file a
run-batch user has.
Phases, one after the other in one run:
  runbatch:  `python -m vllm.entrypoints.openai.run_batch` on the file. Net of start-up:
             from its "Reading batch from" log line (read as it comes) to its output file's
             last write (its mtime), so the model load and the process teardown are out.
  single:    `fabricctl run` (its `run_job`, engine openai) on the file against a server
             started beforehand with the same flags, `[consumer] group_pooling = false`
             (one request per item). Net of start-up: the run summary's `serve_s` (job open
             to last result); its wall (broker start included) is reported beside it.
  grouped:   the same with `group_pooling = true` (items that differ only in their input
             travel as one request), the tokenizer given as `[producer] tokenizer`.
  single and grouped run `--rounds` times alternately; each phase reports its best round.
Each fabricctl phase checks every row is a 200 whose `usage.prompt_tokens` equals
run-batch's for that line, and counts the HTTP requests the server answered on
/v1/embeddings (`http_requests_total` from its /metrics). Ratios: items/s of each
fabricctl phase over run-batch's (net), and grouped over single. `--json` prints one JSON
object of these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import io
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pooling_bench import bench_main
from vllm_bench import ROOT, VENV, _kill_leftovers, free_port

from fabricctl.cli.run import run_job
from fabricctl.config import AppConfig, ConsumerSettings, ProducerSettings, VllmSettings
from fabricctl.errors import LaunchError
from fabricctl.supervisor.launch_spec import vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher

sys.path.insert(0, str(ROOT / "tests"))  # the real tests' conftest imports `ports` from here
sys.path.insert(0, str(ROOT / "tests" / "real"))
from conftest import EMBED, MAKE_MODEL, SERVER_ARGS

SERVED = "tiny"
WORDS = ["the", "broker", "routes", "items", "a", "lane", "packs", "prefix", "cache", "keeps",
         "its", "blocks", "every", "consumer", "reads", "queue", "engine", "counts", "tokens",
         "one", "prompt", "evicts", "supervisor", "segment", "system", "tools", "shape",
         "warms", "query", "passage", "retrieve", "answer", "relevant"]


def env(core: int = 0) -> dict[str, str]:
    out = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(core))
    iomp = VENV / "lib" / "libiomp5.so"
    if iomp.exists():
        out["LD_PRELOAD"] = str(iomp)
    return out


def lines(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body: dict[str, Any] = {"model": SERVED,
                                "input": " ".join(rng.choices(WORDS, k=rng.randint(8, 40)))}
        if i % 4 == 3:
            body["encoding_format"] = "base64"
        out.append(json.dumps({"custom_id": f"e{i}", "method": "POST",
                               "url": "/v1/embeddings", "body": body}) + "\n")
    return "".join(out)


def usage_of(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    return {r["custom_id"]: (r["response"]["body"]["usage"]["prompt_tokens"]
                             if r["response"] and r["response"]["status_code"] == 200 else None)
            for r in rows}


async def runbatch_phase(model: Path, inp: Path, out: Path) -> dict[str, Any]:
    t0 = time.time()
    proc = await asyncio.create_subprocess_exec(
        str(VENV / "bin" / "python"), "-W", "ignore", "-m", "vllm.entrypoints.openai.run_batch",
        "-i", str(inp), "-o", str(out), "--model", str(model), "--served-model-name", SERVED,
        *SERVER_ARGS, *EMBED, env=env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    reading = None
    tail: list[str] = []
    async for raw in proc.stdout:
        line = raw.decode(errors="replace")
        tail = [*tail[-40:], line]
        if reading is None and "Reading batch from" in line:
            reading = time.time()
    rc = await proc.wait()
    wall = time.time() - t0
    if rc != 0 or reading is None:
        raise LaunchError(f"run-batch failed (rc {rc}):\n{''.join(tail)}")
    net = out.stat().st_mtime - reading
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    return {"wall_s": round(wall, 2), "net_s": round(net, 2), "rows": rows}


async def embed_requests(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("http_requests_total{") and '"/v1/embeddings"' in line)


async def fabricctl_phase(client: httpx.AsyncClient, base_url: str, model: Path, inp: Path,
                          work: Path, name: str, group: bool, batch: int,
                          want: dict[str, int | None]) -> dict[str, Any]:
    cfg = AppConfig(
        data_dir=work / f"data-{name}", engine="openai", model=SERVED,
        vllm=VllmSettings(endpoints=[base_url]),
        consumer=ConsumerSettings(max_batch_size=batch, max_batch_tokens=batch * 512,
                                  max_input_len=500, group_pooling=group),
        producer=ProducerSettings(tokenizer=str(model / "tokenizer.json")))
    sink = io.BytesIO()
    errors: list[str] = []
    before = await embed_requests(client)
    t0 = time.perf_counter()
    summary = await run_job(cfg, inp, sink, errors=errors.append)
    wall = time.perf_counter() - t0
    requests = await embed_requests(client) - before
    rows = [json.loads(x) for x in sink.getvalue().splitlines() if x.strip()]
    got = usage_of(rows)
    bad = [cid for cid, n in want.items() if got.get(cid) != n or n is None]
    serve = getattr(summary, "serve_s", None)
    return {"wall_s": round(wall, 2), "net_s": round(serve or wall, 2),
            "requests": int(requests), "mismatched": len(bad) + len(errors),
            "first_mismatch": bad[0] if bad else (errors[0] if errors else None)}


async def drive(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = work / "model"
    subprocess.run([str(VENV / "bin" / "python"), str(MAKE_MODEL), str(model)], check=True,
                   env=env(), timeout=300, capture_output=True)
    inp = work / "in.jsonl"
    inp.write_text(lines(args.items, args.seed))
    rb = await runbatch_phase(model, inp, work / "rb.jsonl")
    want = usage_of(rb.pop("rows"))
    spec = vllm_cpu_spec(VENV, str(model), SERVED, work / "logs", port_base=free_port(1),
                         extra_args=(*SERVER_ARGS, *EMBED), ready_timeout_s=300.0,
                         stop_timeout_s=20.0,
                         env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"})
    launcher = Launcher(spec, [0])
    atexit.register(_kill_leftovers, launcher)
    phases: dict[str, list[dict[str, Any]]] = {"single": [], "grouped": []}
    try:
        await launcher.start()
        base_url = launcher.servers[0].base_url
        async with httpx.AsyncClient(base_url=base_url, timeout=60.0) as client:
            for r in range(args.rounds):
                for name in (("single", "grouped") if r % 2 == 0 else ("grouped", "single")):
                    phases[name].append(await fabricctl_phase(
                        client, base_url, model, inp, work, f"{name}{r}", name == "grouped",
                        args.batch, want))
    finally:
        await launcher.stop()
        atexit.unregister(_kill_leftovers)
    n = args.items
    out: dict[str, Any] = {"items": n, "batch": args.batch, "rounds": args.rounds,
                           "phases": {"runbatch": {**rb, "items_per_s": round(n / rb["net_s"], 1)}}}
    for name, runs in phases.items():
        best = min(runs, key=lambda p: p["net_s"])
        out["phases"][name] = {**best, "items_per_s": round(n / best["net_s"], 1),
                               "rounds_net_s": [p["net_s"] for p in runs]}
    rate = {name: p["items_per_s"] for name, p in out["phases"].items()}
    out["ratios"] = {"single_over_runbatch": round(rate["single"] / rate["runbatch"], 3),
                     "grouped_over_runbatch": round(rate["grouped"] / rate["runbatch"], 3),
                     "grouped_over_single": round(rate["grouped"] / rate["single"], 3)}
    return out


def table(out: dict[str, Any]) -> str:
    rows = [f"{'phase':<9} {'items/s':>8} {'net s':>7} {'wall s':>7} {'requests':>8} "
            f"{'mismatched':>10}"]
    for name, p in out["phases"].items():
        rows.append(f"{name:<9} {p['items_per_s']:>8.1f} {p['net_s']:>7.2f} {p['wall_s']:>7.2f} "
                    f"{p.get('requests', '-'):>8} {p.get('mismatched', '-'):>10}")
    rows.append(f"{out['items']} items, max_batch_size {out['batch']}, best of "
                f"{out['rounds']} rounds; ratios: "
                + ", ".join(f"{k} {v}" for k, v in out["ratios"].items()))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64, help="[consumer] max_batch_size")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    out = bench_main(ap.parse_args(argv), "embed-vs-runbatch-", drive, table)
    return 0 if all(p.get("mismatched", 0) == 0 for p in out["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
