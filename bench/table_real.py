"""table_bench's real-server part: the orders through `fabricctl run` on a vLLM CPU server.

Contract: `real(query, rows, rounds)` builds the bench model and starts one vLLM CPU server
as bench/vllm_bench.py does (its helpers), plans `rows` three ways (original, GGR, FABRIC;
weights: the model's own token counts), and sends each order `rounds` times as native
JSONL through `python -m fabricctl run` (a subprocess, prefix cache reset before each),
timing each run from its start to its exit and reading the server's prefix-cache counters
and CPU seconds around it; the server is stopped at the end, also on an error.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from table_bench import Query, prompts

from fabricctl.core.table_plan import Method, TablePlan, plan_table


def native(q: Query, rows: list[list[str]], plan: TablePlan, model: str) -> str:
    lines = []
    for k, (prefix, prompt) in zip(plan.order, prompts(q, rows, plan), strict=True):
        lines.append(json.dumps({"id": f"r{k}", "model": model, "prefix": prefix,
                                 "prompt": prompt, "max_tokens": 4,
                                 "params": {"ignore_eos": True, "temperature": 0}}) + "\n")
    return "".join(lines)


async def real(q: Query, rows: list[list[str]], rounds: int) -> dict[str, Any]:
    """Original, GGR and FABRIC through `fabricctl run` on one vLLM CPU server."""
    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm_bench as vb

    work = Path(tempfile.mkdtemp(prefix="table-bench-"))
    paras = vb.corpus_paragraphs()
    model_dir, _built = vb.build_model(work, paras)
    tok = vb.Tok(model_dir / "tokenizer.json")
    weight = lambda c: len(tok.ids(c))  # noqa: E731
    chosen = {n: plan_table(rows, weight, method=m)
              for n, m in (("original", Method.ORIGINAL), ("ggr", Method.GGR),
                           ("fabric", Method.FABRIC))}
    longest = max(len(tok.ids("".join(p) + s)) for p, s in prompts(q, rows, chosen["original"]))
    if longest + 4 > vb.MAX_MODEL_LEN:
        raise RuntimeError(f"a prompt of {longest} tokens: over {vb.MAX_MODEL_LEN}")
    own = math.ceil((longest + 4) / vb.BLOCK)
    blocks = max(1 + vb.IN_FLIGHT * own + 2 * own, math.ceil(vb.MAX_MODEL_LEN / vb.BLOCK) + 1)
    spec = vb.vllm_cpu_spec(vb.VENV, str(model_dir), vb.SERVED, work / "logs",
                            port_base=vb.free_port(1),
                            extra_args=("--dtype", "float32", "--max-model-len",
                                        str(vb.MAX_MODEL_LEN), "--max-num-seqs",
                                        str(vb.IN_FLIGHT), "--enforce-eager",
                                        "--enable-prefix-caching", "--block-size",
                                        str(vb.BLOCK), "--num-gpu-blocks-override",
                                        str(blocks)),
                            ready_timeout_s=300.0, stop_timeout_s=20.0,
                            env={"VLLM_SERVER_DEV_MODE": "1"})  # /reset_prefix_cache
    launcher = vb.Launcher(spec, [0])
    out: dict[str, Any] = {"rows": len(rows), "kv_blocks": blocks, "longest_prompt": longest,
                           "runs": {n: [] for n in chosen}}
    try:
        await vb.start_or_raise(launcher)
        server = launcher.servers[0]
        pids = [p for p in launcher.pids().values() if p is not None]
        vb.keep_off_the_engine_core(pids, {0})
        cfg = work / "run.toml"
        cfg.write_text(f'[broker]\nprewarm = "off"\n\n[vllm]\nendpoints = '
                       f"[{json.dumps(server.base_url)}]\n\n[consumer]\nmax_batch_size = "
                       f"{vb.IN_FLIGHT}\nmax_batch_tokens = {vb.IN_FLIGHT * (longest + 4)}\n"
                       f"max_input_len = {longest + 4}\n\n[producer]\ntokenizer = "
                       f"{json.dumps(str(model_dir / 'tokenizer.json'))}\n")
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300.0) as client:
            await vb.warm_up(client, tok, paras)
            for r in range(rounds):
                for name, plan in chosen.items():
                    await vb.reset_prefix_cache(client)
                    before = await vb.scrape(client)
                    items = work / f"{name}.jsonl"
                    items.write_text(native(q, rows, plan, vb.SERVED))
                    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICCTL_")}
                    env["FABRICCTL_CONFIG"] = str(cfg)
                    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
                    argv = [sys.executable, "-m", "fabricctl", "run", str(items), "--config",
                            str(cfg), "--engine", "openai", "--model", vb.SERVED, "--output",
                            str(work / f"{name}-{r}.out.jsonl"), "--json"]
                    cpu0 = server_cpu(pids)
                    t0 = time.perf_counter()
                    done = subprocess.run(argv, cwd=work, env=env, capture_output=True,
                                          text=True, timeout=1800)
                    wall = time.perf_counter() - t0
                    cpu = server_cpu(pids) - cpu0
                    after = await vb.scrape(client)
                    d = {k: after.values[k] - before.values[k] for k in after.values}
                    out["runs"][name].append({
                        "wall_s": round(wall, 2), "server_cpu_s": round(cpu, 2),
                        "exit": done.returncode,
                        "hit_rate": round(d["hits"] / d["queries"], 3) if d["queries"] else 0,
                        "prompt_tokens_computed": int(d["queries"] - d["hits"])})
                    if done.returncode:
                        out["error"] = done.stderr[-500:]
    finally:
        await launcher.stop()
        if "error" not in out:
            shutil.rmtree(work, ignore_errors=True)
    med = {n: statistics.median(x["wall_s"] for x in v) for n, v in out["runs"].items() if v}
    cpu = {n: statistics.median(x["server_cpu_s"] for x in v)
           for n, v in out["runs"].items() if v}
    out["median_wall_s"], out["median_server_cpu_s"] = med, cpu
    if len(med) == 3:
        out["vs_original"] = round(med["original"] / med["fabric"], 3)
        out["vs_ggr"] = round(med["ggr"] / med["fabric"], 3)
        out["cpu_vs_original"] = round(cpu["original"] / cpu["fabric"], 3)
        out["cpu_vs_ggr"] = round(cpu["ggr"] / cpu["fabric"], 3)
        out["serve_s_per_row"] = round(med["fabric"] / len(rows), 4)
    out["command"] = "python -m fabricctl run ITEMS --config F --engine openai --model bench"
    return out


def server_cpu(pids: list[int]) -> float:
    """CPU seconds the servers' processes and their children have used so far (the work
    done, which the host's other load does not inflate as it does wall time)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


