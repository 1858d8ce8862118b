"""`fabricctl run` end to end against two real vLLM CPU servers: hit rate, and a killed server.

- `test_run_engine_vllm_hit_rate`: `run_job` (what `fabricctl run` does) with engine "vllm"
  launches its own two servers through the fleet, runs 4 shapes x 200 items of real text
  whose declared token counts are the tiny tokenizer's, and compares vLLM's own
  prefix-cache counters (deltas from both servers' /metrics) with the achievable maximum,
  computed for exactly the requests vLLM saw (items and pre-warms, recorded on the wire).
- `test_killed_server_mid_run_loses_nothing`: engine "openai" on the session's two servers;
  one server's process group is SIGKILLed once results come in; every item still gets
  exactly one result and the ledger balances. It leaves that server restarting, so the
  suite runs it last (see conftest).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_pair
from realtext import (
    Shape,
    Tok,
    achievable_hits,
    chain_hashes,
    make_shapes,
    nonce,
    scrape_counters,
)

from fabricctl.cli.run import run_job
from fabricctl.cli.run_summary import RunSummary
from fabricctl.config import AppConfig, ConsumerSettings, ProducerSettings, VllmSettings
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.supervisor.launch_spec import vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FABRICCTL_VLLM_VENV", ROOT / ".venv-vllm"))
BLOCK_SIZE = 32
MAX_TOKENS = 4
# what the e2e fleet passes to each server (besides the model and the served name)
FLEET_ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "16",
              "--enforce-eager", "--enable-prefix-caching", "--block-size", str(BLOCK_SIZE)]


def private_tail(prefix_tokens: int) -> bool:
    """The block holding the prefix's end has room for 6 tokens of an item's own code."""
    return prefix_tokens % BLOCK_SIZE <= BLOCK_SIZE - 6


class Workload:
    """Why: the test must know each prompt's shape and real length to judge vLLM's counters."""

    def __init__(self, tok: Tok, shapes: list[Shape]) -> None:
        self.tok = tok
        self.shapes = shapes
        self.info: dict[str, tuple[int, int, int]] = {}  # text -> (shape, prefix, L)
        self.lines: list[dict[str, Any]] = []
        for s in shapes:  # a pre-warm request sends exactly the prefix
            self.info[s.prefix] = (s.index, s.prefix_tokens, s.prefix_tokens)

    def add_items(self, per_shape: int, rng: random.Random, extra: range,
                  model: str = "tiny") -> None:
        private: set[int] = set()  # hashes of the blocks past each shape's full prefix blocks
        for s in self.shapes:
            for i, code in enumerate(rng.sample(range(1000, 10000), per_shape)):
                prompt = s.item_prompt(code, rng, rng.choice(extra))
                ids = s.check(self.tok, prompt)
                own = chain_hashes(ids, BLOCK_SIZE)[s.prefix_tokens // BLOCK_SIZE:]
                assert private.isdisjoint(own), "two items share a block past their prefix"
                private.update(own)
                self.info[s.prefix + prompt] = (s.index, s.prefix_tokens, len(ids))
                self.lines.append({"id": f"{s.label}-{i}", "model": model, "label": s.label,
                                   "prefix": s.components, "prompt": prompt,
                                   "max_tokens": MAX_TOKENS, "input_tokens": len(ids),
                                   "params": {"ignore_eos": True, "temperature": 0}})
        rng.shuffle(self.lines)  # shapes arrive interleaved, as from a real producer

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        return path

    @property
    def ids(self) -> set[str]:
        return {line["id"] for line in self.lines}


class ResultSink(io.BytesIO):
    """The job's output file; calls `on_line(n)` after each result line it receives."""

    def __init__(self, on_line: Any = None) -> None:
        super().__init__()
        self.lines = 0
        self.on_line = on_line

    def write(self, b: Any) -> int:
        n = super().write(b)
        self.lines += bytes(b).count(b"\n")
        if self.on_line is not None:
            self.on_line(self.lines)
        return n

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


