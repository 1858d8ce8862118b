"""Batch beside a live service on one real vLLM CPU server: what the live client sees.

Contract. One run builds the bench's random Llama (`vllm_bench.build_model`), starts one vLLM
0.32 CPU server through fabricctl's launcher with `--scheduling-policy priority` and
`--max-num-seqs 16`, and runs, on it, in turn:
  alone:    the live client alone for `--seconds`: Poisson arrivals at `--live-rps`,
            streamed completions (its own system prompt, `max_tokens` 8, priority 0); the
            time to first token (TTFT) of each is recorded;
  batch:    the batch alone: `--items` native lines through `fabricctl.cli.run.run_job`
            (engine "openai", a fixed window of 3 batches of 16), its items/s;
  shared:   the live client beside the same batch with `[vllm] shared = true` (capacity 16,
            `live_ttft_target_s` = `--target` x the alone p99);
  fixed-W:  the same with `shared` off and a fixed consumer window W, for each W of
            `--windows` (the sweep the shared window is compared with).
The live client runs for as long as the batch does in each phase beside it.
With `--replay` the same comparison runs on the simulated server (`fabricctl.replay.colocate`,
the GPU cost profile, `--max-num-seqs 256`), live traffic at `--load` of its capacity
(Poisson, then a diurnal curve), each policy on the same arrivals: alone, fixed windows, the
controller (target `--target` x the alone p99) and the oracle that knows the arrivals. Figures:
TTFT p50/p99 per phase and their ratios to alone (`ttft_p50_ratio`, `ttft_p99_ratio` for
shared), the batch's items/s as a share of alone (`batch_share_of_alone`), and against the
best fixed window whose p99 ratio meets the target (`vs_best_fixed_window`; None when none
meets it). Live errors are counted. This box's cores are shared by the client, fabricctl and
the engine: a figure is a ratio against `alone` measured in the same run.
`--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from vllm_bench import VENV, build_model, corpus_paragraphs, free_port, start_or_raise

from fabricctl.cli.run import run_job
from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings
from fabricctl.engines.costs import SimCosts
from fabricctl.replay import colocate as sim
from fabricctl.supervisor.launch_spec import vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher

SERVED = "bench"
CAPACITY = 16
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", str(CAPACITY),
               "--enforce-eager", "--enable-prefix-caching", "--block-size", "32",
               "--scheduling-policy", "priority")
LIVE_SYSTEM = "You are the support assistant of a shipping company. Answer briefly. "


@dataclasses.dataclass
class Phase:
    """Why: one phase's live latencies and batch pace, the rows of the table."""

    name: str
    ttft_s: list[float] = dataclasses.field(default_factory=list)
    live_errors: int = 0
    batch_items: int = 0
    batch_s: float = 0.0

    def pct(self, q: float) -> float | None:
        if len(self.ttft_s) < 2:
            return None
        return statistics.quantiles(self.ttft_s, n=100, method="inclusive")[int(q) - 1]

    @property
    def items_per_s(self) -> float | None:
        return self.batch_items / self.batch_s if self.batch_s else None