def check_results(sink: ResultSink, wl: Workload, summary: RunSummary) -> list[dict[str, Any]]:
    """Every item exactly one successful result, and the broker's ledger balanced."""
    recs = sink.records()
    per_id = Counter(r["id"] for r in recs)
    assert set(per_id) == wl.ids and set(per_id.values()) == {1}, \
        f"{len(recs)} results for {len(wl.ids)} items"
    assert summary.items == len(wl.ids) and summary.rejected == 0
    assert Counter(r["finish_reason"] for r in recs) == {"length": len(recs)}
    assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in recs)
    assert summary.ledger_difference == (0, 0)
    return recs


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], int]]:
    """Every completions request that succeeded: (server, prompts, max_tokens), in order."""
    log: list[tuple[str, list[str], int]] = []
    orig = OpenAIEngine._post

    async def recorded(self: OpenAIEngine, path: str, body: dict[str, Any],
                       client: Any = None, file: bytes | None = None) -> Any:
        resp = await orig(self, path, body, client, file)
        if path == "/v1/completions" and resp.status_code == 200:
            prompt = body["prompt"]
            log.append((self.base_url, [prompt] if isinstance(prompt, str) else list(prompt),
                        body["max_tokens"]))
        return resp

    monkeypatch.setattr(OpenAIEngine, "_post", recorded)
    return log


def log_tails(logs: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(logs.glob("engine-*.log")))