async def live_client(url: str, rps: float, stop: asyncio.Event, phase: Phase,
                      seed: int) -> None:
    """Poisson arrivals until `stop`, each a streamed completion timed to its first token."""
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"model": SERVED, "prompt": f"{LIVE_SYSTEM}Customer {i}: where is my parcel?",
                "max_tokens": 8, "stream": True, "priority": 0, "temperature": 0}
        t0 = time.perf_counter()
        try:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    phase.live_errors += 1
                    return
                first = True
                async for _ in resp.aiter_lines():
                    if first:
                        phase.ttft_s.append(time.perf_counter() - t0)
                        first = False
        except httpx.HTTPError:
            phase.live_errors += 1

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        i = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.expovariate(rps))
            if stop.is_set():
                break
            t = asyncio.ensure_future(one(client, i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.wait(tasks)


def batch_lines(paras: list[str], items: int) -> str:
    rng = random.Random(7)
    shapes = [f"Summarise in one line. Context: {p[:400]}\n" for p in paras[:4]]
    return "".join(json.dumps({"id": f"b{i}", "model": SERVED, "prefix": [rng.choice(shapes)],
                               "prompt": f"Item {i}:", "max_tokens": 8,
                               "params": {"temperature": 0, "ignore_eos": True}}) + "\n"
                   for i in range(items))


async def batch_phase(phase: Phase, url: str, work: Path, model_dir: Path, lines: Path,
                      window: int, shared: bool, target_s: float) -> None:
    cfg = AppConfig(data_dir=work / f"data-{phase.name}", engine="openai", model=SERVED,
                    vllm=VllmSettings(endpoints=[url], shared=shared, shared_capacity=CAPACITY,
                                      live_ttft_target_s=target_s if shared else 0.0),
                    consumer=ConsumerSettings(max_batch_size=16, max_batch_tokens=16 * 1024,
                                              max_input_len=1024, window=window))
    cfg = dataclasses.replace(cfg, producer=dataclasses.replace(
        cfg.producer, tokenizer=str(model_dir / "tokenizer.json")))
    sink = io.BytesIO()
    t0 = time.perf_counter()
    await run_job(cfg, lines, sink, errors=lambda m: None, keep_data=True)
    phase.batch_s = time.perf_counter() - t0
    phase.batch_items = sum(1 for x in sink.getvalue().splitlines()
                            if json.loads(x).get("error") is None)


async def beside(phase: Phase, url: str, rps: float, batch: Any) -> None:
    stop = asyncio.Event()
    live = asyncio.ensure_future(live_client(url, rps, stop, phase, seed=hash(phase.name)))
    try:
        await batch
    finally:
        stop.set()
        await live


async def drive(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    paras = corpus_paragraphs()
    model_dir, _ = build_model(work, paras)
    lines = work / "batch.jsonl"
    lines.write_text(batch_lines(paras, args.items))
    spec = vllm_cpu_spec(VENV, str(model_dir), SERVED, work / "logs", port_base=free_port(),
                         extra_args=SERVER_ARGS, ready_timeout_s=300.0)
    launcher = Launcher(spec, [0])
    await start_or_raise(launcher)
    url = launcher.servers[0].base_url
    phases: dict[str, Phase] = {}
    try:
        alone = phases["alone"] = Phase("alone")
        stop = asyncio.Event()
        live = asyncio.ensure_future(live_client(url, args.live_rps, stop, alone, seed=1))
        await asyncio.sleep(args.seconds)  # the phase's length, not a synchronisation
        stop.set()
        await live
        p99_alone = alone.pct(99) or 0.1
        target = args.target * p99_alone
        phases["batch"] = Phase("batch")
        await batch_phase(phases["batch"], url, work, model_dir, lines, 48, False, 0.0)
        phases["shared"] = Phase("shared")
        await beside(phases["shared"], url, args.live_rps, batch_phase(
            phases["shared"], url, work, model_dir, lines, 48, True, target))
        for w in args.windows:
            p = phases[f"fixed-{w}"] = Phase(f"fixed-{w}")
            await beside(p, url, args.live_rps,
                         batch_phase(p, url, work, model_dir, lines, w, False, 0.0))
    finally:
        await launcher.stop()
    return figures(phases, args.target)


def figures(phases: dict[str, Phase], target: float) -> dict[str, Any]:
    alone, batch, shared = phases["alone"], phases["batch"], phases["shared"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    rows = {n: {"ttft_p50_ms": 1000 * (p.pct(50) or 0), "ttft_p99_ms": 1000 * (p.pct(99) or 0),
                "live_requests": len(p.ttft_s), "live_errors": p.live_errors,
                "batch_items_per_s": p.items_per_s,
                "p99_ratio": ratio(p.pct(99), alone.pct(99))}
            for n, p in phases.items()}
    meeting = [p for n, p in phases.items() if n.startswith("fixed-")
               and (r := ratio(p.pct(99), alone.pct(99))) is not None and r <= target]
    best = max((p.items_per_s or 0 for p in meeting), default=None)
    return {"phases": rows, "target_ratio": target,
            "ttft_p50_ratio": ratio(shared.pct(50), alone.pct(50)),
            "ttft_p99_ratio": ratio(shared.pct(99), alone.pct(99)),
            "batch_share_of_alone": ratio(shared.items_per_s, batch.items_per_s),
            "vs_best_fixed_window": ratio(shared.items_per_s, best),
            "live_errors": sum(p.live_errors for p in phases.values())}


def table(out: dict[str, Any]) -> str:
    rows = [f"{'phase':<10} {'p50 ms':>8} {'p99 ms':>8} {'p99/alone':>9} {'live':>5} "
            f"{'batch it/s':>10}"]
    for n, r in out["phases"].items():
        ips = r["batch_items_per_s"]
        p99r = r["p99_ratio"]
        rows.append(f"{n:<10} {r['ttft_p50_ms']:>8.1f} {r['ttft_p99_ms']:>8.1f} "
                    f"{'' if p99r is None else f'{p99r:.2f}x':>9} {r['live_requests']:>5} "
                    f"{'' if ips is None else f'{ips:.1f}':>10}")
    fmt = {k: out[k] for k in ("ttft_p50_ratio", "ttft_p99_ratio", "batch_share_of_alone",
                               "vs_best_fixed_window", "live_errors")}
    rows.append("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in fmt.items()))
    return "\n".join(rows)


def replay(args: argparse.Namespace) -> dict[str, Any]:
    """The comparison on the simulated server: per arrival curve, per policy."""
    costs = SimCosts(max_num_seqs=256, max_num_batched_tokens=args.sim_chunk)
    base = sim.Trace((), args.sim_seconds)
    cap = sim.live_capacity(base, costs)
    batch_alone = sim.simulate(base, sim.Fixed(costs.max_num_seqs), costs).batch_per_s
    out: dict[str, Any] = {"live_capacity_per_s": cap, "batch_alone_per_s": batch_alone}
    for curve, arrivals in (("poisson", sim.poisson(args.load * cap, args.sim_seconds)),
                            ("diurnal", sim.diurnal(args.load * cap, args.sim_seconds))):
        trace = dataclasses.replace(base, live_arrivals=arrivals)
        alone = sim.simulate(trace, sim.Alone(), costs)
        policies: dict[str, sim.Policy] = {f"fixed-{w}": sim.Fixed(w) for w in args.sim_windows}
        policies["controlled"] = sim.Controlled(target_s=args.target * alone.pct(99))
        policies["oracle"] = sim.Oracle()
        rows = {}
        for name, policy in policies.items():
            r = sim.simulate(trace, policy, costs)
            rows[name] = {"ttft_p50_ratio": r.pct(50) / alone.pct(50),
                          "ttft_p99_ratio": r.pct(99) / alone.pct(99),
                          "batch_share_of_alone": r.batch_per_s / batch_alone,
                          "recomputed_tokens": r.recomputed_tokens}
        ctl, orc = rows["controlled"], rows["oracle"]
        meeting = [r["batch_share_of_alone"] for n, r in rows.items()
                   if n.startswith("fixed-") and r["ttft_p99_ratio"] <= args.target]
        out[curve] = {"alone_p50_ms": 1000 * alone.pct(50), "alone_p99_ms": 1000 * alone.pct(99),
                      "policies": rows, **{k: ctl[k] for k in (
                          "ttft_p50_ratio", "ttft_p99_ratio", "batch_share_of_alone")},
                      "vs_best_fixed_window": (ctl["batch_share_of_alone"] / max(meeting)
                                               if meeting else None),
                      "vs_oracle": (ctl["batch_share_of_alone"] / orc["batch_share_of_alone"]
                                    if orc["batch_share_of_alone"] else None)}
    return out


def replay_table(out: dict[str, Any]) -> str:
    rows = [f"simulated server: live capacity {out['live_capacity_per_s']:.1f} req/s, batch "
            f"alone {out['batch_alone_per_s']:.1f} req/s"]
    for curve in ("poisson", "diurnal"):
        c = out[curve]
        rows.append(f"{curve}: alone p50 {c['alone_p50_ms']:.0f} ms, p99 {c['alone_p99_ms']:.0f}"
                    " ms")
        rows.append(f"  {'policy':<12} {'p50 x':>6} {'p99 x':>6} {'batch':>6} {'recomputed':>11}")
        for n, r in c["policies"].items():
            rows.append(f"  {n:<12} {r['ttft_p50_ratio']:>6.2f} {r['ttft_p99_ratio']:>6.2f} "
                        f"{r['batch_share_of_alone']:>6.2f} {r['recomputed_tokens']:>11,}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--live-rps", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--target", type=float, default=2.0, help="live p99 target, x alone")
    ap.add_argument("--windows", type=int, nargs="*", default=[2, 6, 16, 48])
    ap.add_argument("--replay", action="store_true", help="the simulated server instead")
    ap.add_argument("--load", type=float, default=0.4, help="live load, x capacity (replay)")
    ap.add_argument("--sim-seconds", type=float, default=60.0)
    ap.add_argument("--sim-chunk", type=int, default=8192,
                    help="the simulated server's --max-num-batched-tokens (replay)")
    ap.add_argument("--sim-windows", type=int, nargs="*", default=[4, 16, 64, 256])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.replay:
        rep = replay(args)
        print(json.dumps(rep) if args.json else replay_table(rep))
        return 0
    with tempfile.TemporaryDirectory(prefix="colocate-bench-") as d:
        out = asyncio.run(drive(args, Path(d)))
    print(json.dumps(out) if args.json else table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