async def test_run_engine_vllm_hit_rate(tiny_model: Path, tmp_path: Path,
                                        wire: list[tuple[str, list[str], int]],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if not (VENV / "bin" / "python").exists():
        pytest.skip("no vLLM venv")  # tiny_model already failed or skipped in that case
    tok = Tok(tiny_model)
    rng = random.Random(6)
    wl = Workload(tok, make_shapes(tok, 4, nonce(), rng, (6, 12, 18, 26), private_tail))
    wl.add_items(200, rng, extra=range(0, 6))
    data = tmp_path / "data"
    cpu = vllm_cpu_spec(VENV, str(tiny_model), "tiny", data / "logs")
    cfg = AppConfig(
        data_dir=data, engine="vllm", model=str(tiny_model), served_model_name="tiny",
        gpus=[0, 1],
        vllm=VllmSettings(command=list(cpu.command), model_flag=cpu.model_flag,
                          port_base=free_port_pair(), ready_timeout_s=240.0,
                          restart_backoff_s=[1.0], extra_args=FLEET_ARGS, env=dict(cpu.env)),
        consumer=ConsumerSettings(max_batch_size=16, max_batch_tokens=16 * 512,
                                  max_input_len=1000),
        producer=ProducerSettings(tokenizer=str(tiny_model / "tokenizer.json")),
    )
    # vLLM's own counters, from both servers, right after they start and right before they stop
    scrapes: dict[str, list[Any]] = {"start": [], "stop": []}
    started: list[float] = []
    orig_settle, orig_stop = Launcher.settle, Launcher.stop

    async def settle(self: Launcher) -> list[Any]:  # the fleet starts, then waits here
        t0 = time.monotonic()
        failed = await orig_settle(self)
        started.append(time.monotonic() - t0)
        scrapes["start"] = [await scrape_counters(s.base_url) for s in self.servers]
        return failed

    async def stop(self: Launcher) -> None:
        with contextlib.suppress(Exception):
            scrapes["stop"] = [await scrape_counters(s.base_url) for s in self.servers]
        await orig_stop(self)

    monkeypatch.setattr(Launcher, "settle", settle)
    monkeypatch.setattr(Launcher, "stop", stop)

    sink = ResultSink()
    t0 = time.monotonic()
    try:
        summary = await run_job(cfg, wl.write(tmp_path / "in.jsonl"), sink, keep_data=True)
    except Exception as e:
        pytest.fail(f"{e!r}\n{log_tails(data / 'logs')}", pytrace=False)
    wall = time.monotonic() - t0
    recs = check_results(sink, wl, summary)
    assert summary.engine == "vllm" and summary.gpus == 2 and not summary.simulated
    assert {r["gpu"] for r in recs} == {0, 1}  # both servers served

    before, after = scrapes["start"], scrapes["stop"]
    assert len(before) == len(after) == 2, "counters not scraped from both servers"
    assert {c.block_size for c in after} == {BLOCK_SIZE}
    queries = sum(a.queries - b.queries for a, b in zip(after, before, strict=True))
    hits = sum(a.hits - b.hits for a, b in zip(after, before, strict=True))

    # what vLLM saw: every prompt of every request that succeeded, per server, in order
    seen = [(url, *wl.info[p]) for url, prompts, _ in wire for p in prompts]
    assert sum(length for *_, length in seen) == queries, "declared tokens != vLLM's tokens"
    prewarms = sum(1 for url, shape, prefix, length in seen if prefix == length)
    achievable = achievable_hits(seen, BLOCK_SIZE)
    rate, best = hits / queries, achievable / queries
    print(f"\nvLLM e2e (engine vllm, 2 servers started in {started[0]:.1f} s): "
          f"{len(recs)} items, {len(wire)} requests ({prewarms} pre-warms) in {wall:.1f} s; "
          f"vLLM hit rate {rate:.4f} ({int(hits)}/{int(queries)} tokens), "
          f"achievable {best:.4f} ({achievable}); RunSummary kv_hit_rate "
          f"{summary.kv_hit_rate} vs kv_hit_achievable {summary.kv_hit_achievable}, "
          f"{summary.shape_switches} shape switches")
    assert hits <= achievable
    assert rate >= best - 0.02
    # the engines' own accounting (what RunSummary reports) is vLLM's
    assert abs(summary.kv_hit_rate - rate) < 1e-3


@pytest.mark.kills_session_server
async def test_killed_server_mid_run_loses_nothing(
        vllm_servers: Launcher, tiny_model: Path, tmp_path: Path,
        wire: list[tuple[str, list[str], int]], caplog: pytest.LogCaptureFixture) -> None:
    tok = Tok(tiny_model)
    rng = random.Random(7)
    wl = Workload(tok, make_shapes(tok, 4, nonce(), rng, (3, 5, 7, 9), private_tail))
    wl.add_items(100, rng, extra=range(0, 4))
    victim = vllm_servers.servers[0]
    kill: dict[str, Any] = {}

    def on_line(n: int) -> None:
        if n >= len(wl.lines) // 4 and not kill:
            pid = victim.pid
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)  # the API server, EngineCore and worker at once
            kill.update(pid=pid, at=n, t=time.monotonic())

    cfg = AppConfig(
        data_dir=tmp_path / "data", engine="openai", model="tiny",
        vllm=VllmSettings(endpoints=[s.base_url for s in vllm_servers.servers]),
        consumer=ConsumerSettings(max_batch_size=8, max_batch_tokens=8 * 256,
                                  max_input_len=400),
        producer=ProducerSettings(tokenizer=str(tiny_model / "tokenizer.json")),
    )
    sink = ResultSink(on_line)
    caplog.set_level(logging.WARNING, logger="fabricctl.consumer")
    t0 = time.monotonic()
    summary = await run_job(cfg, wl.write(tmp_path / "in.jsonl"), sink, keep_data=True)
    wall = time.monotonic() - t0
    assert kill, "the run ended before the kill"
    check_results(sink, wl, summary)
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    served = Counter(url for url, _, _ in wire)
    print(f"\nvLLM kill: {len(wl.lines)} items in {wall:.1f} s; server 0 SIGKILLed after "
          f"{kill['at']} results; {len(failed)} batches failed back to the broker; "
          f"requests per server {dict(served)}")
    assert failed, "no batch was failed back after the kill"
    assert served[vllm_servers.servers[1].base_url] > 0
